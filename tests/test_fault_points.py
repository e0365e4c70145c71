"""One real child process per fault point, killed with os._exit(86) exactly there.

Each test names the durable state that only its point can leave (or, where two points
leave the same durable state, the child's last words tell them apart), then checks that
recovery finishes every job with each effect durable exactly once.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from crashqueuelab.lab.campaign import run_case
from crashqueuelab.lab.faults import CRASH_EXIT_CODE, FaultPoint

# point -> (effect job [state, attempts] or None, flaky job, effects of the effect job, last event)
CRASH_STATES: dict[FaultPoint, tuple[list[object] | None, list[object] | None, int, str | None]] = {
    FaultPoint.BEFORE_SUBMIT_COMMIT: (None, None, 0, None),
    FaultPoint.AFTER_SUBMIT_COMMIT: (["QUEUED", 0], None, 0, "SUBMITTED"),
    FaultPoint.BEFORE_CLAIM_COMMIT: (["QUEUED", 0], ["QUEUED", 0], 0, "SUBMITTED"),
    FaultPoint.AFTER_CLAIM_COMMIT: (["LEASED", 1], ["QUEUED", 0], 0, "CLAIMED"),
    FaultPoint.AFTER_HEARTBEAT_COMMIT: (["LEASED", 1], ["QUEUED", 0], 0, "HEARTBEAT"),
    FaultPoint.BEFORE_EFFECT_COMMIT: (["LEASED", 1], ["QUEUED", 0], 0, "HEARTBEAT"),
    FaultPoint.AFTER_EFFECT_COMMIT: (["LEASED", 1], ["QUEUED", 0], 1, "HEARTBEAT"),
    FaultPoint.BEFORE_SUCCESS_COMMIT: (["LEASED", 1], ["QUEUED", 0], 1, "HEARTBEAT"),
    FaultPoint.AFTER_SUCCESS_COMMIT: (["SUCCEEDED", 1], ["QUEUED", 0], 1, "SUCCEEDED"),
    FaultPoint.BEFORE_FAILURE_COMMIT: (["SUCCEEDED", 1], ["LEASED", 1], 1, "CLAIMED"),
    FaultPoint.AFTER_FAILURE_COMMIT: (["SUCCEEDED", 1], ["RETRY_SCHEDULED", 1], 1, "FAILED"),
    FaultPoint.AFTER_PROMOTION_COMMIT: (["SUCCEEDED", 1], ["QUEUED", 1], 1, "PROMOTED"),
    FaultPoint.AFTER_RECOVERY_COMMIT: (
        ["SUCCEEDED", 1], ["RETRY_SCHEDULED", 2], 1, "LEASE_EXPIRED"
    ),
}  # fmt: skip


def test_every_fault_point_has_a_case() -> None:
    assert set(CRASH_STATES) == set(FaultPoint)
    assert len(FaultPoint) == 13


@pytest.mark.parametrize("point", list(FaultPoint))
def test_a_child_killed_at_the_point_leaves_its_state_and_recovers(
    tmp_path: Path, point: FaultPoint
) -> None:
    report = run_case(tmp_path, 0, point, seed=11)
    assert report["exit_code"] == CRASH_EXIT_CODE
    assert report["last_words"] == point.value
    assert report["timed_out"] is False
    effect_job, flaky_job, effects, last_event = CRASH_STATES[point]
    signature = report["crash_state"]["signature"]
    assert signature == {
        "effect_job": effect_job,
        "flaky_job": flaky_job,
        "effect_job_effects": effects,
        "last_event": last_event,
    }
    assert report["crash_replay"]["ok"] is True
    assert report["crash_invariants"]["ok"] is True
    assert report["recovered_terminal_state"] == {"effect": "SUCCEEDED", "flaky": "SUCCEEDED"}
    ledger = report["recovery"]["ledger"]
    assert set(ledger["effects_by_key"].values()) == {1}
    # An effect committed before an unacknowledged crash is repeated on recovery, and the
    # idempotent destination absorbs the repetition.
    repeated = point in (FaultPoint.AFTER_EFFECT_COMMIT, FaultPoint.BEFORE_SUCCESS_COMMIT)
    assert ledger["absorbed"] == int(repeated)
    assert report["recovery_ok"] is True
    assert report["passed"] is True
    case_dir = tmp_path / report["artifacts"]["case_directory"]
    for name in ("queue.sqlite", "effects.sqlite", "history.json", "case.json"):
        assert (case_dir / name).is_file()
    assert (case_dir / "crash-time" / "queue.sqlite").is_file()
    assert (case_dir / "crash-time" / "effects.sqlite").is_file()
