"""One real child process per crash point of every shipped system, killed with os._exit(86).

Each system declares, in its adapter, the durable state that a death at each of its points
must leave; here a real child dies there, the independent reader must find exactly that
state, and recovery must finish every job with each effect durable exactly once.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from crashqueuelab.lab.campaign.run import run_case
from crashqueuelab.lab.faults.hooks import CRASH_EXIT_CODE
from crashqueuelab.systems import CrashPoint, System, resolve_system

SYSTEMS = {name: resolve_system(name) for name in ("sqlite", "walqueue")}
CASES = [(name, point) for name, system in SYSTEMS.items() for point in system.crash_points]
#: Where the effect was durable but the acknowledgement was not, recovery repeats it.
REPEATED = {"AFTER_EFFECT_COMMIT", "BEFORE_SUCCESS_COMMIT"}


def test_each_system_names_its_points_once() -> None:
    assert len(SYSTEMS["sqlite"].crash_points) == 13
    assert len(SYSTEMS["walqueue"].crash_points) == 24
    for system in SYSTEMS.values():
        names = [point.name for point in system.crash_points]
        assert len(names) == len(set(names))
        assert {"BEFORE_EFFECT_COMMIT", "AFTER_EFFECT_COMMIT"} <= set(names)


@pytest.mark.parametrize(("name", "point"), CASES, ids=[f"{n}-{p.name}" for n, p in CASES])
def test_a_child_killed_at_the_point_leaves_its_state_and_recovers(
    tmp_path: Path, name: str, point: CrashPoint
) -> None:
    system: System = SYSTEMS[name]
    report = run_case(tmp_path, 0, point, seed=11, system=system, spec=name)
    assert report["exit_code"] == CRASH_EXIT_CODE
    assert report["last_words"] == point.name
    assert report["timed_out"] is False
    assert report["crash_state"]["signature"] == point.expected.signature()
    assert report["crash_judgement"]["ok"] is True
    assert report["crash_judgement"]["problems"] == []
    assert set(report["crash_judgement"]["checks"].values()) <= {True}
    final = report["recovered_terminal_state"]
    assert final is not None
    assert set(final) == {"effect", "flaky"}
    assert report["recovery"]["store"]["ok"] is True
    assert {job["status"] for job in report["recovery"]["store"]["jobs"].values()} == {"succeeded"}
    ledger = report["recovery"]["ledger"]
    assert set(ledger["effects_by_key"].values()) == {1}
    # An effect committed before an unacknowledged crash is repeated on recovery, and the
    # idempotent destination absorbs the repetition.
    assert ledger["absorbed"] == int(point.name in REPEATED)
    assert report["recovery"]["anomalies"] == []
    assert report["recovery_ok"] is True
    assert report["passed"] is True
    case_dir = tmp_path / report["artifacts"]["case_directory"]
    for artifact in ("store", "effects.sqlite", "history.json", "case.json"):
        assert (case_dir / artifact).exists()
    assert (case_dir / "crash-time" / "store").is_dir()
    if point.after is not None:
        assert report["after_crash_at"]["exit_code"] == CRASH_EXIT_CODE
        assert report["after_crash_at"]["last_words"] == point.after
