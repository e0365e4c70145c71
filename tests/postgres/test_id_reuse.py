"""The campaign's id-reused crash points on the PostgreSQL system: the server crashes as a
transition's COMMIT is on its way, starts again and gives the transaction's id to another
session, which commits, before the queue asks. The queue compares the server's start time
and tries again; a queue that trusts ``pg_xact_status`` across the restart takes the other
commit for its own, and is caught at every one of them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from crashqueuelab import cli
from crashqueuelab.core.errors import ServerUnavailable
from crashqueuelab.lab.campaign.run import CRASHABLE_SETTINGS
from crashqueuelab.lab.faults import idreuse
from crashqueuelab.servers.postgres import CRASHABLE_VARIABLE, DSN_VARIABLE, ThrowawayServer
from crashqueuelab.systems import resolve_system
from crashqueuelab.systems.crashpoints import (
    ID_REUSED_SUFFIX,
    id_reused_phases,
    id_reused_point,
)
from tests.conftest import RunCli


def test_each_asked_transition_has_an_id_reused_point_with_its_after_points_state() -> None:
    points = {point.name: point for point in resolve_system("postgres").crash_points}
    reused = sorted(name for name in points if name.endswith(ID_REUSED_SUFFIX))
    # Not the submission: its BEFORE phase comes before the queue names its transaction.
    transitions = ("CLAIM", "FAILURE", "HEARTBEAT", "PROMOTION", "RECOVERY", "SUCCESS")
    assert reused == [f"{transition}_COMMIT_ID_REUSED" for transition in transitions]
    for name in reused:
        phases = id_reused_phases(name)
        assert phases is not None
        assert points[name].expected == points[phases[1]].expected
    assert id_reused_point("AFTER_CLAIM_COMMIT") == "CLAIM_COMMIT_ID_REUSED"
    assert id_reused_phases("CLAIM_COMMIT_OPEN") is None


def test_an_id_reused_point_needs_its_name_and_a_server_it_may_crash(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ValueError, match="not an id-reused"):  # noqa: SIM117
        with idreuse.id_reused_at("CLAIM_COMMIT_OPEN", None):
            pass
    monkeypatch.setenv(DSN_VARIABLE, "host=/nonexistent port=5432 dbname=x")
    monkeypatch.delenv(CRASHABLE_VARIABLE, raising=False)
    with pytest.raises(RuntimeError, match="may crash"):  # noqa: SIM117
        with idreuse.id_reused_at("CLAIM_COMMIT_ID_REUSED", None):
            pass


@pytest.mark.parametrize(
    ("saw", "words"),
    [
        ({"reused": True}, "CLAIM_COMMIT_ID_REUSED"),
        (
            {"reused": False},
            "CLAIM_COMMIT_ID_REUSED: the restarted server did not hand the id out again"
            " ({'reused': False})",
        ),
    ],
)
def test_the_child_dies_as_the_point_only_when_the_id_was_handed_out_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, saw: dict[str, bool], words: str
) -> None:
    said: list[str] = []
    monkeypatch.setattr(idreuse, "die_with_last_words", lambda text, _: said.append(text))
    monkeypatch.setattr(idreuse, "crash_and_hand_out", lambda dsn, root, name: dict(saw))
    monkeypatch.setenv(DSN_VARIABLE, "host=/nonexistent port=5432 dbname=x")
    monkeypatch.setenv(CRASHABLE_VARIABLE, str(tmp_path))
    last_words = tmp_path / "crash-point.json"
    with idreuse.id_reused_at("CLAIM_COMMIT_ID_REUSED", str(last_words)) as hook:
        hook("AFTER_CLAIM_COMMIT")  # nothing crashed yet: nothing
        assert said == []
        hook("BEFORE_CLAIM_COMMIT")
        hook("AFTER_CLAIM_COMMIT")
    assert said == [words]
    assert json.loads((tmp_path / idreuse.EVIDENCE_FILE).read_text()) == saw


def test_a_child_without_last_words_still_dies_at_the_point(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    said: list[str] = []
    monkeypatch.setattr(idreuse, "die_with_last_words", lambda text, _: said.append(text))
    monkeypatch.setattr(idreuse, "crash_and_hand_out", lambda *arguments: {"reused": True})
    monkeypatch.setenv(DSN_VARIABLE, "host=/nonexistent port=5432 dbname=x")
    monkeypatch.setenv(CRASHABLE_VARIABLE, str(tmp_path))
    with idreuse.id_reused_at("CLAIM_COMMIT_ID_REUSED", None) as hook:
        hook("BEFORE_CLAIM_COMMIT")
        hook("AFTER_CLAIM_COMMIT")
    assert said == ["CLAIM_COMMIT_ID_REUSED"]
    assert not (tmp_path / idreuse.EVIDENCE_FILE).exists()


@pytest.fixture
def crashable() -> Iterator[ThrowawayServer]:
    try:
        server = ThrowawayServer(settings=CRASHABLE_SETTINGS)
    except ServerUnavailable as error:
        pytest.skip(f"no PostgreSQL server can run here: {error.reason}")
    with server:
        server.start()
        yield server


def test_the_restarted_server_gives_an_unflushed_transactions_id_to_another_session(
    crashable: ThrowawayServer,
) -> None:
    name = "crashqueuelab:reused"
    dsn = crashable.dsn
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (x int)")
    conn = psycopg.connect(dsn, autocommit=True, application_name=name)
    try:
        conn.execute("BEGIN")
        conn.execute("INSERT INTO t VALUES (1)")
        row = conn.execute("SELECT pg_current_xact_id()::text").fetchone()
        assert row is not None
        seen: dict[str, Any] = idreuse.crash_and_hand_out(dsn, crashable.root, name)
        with pytest.raises(psycopg.OperationalError):
            conn.execute("COMMIT")
    finally:
        conn.close()
    assert seen["queue_xid"] == int(row[0])
    assert seen["reused"]
    with psycopg.connect(dsn, autocommit=True) as other:
        status = other.execute("SELECT pg_xact_status(%s::xid8)", (row[0],)).fetchone()
        assert status == ("committed",)
        # The other transaction's commit, not the insert's.
        assert other.execute("SELECT count(*) FROM t").fetchone() == (0,)
    # With no open transaction of that client, there is nothing to crash under.
    assert "no open transaction" in idreuse.crash_and_hand_out(dsn, crashable.root, name)["error"]


@pytest.mark.slow
def test_an_id_reused_point_passes_and_a_queue_that_trusts_restarts_fails_it(
    tmp_path: Path, run_cli: RunCli
) -> None:
    point = ["--crash-point", "CLAIM_COMMIT_ID_REUSED"]
    outcome = run_cli(
        "campaign", "--system", "postgres", "--seed", "3", "--shrink-seconds", "0", "--quiet",
        *point, "--output-directory", str(tmp_path / "ok"),
    )  # fmt: skip
    assert outcome.code == cli.EXIT_OK, outcome.result["anomalies"]
    [case] = json.loads((tmp_path / "ok" / "campaign.json").read_text())["cases"]
    directory = tmp_path / "ok" / case["artifacts"]["case_directory"]
    assert json.loads((directory / idreuse.EVIDENCE_FILE).read_text())["reused"]
    mutant = "crashqueuelab.lab.mutants.pgcommit:trusts_restarts_system"
    outcome = run_cli(
        "campaign", "--system", mutant, "--seed", "3", "--shrink-seconds", "0", "--quiet",
        *point, "--output-directory", str(tmp_path / "mutant"),
    )  # fmt: skip
    assert outcome.code == cli.EXIT_REJECTED
    [case] = json.loads((tmp_path / "mutant" / "campaign.json").read_text())["cases"]
    # It took the other transaction's commit for its claim: the store has no claim.
    assert case["died_at_fault_point"]
    assert case["crash_state"]["signature"]["effect_job"] == ["QUEUED", 0]


def test_the_pytest_plugin_skips_them_under_power_loss_and_runs_them_otherwise() -> None:
    from crashqueuelab.suite.checks import lab_checks

    system = resolve_system("postgres")
    for mode, expected in (("power-loss", 13), ("process", 0)):
        skipped = [
            check.parts[1]
            for check in lab_checks("postgres", system, seed=7, crash_mode=mode)
            if check.parts[0] == "crash-point" and check.skip is not None
        ]
        assert len(skipped) == expected
        assert all(name.endswith(("_COMMIT_OPEN", ID_REUSED_SUFFIX)) for name in skipped)
