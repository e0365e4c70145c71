"""The campaign's open-commit crash points on the PostgreSQL system: each transition's COMMIT
is still waiting for a synchronous standby the crash child holds when its connection is
reset; the queue is told "in progress" and must wait for the outcome. A queue that takes
"in progress" for "no" passes the reply-lost points and is caught at these."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import psycopg
import pytest

from crashqueuelab import cli
from crashqueuelab.core.errors import InvalidInput, ServerUnavailable
from crashqueuelab.lab.campaign import run
from crashqueuelab.lab.campaign.run import HELD_OPEN, ID_REUSED, own_server, own_servers_last
from crashqueuelab.lab.faults import opencommits
from crashqueuelab.lab.runs.modes import POWER_LOSS, PROCESS
from crashqueuelab.servers import syncpair
from crashqueuelab.servers.postgres import DSN_VARIABLE
from crashqueuelab.servers.syncpair import STANDBY_VARIABLE, SynchronousPair
from crashqueuelab.systems import resolve_system
from crashqueuelab.systems.crashpoints import (
    OPEN_COMMIT_SUFFIX,
    REPLY_LOST_SUFFIX,
    open_commit_phases,
    open_commit_point,
)
from tests.conftest import RunCli

TRANSITIONS = ("CLAIM", "FAILURE", "HEARTBEAT", "PROMOTION", "RECOVERY", "SUBMIT", "SUCCESS")


def test_each_queue_transition_has_an_open_commit_point_with_its_after_points_state() -> None:
    points = {point.name: point for point in resolve_system("postgres").crash_points}
    held = sorted(name for name in points if name.endswith(OPEN_COMMIT_SUFFIX))
    assert held == [f"{transition}_COMMIT_OPEN" for transition in TRANSITIONS]
    for name in held:
        phases = open_commit_phases(name)
        assert phases is not None
        assert points[name].expected == points[phases[1]].expected
    assert open_commit_point("AFTER_CLAIM_COMMIT") == "CLAIM_COMMIT_OPEN"
    assert open_commit_phases("CLAIM_COMMIT_REPLY_LOST") is None
    assert not any(
        p.name.endswith(OPEN_COMMIT_SUFFIX) for p in resolve_system("sqlite").crash_points
    )


def test_points_with_a_server_of_their_own_run_last_and_not_under_power_loss() -> None:
    points = list(resolve_system("postgres").crash_points)
    families = [own_server(point) for point in own_servers_last(points, PROCESS)]
    assert families == [None] * 20 + [HELD_OPEN] * 7 + [ID_REUSED] * 6
    ordered = own_servers_last(points, PROCESS)
    assert ordered[:20] == [p for p in points if own_server(p) is None]
    assert own_servers_last(points, POWER_LOSS) == ordered[:20]


class _Refused:
    """A server whose start fails, and which says it was closed."""

    closed: ClassVar[list[str]] = []

    def start(self) -> None:
        raise ServerUnavailable("no start here", "postgres")

    def close(self) -> None:
        self.closed.append(type(self).__name__)


def test_a_server_of_their_own_that_cannot_start_fails_the_run_and_is_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(run, "SynchronousPair", _Refused)
    monkeypatch.setattr(run, "_crashable_server", _Refused)
    _Refused.closed.clear()
    points = list(resolve_system("postgres").crash_points)
    with run.OwnServers(points) as servers, pytest.raises(ServerUnavailable, match="no start"):
        servers.ready()
    assert _Refused.closed == ["_Refused", "_Refused"]
    with run.OwnServers(points[:1]) as none:
        none.ready()
        assert (none.pair, none.crashable) == (None, None)


def test_a_power_loss_campaign_refuses_a_point_on_a_server_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Whether this machine can cut the power is beside the point here.
    monkeypatch.setattr(run, "check_crash_mode", lambda mode, system: None)
    with pytest.raises(InvalidInput, match="process crash mode only"):
        run.run_campaign(
            tmp_path / "c",
            seed=3,
            system="postgres",
            crash_mode=POWER_LOSS,
            crash_points=["CLAIM_COMMIT_OPEN", "AFTER_CLAIM_COMMIT"],
        )
    assert not (tmp_path / "c").exists()


def test_an_open_commit_point_needs_its_name_and_a_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="not an open-commit"):  # noqa: SIM117
        with opencommits.commits_held_open_at("CLAIM_COMMIT_REPLY_LOST", None):
            pass
    monkeypatch.setenv(DSN_VARIABLE, "host=/nonexistent port=5432 dbname=x")
    monkeypatch.delenv(STANDBY_VARIABLE, raising=False)
    with pytest.raises(RuntimeError, match="synchronous standby"):  # noqa: SIM117
        with opencommits.commits_held_open_at("CLAIM_COMMIT_OPEN", None):
            pass


@pytest.mark.parametrize(
    ("saw", "words"),
    [
        ({}, "CLAIM_COMMIT_OPEN: the connection was not reset while the COMMIT waited"),
        (
            {"reset_while_waiting": True},
            "CLAIM_COMMIT_OPEN: the COMMIT was not seen open while the client asked",
        ),
        ({"reset_while_waiting": True, "asked_while_open": True}, "CLAIM_COMMIT_OPEN"),
    ],
)
def test_the_child_dies_as_the_point_only_when_the_commit_was_seen_open(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, saw: dict[str, bool], words: str
) -> None:
    said: list[str] = []
    released: list[int] = []
    monkeypatch.setattr(opencommits, "die_with_last_words", lambda text, _: said.append(text))
    monkeypatch.setattr(opencommits, "hold_standby", lambda dsn: 4242)
    monkeypatch.setattr(opencommits, "release_standby", released.append)

    def watch(dsn: str, name: str, receiver: int, reset: Any, seen: dict[str, Any]) -> None:
        reset()
        seen.update(saw)

    monkeypatch.setattr(opencommits, "watch", watch)
    monkeypatch.setenv(DSN_VARIABLE, "host=/nonexistent port=5432 dbname=x")
    monkeypatch.setenv(STANDBY_VARIABLE, f"host={tmp_path} port=5432 dbname=x")
    last_words = tmp_path / "crash-point.json"
    with opencommits.commits_held_open_at("CLAIM_COMMIT_OPEN", str(last_words)) as hook:
        hook("AFTER_CLAIM_COMMIT")  # nothing held yet: nothing
        assert said == []
        hook("BEFORE_CLAIM_COMMIT")
        hook("AFTER_CLAIM_COMMIT")
    assert said == [words]
    assert json.loads((tmp_path / opencommits.EVIDENCE_FILE).read_text()) == saw
    # Released again as the block ends: a child that never reached the point holds nothing.
    assert released == [4242]
    assert (tmp_path / syncpair.HOLD_LOCK).exists()


def test_a_child_without_last_words_still_dies_at_the_point(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    said: list[str] = []
    monkeypatch.setattr(opencommits, "die_with_last_words", lambda text, _: said.append(text))
    monkeypatch.setattr(opencommits, "hold_standby", lambda dsn: 4242)
    monkeypatch.setattr(opencommits, "release_standby", lambda pid: None)
    monkeypatch.setattr(opencommits, "watch", lambda *arguments: None)
    monkeypatch.setenv(DSN_VARIABLE, "host=/nonexistent port=5432 dbname=x")
    monkeypatch.setenv(STANDBY_VARIABLE, f"host={tmp_path} port=5432 dbname=x")
    with opencommits.commits_held_open_at("CLAIM_COMMIT_OPEN", None) as hook:
        hook("BEFORE_CLAIM_COMMIT")
        hook("AFTER_CLAIM_COMMIT")
    assert said == ["CLAIM_COMMIT_OPEN: the connection was not reset while the COMMIT waited"]
    assert not (tmp_path / opencommits.EVIDENCE_FILE).exists()


@pytest.fixture(scope="module")
def pair() -> Iterator[SynchronousPair]:
    try:
        made = SynchronousPair()
    except ServerUnavailable as error:
        pytest.skip(f"no PostgreSQL server can run here: {error.reason}")
    with made:
        yield made


def _waiting_commit(dsn: str, name: str, done: list[str]) -> None:
    with psycopg.connect(dsn, autocommit=True, application_name=name) as conn:
        with conn.transaction():
            # A commit that writes WAL waits for the synchronous standby.
            conn.execute("SELECT pg_logical_emit_message(true, 'test', 'x')")
        done.append("committed")


def test_the_watcher_resets_the_waiting_client_and_lets_go_once_it_asked(
    pair: SynchronousPair,
) -> None:
    assert pair.primary is not None
    assert pair.standby is not None
    primary, standby = pair.primary.dsn, pair.standby.dsn
    name = "crashqueuelab:watched"
    done: list[str] = []
    receiver = syncpair.hold_standby(standby)
    committing = threading.Thread(target=_waiting_commit, args=(primary, name, done))
    asking: list[psycopg.Connection[Any]] = []

    def reset() -> None:
        # The client's question on a new session, as the queue asks after a lost answer.
        conn = psycopg.connect(primary, autocommit=True, application_name=name)
        asking.append(conn)
        conn.execute("SELECT pg_xact_status(pg_current_xact_id())")

    seen: dict[str, Any] = {}
    try:
        committing.start()
        opencommits.watch(primary, name, receiver, reset, seen)
        committing.join(30)
    finally:
        syncpair.release_standby(receiver)
        for conn in asking:
            conn.close()
    assert seen["reset_while_waiting"]
    assert seen["asked_while_open"]
    assert done == ["committed"]
    assert seen["readings"] >= 2


def test_the_watcher_lets_go_at_its_limit_and_says_why_it_could_not_watch(
    pair: SynchronousPair, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert pair.primary is not None
    assert pair.standby is not None
    receiver = syncpair.hold_standby(pair.standby.dsn)
    monkeypatch.setattr(opencommits, "HOLD_LIMIT_S", 0.0)
    seen: dict[str, Any] = {}
    opencommits.watch(pair.primary.dsn, "nobody", receiver, lambda: None, seen)
    assert seen["readings"] == 0
    assert "asked_while_open" not in seen
    refused: dict[str, Any] = {}
    opencommits.watch("host=/nonexistent port=1 dbname=x", "nobody", receiver, print, refused)
    assert refused["error"].startswith("OperationalError")
    # Released by both: the pair goes on committing.
    with psycopg.connect(pair.primary.dsn, autocommit=True) as conn, conn.transaction():
        conn.execute("SELECT pg_logical_emit_message(true, 'test', 'x')")
    pair.release()  # nobody holds it: nothing to do
    syncpair.release_standby(2**22 + 1)  # no such process: nothing to release


def test_a_standby_without_a_receiver_cannot_be_held(
    pair: SynchronousPair, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert pair.standby is not None
    monkeypatch.setattr(syncpair, "wal_receiver", lambda dsn: None)
    with pytest.raises(ServerUnavailable, match="no WAL receiver"):
        syncpair.hold_standby(pair.standby.dsn)
    pair.release()


def test_a_pair_whose_standby_never_streams_is_stopped_and_said(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(syncpair, "STREAMING_TIMEOUT_S", 0.0)
    monkeypatch.setattr(SynchronousPair, "_streaming", lambda self: False)
    made = SynchronousPair()
    with pytest.raises(ServerUnavailable, match="did not stream"):
        made.start()
    assert made.primary is None
    assert made.standby is None
    made.close()  # again: nothing left to stop


@pytest.mark.slow
def test_the_open_commit_points_pass_and_a_queue_that_takes_in_progress_for_no_fails_them(
    tmp_path: Path, run_cli: RunCli
) -> None:
    points = ["--crash-point", "CLAIM_COMMIT_OPEN", "--crash-point", "SUCCESS_COMMIT_OPEN"]
    outcome = run_cli(
        "campaign", "--system", "postgres", "--seed", "3", "--shrink-seconds", "0", "--quiet",
        *points, "--output-directory", str(tmp_path / "ok"),
    )  # fmt: skip
    assert outcome.code == cli.EXIT_OK, outcome.result["anomalies"]
    report = json.loads((tmp_path / "ok" / "campaign.json").read_text())
    assert len(report["cases"]) == 2
    for case in report["cases"]:
        evidence = tmp_path / "ok" / case["artifacts"]["case_directory"]
        seen = json.loads((evidence / opencommits.EVIDENCE_FILE).read_text())
        assert seen["reset_while_waiting"]
        assert seen["asked_while_open"]
    mutant = "crashqueuelab.lab.mutants.pgcommit:in_progress_as_no_system"
    outcome = run_cli(
        "campaign", "--system", mutant, "--seed", "3", "--shrink-seconds", "0", "--quiet",
        *points, "--crash-point", "CLAIM_COMMIT_REPLY_LOST",
        "--output-directory", str(tmp_path / "mutant"),
    )  # fmt: skip
    assert outcome.code == cli.EXIT_REJECTED
    report = json.loads((tmp_path / "mutant" / "campaign.json").read_text())
    passed = {case["fault_point"]: case["passed"] for case in report["cases"]}
    assert passed == {
        "CLAIM_COMMIT_OPEN": False,
        "SUCCESS_COMMIT_OPEN": False,
        f"CLAIM{REPLY_LOST_SUFFIX}": True,
    }
