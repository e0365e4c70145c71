"""Failover runs on real servers: a PostgreSQL primary and its streaming standby the run
starts, the replication link partitioned through the fault proxy, the primary killed and
the standby promoted under load. Each level's promise held against what the queue told."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from crashqueuelab.core.errors import InvalidInput
from crashqueuelab.lab.failover.cluster import ReplicatedPostgres, choose_standby
from crashqueuelab.lab.failover.run import run_failover
from crashqueuelab.lab.failover.targets import postgres_target, rq_target
from crashqueuelab.postgres.queue import PostgresQueue
from crashqueuelab.servers.postgres import find_binaries
from tests.conftest import RunCli
from tests.lab.failover.losses import lost_is_the_tail_from_the_cut

pytestmark = pytest.mark.skipif(find_binaries() is None, reason="no PostgreSQL binaries")


def test_asynchronous_commits_the_standby_never_received_are_lost_as_documented(
    run_cli: RunCli, tmp_path: Path
) -> None:
    out = tmp_path / "local"
    run = run_cli(
        "failover", "--synchronous-commit", "local", "--failovers", "1", "--jobs", "120",
        "--quiet", "--output-directory", out,
    )  # fmt: skip
    # Not ok by the lab's contract (acknowledged work lost), and no promise broken.
    assert run.code == 1, run.result
    assert not run.result["ok"]
    assert run.result["keeps_its_promises"]
    assert not run.result["contract_held"]
    assert run.result["headline"].startswith("as documented: postgres at synchronous_commit=local")
    record = json.loads((out / "failover.json").read_text())
    acknowledged_at = lost_is_the_tail_from_the_cut(out, record)
    assert record["failovers"][0]["before"]["lag_bytes"] > 0
    assert (
        record["findings"]["documented"]
        == sum(
            record["findings"]["counts"][kind]
            for kind in ("lost_enqueues", "resurrected_completions", "leases_came_back")
        )
        + record["findings"]["counts"]["duplicate_effects"]
    )
    assert record["final_store"]["ok"]
    # Every figure comes from the files kept beside the record.
    assert len(acknowledged_at) == record["findings"]["enqueues_acknowledged"] == 120
    assert (out / "failover-1" / "promoted-standby" / "judged-rows.json").is_file()
    page = (out / "report.html").read_text()
    assert "lets a failover lose what the promoted standby had not received" in page
    assert "runtime-config-wal.html#GUC-SYNCHRONOUS-COMMIT" in page


def test_a_restart_while_commits_wait_shows_jobs_the_promoted_standby_never_had(
    tmp_path: Path,
) -> None:
    record = run_failover(
        tmp_path / "on", target=postgres_target("on"), failovers=1, jobs=120,
        restart_while_waiting=True,
    )  # fmt: skip
    findings = record["findings"]
    # PostgreSQL's documented case: the restarted primary marked the waiting commits
    # committed; the standby never received them, and the failover took them away.
    assert findings["counts"]["visible_then_lost"] >= 1
    assert record["failovers"][0]["waiting_before_the_restart"] >= 1
    # The queue acknowledged none of them: every acknowledged job survived.
    assert findings["contract_held"], findings["counts"]
    assert record["ok"]
    assert record["final_store"]["ok"]


class _AsynchronousInDisguise(ReplicatedPostgres):
    """A planted misconfiguration: the run says synchronous_commit=on, but the primary names
    no synchronous standby, so its commits wait for none."""

    def __init__(self, level: str, **options: Any) -> None:
        super().__init__(level, **options)
        self._settings["synchronous_standby_names"] = "''"


def test_a_level_that_promises_no_loss_and_loses_is_a_broken_promise(tmp_path: Path) -> None:
    record = run_failover(
        tmp_path / "planted",
        target=postgres_target("on", cluster_factory=_AsynchronousInDisguise),
        failovers=1,
        jobs=100,
    )
    assert record["judged"]
    assert not record["ok"]
    assert not record["keeps_its_promises"]
    # Caught, and nothing of it excused: how many were lost depends on how fast a loaded
    # host's producer went through the cut.
    assert record["findings"]["broken_promises"] >= 1
    assert record["findings"]["documented"] == 0
    assert record["headline"].startswith("broken promise:")


def test_a_restart_while_waiting_at_a_level_that_never_waits_is_refused_before_anything_runs(
    run_cli: RunCli, tmp_path: Path
) -> None:
    out = tmp_path / "refused"
    run = run_cli(
        "failover", "--synchronous-commit", "off", "--restart-while-waiting",
        "--output-directory", out,
    )  # fmt: skip
    assert run.code == 2
    assert run.result["error"]["field"] == "restart_while_waiting"
    assert not out.exists()
    with pytest.raises(InvalidInput, match="failovers"):
        run_failover(out, target=postgres_target("on"), failovers=0)
    with pytest.raises(InvalidInput, match="synchronous_commit"):
        run_failover(out, target=postgres_target("sometimes"))
    with pytest.raises(InvalidInput, match="terminate_waiting"):
        run_failover(out, target=rq_target(), terminate_waiting=True)
    with pytest.raises(ValueError, match="no level"):
        ReplicatedPostgres("sometimes")
    assert not out.exists()


class _AnswersFromALocalCommit(PostgresQueue):
    """A planted bug, the queue as it was: a commit whose answer was lost, found committed,
    is acknowledged at once, though its session was ended while it waited for the standby
    (PostgreSQL keeps it "committed locally, but might not have been replicated")."""

    @staticmethod
    def _barrier(conn: psycopg.Connection[Any]) -> None:
        return None


@pytest.mark.parametrize(
    ("queue_class", "loses"), [(_AnswersFromALocalCommit, True), (PostgresQueue, False)]
)
def test_a_commit_whose_waiting_session_was_ended_is_answered_only_once_the_standby_has_it(
    tmp_path: Path, queue_class: type[PostgresQueue], loses: bool
) -> None:
    record = run_failover(
        tmp_path / "terminated",
        target=postgres_target("on", queue_class=queue_class),
        failovers=2,
        jobs=300,
        terminate_waiting=True,
    )
    assert all(one["sessions_terminated_while_waiting"] >= 1 for one in record["failovers"])
    assert record["judged"], record["reasons"]
    lost = record["findings"]["broken_promises"]
    if loses:
        assert lost >= 1
        assert record["headline"].startswith("broken promise:")
    else:
        assert lost == 0, record["headline"]
        assert record["ok"]
        assert record["keeps_its_promises"]


def test_without_the_postgres_extra_the_command_says_so_in_one_line(
    run_cli: RunCli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As in an environment without psycopg: the run's module cannot be imported.
    monkeypatch.setitem(sys.modules, "crashqueuelab.lab.failover.run", None)
    run = run_cli("failover", "--output-directory", tmp_path / "f")
    assert run.code == 2
    assert run.result["error"]["type"] == "SystemUnavailable"
    assert "postgres extra" in run.result["error"]["message"]
    assert not (tmp_path / "f").exists()


def test_choosing_the_standby_to_promote() -> None:
    assert choose_standby([300, 100], "most-advanced", 1) == 0
    assert choose_standby([100, 300], "most-advanced", 1) == 1
    assert choose_standby([None, 100], "most-advanced", 1) == 1
    assert choose_standby([200, 200], "most-advanced", 1) == 0
    assert choose_standby([300, 100], "lagging", 1) == 1


def test_two_standby_options_the_run_cannot_use_are_refused_before_anything_runs(
    run_cli: RunCli, tmp_path: Path
) -> None:
    out = tmp_path / "refused"
    for options, field in (
        (["--promote", "lagging"], "promote"),
        (["--standbys", "3"], "standbys"),
        (["--system", "rq", "--standbys", "2"], "standbys"),
        (["--system", "rq", "--promote", "most-advanced"], "promote"),
    ):
        run = run_cli("failover", *options, "--output-directory", out)
        assert run.code == 2, (options, run.result)
        assert run.result["error"]["field"] == field
    assert not out.exists()
    with pytest.raises(ValueError, match="1 to 2 standbys"):
        ReplicatedPostgres("on", standbys=0)
    with pytest.raises(ValueError, match="no promotion rule"):
        ReplicatedPostgres("on", promote="oldest")


def test_quorum_commit_loses_acknowledged_jobs_when_the_failover_promotes_the_lagging_standby(
    run_cli: RunCli, tmp_path: Path
) -> None:
    out = tmp_path / "quorum"
    run = run_cli(
        "failover", "--standbys", "2", "--promote", "lagging", "--failovers", "1",
        "--jobs", "120", "--quiet", "--output-directory", out,
    )  # fmt: skip
    # Every commit waited for the standby that kept up; the one promoted had none of the cut.
    assert run.code == 1, run.result
    assert run.result["keeps_its_promises"]
    assert run.result["failovers"][0]["promoted_slot"] == 1
    record = json.loads((out / "failover.json").read_text())
    lost_is_the_tail_from_the_cut(out, record)
    assert run.result["counts"]["lost_enqueues"] == len(record["findings"]["lost_enqueues"])
    received = record["failovers"][0]["standbys_received"]
    # The other standby had received more: a failover that compared them would have kept it.
    assert received[0]["bytes"] > received[1]["bytes"]
    assert record["server"]["standbys"] == 2
    assert "'ANY 1 (*)'" in record["server"]["replication"]
    page = (out / "report.html").read_text()
    assert "--standbys 2 --promote lagging" in page
    assert "runtime-config-replication.html#GUC-SYNCHRONOUS-STANDBY-NAMES" in page
