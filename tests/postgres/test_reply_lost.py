"""The campaign's reply-lost crash points on the PostgreSQL system: each transition's
COMMIT reaches the server and its answer is lost in a fault proxy the crash child starts;
the queue must ask the server before it answers. A queue that never asks is caught there,
and at none of the other points."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from crashqueuelab import cli
from crashqueuelab.lab.campaign.run import own_server
from crashqueuelab.lab.faults import lostreplies
from crashqueuelab.lab.runs.servers import SERVER_VARIABLES
from crashqueuelab.systems import resolve_system
from crashqueuelab.systems.crashpoints import (
    REPLY_LOST_SUFFIX,
    reply_lost_phases,
    reply_lost_point,
)
from tests.conftest import RunCli


def test_each_queue_transition_has_a_reply_lost_point_with_its_after_points_state() -> None:
    points = {point.name: point for point in resolve_system("postgres").crash_points}
    lost = sorted(name for name in points if name.endswith(REPLY_LOST_SUFFIX))
    assert lost == [
        "CLAIM_COMMIT_REPLY_LOST",
        "FAILURE_COMMIT_REPLY_LOST",
        "HEARTBEAT_COMMIT_REPLY_LOST",
        "PROMOTION_COMMIT_REPLY_LOST",
        "RECOVERY_COMMIT_REPLY_LOST",
        "SUBMIT_COMMIT_REPLY_LOST",
        "SUCCESS_COMMIT_REPLY_LOST",
    ]
    for name in lost:
        phases = reply_lost_phases(name)
        assert phases is not None
        assert points[name].expected == points[phases[1]].expected
    assert reply_lost_point("AFTER_CLAIM_COMMIT") == "CLAIM_COMMIT_REPLY_LOST"
    assert reply_lost_phases("AFTER_CLAIM_COMMIT") is None
    # The SQLite queue has no connection to lose an answer on.
    assert not any(
        p.name.endswith(REPLY_LOST_SUFFIX) for p in resolve_system("sqlite").crash_points
    )


@pytest.mark.slow
def test_a_queue_that_never_asks_is_caught_only_where_a_commit_answer_was_lost(
    postgres_dsn: str, tmp_path: Path, run_cli: RunCli
) -> None:
    # The open-commit and id-reused points need a server of their own
    # (tests/postgres/test_open_commit.py, test_id_reuse.py).
    points = [
        argument
        for point in resolve_system("postgres").crash_points
        if own_server(point) is None
        for argument in ("--crash-point", point.name)
    ]
    outcome = run_cli(
        "campaign", "--system", "crashqueuelab.lab.mutants.pgcommit:never_asks_system",
        "--dsn", postgres_dsn, "--seed", "7", "--shrink-seconds", "0", "--quiet", *points,
        "--output-directory", str(tmp_path / "c"),
    )  # fmt: skip
    assert outcome.code == cli.EXIT_REJECTED
    report = json.loads((tmp_path / "c" / "campaign.json").read_text())
    failed = {case["fault_point"] for case in report["cases"] if not case["passed"]}
    assert failed
    assert all(point.endswith(REPLY_LOST_SUFFIX) for point in failed)
    # The retried acknowledgement found its own commit and was told stale: the worker went
    # on as if refused, so the child died at a later acknowledgement, past the point's state.
    assert "SUCCESS_COMMIT_REPLY_LOST" in failed
    success = next(c for c in report["cases"] if c["fault_point"] == "SUCCESS_COMMIT_REPLY_LOST")
    assert not success["crash_state_matches_point"]
    assert success["crash_state"]["signature"]["effect_job"] == ["SUCCEEDED", 1]


def test_a_death_after_no_lost_answer_is_not_the_points(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    said: list[str] = []
    monkeypatch.setattr(lostreplies, "die_with_last_words", lambda words, _: said.append(words))
    monkeypatch.setenv(SERVER_VARIABLES[0], "host=/nonexistent port=5432 dbname=x")
    with lostreplies.replies_lost_at("SUCCESS_COMMIT_REPLY_LOST", None) as hook:
        assert "127.0.0.1" in os.environ[SERVER_VARIABLES[0]]
        hook("AFTER_SUCCESS_COMMIT")  # not armed yet: nothing
        assert said == []
        hook("BEFORE_SUCCESS_COMMIT")
        hook("AFTER_SUCCESS_COMMIT")  # no connection, so no answer was dropped
    assert said == ["SUCCESS_COMMIT_REPLY_LOST: no answer was lost"]
    assert os.environ[SERVER_VARIABLES[0]] == "host=/nonexistent port=5432 dbname=x"


def test_a_reply_lost_point_needs_its_name_and_the_runs_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ValueError, match="not a reply-lost"):  # noqa: SIM117
        with lostreplies.replies_lost_at("AFTER_SUCCESS_COMMIT", None):
            pass
    monkeypatch.delenv(SERVER_VARIABLES[0], raising=False)
    with pytest.raises(RuntimeError, match="needs the run's server"):  # noqa: SIM117
        with lostreplies.replies_lost_at("SUCCESS_COMMIT_REPLY_LOST", None):
            pass
