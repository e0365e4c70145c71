"""Deploy runs that crash the system's server and start it again (``deploys
--server-restarts``): when each restart strikes and what it records, what the option
refuses, how a run judges an execution under way across a restart, and a run on a Redis
server the run started."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from crashqueuelab.core.errors import InvalidInput
from crashqueuelab.judges.findings import Anomaly, Kind
from crashqueuelab.lab.deploys.judge import WorkerFate, judge
from crashqueuelab.lab.deploys.plan import DeployPlan, server_fault_times
from crashqueuelab.lab.deploys.serverrestarts import ServerRestarts
from crashqueuelab.lab.runs.executions import Execution, read_ledger
from crashqueuelab.systems.contract import JobStatus, StoredJob
from tests.conftest import RunCli

DONE = StoredJob("finished", JobStatus.SUCCEEDED, 1)


class Clock:
    """A clock the test moves (no sleeps)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_restart_strikes_when_due_one_at_a_time_and_records_how_long_the_server_was_down() -> (
    None
):
    clock = Clock()
    calls: list[float] = []

    def restart() -> None:
        calls.append(clock.now)
        clock.now += 2.5  # the server takes this long to serve again

    restarts = ServerRestarts(restart, [3.0, 7.0], clock)
    assert restarts.count == 2
    restarts.strike_due()
    assert calls == []
    assert not restarts.finished()
    clock.now = 3.0
    restarts.strike_due()
    restarts.wait(10.0)
    assert calls == [3.0]
    assert restarts.done == [{"at_s": 3.0, "back_at_s": 5.5, "down_s": 2.5}]
    clock.now = 7.0
    restarts.strike_due()
    restarts.wait(10.0)
    assert [r["at_s"] for r in restarts.done] == [3.0, 7.0]
    assert restarts.finished()
    assert restarts.error is None
    assert restarts.count == 2


def test_a_restart_whose_server_does_not_start_is_the_runs_error_and_nothing_follows_it() -> None:
    clock = Clock()

    def restart() -> None:
        raise RuntimeError("the node did not answer")

    restarts = ServerRestarts(restart, [0.0, 0.0], clock)
    restarts.strike_due()
    restarts.wait(10.0)
    assert restarts.error == "RuntimeError: the node did not answer"
    assert restarts.done == [{"at_s": 0.0, "back_at_s": None, "down_s": None}]
    restarts.strike_due()  # none after a failed one
    assert len(restarts.done) == 1
    assert restarts.pending == [0.0]


def test_restarts_fall_half_an_interval_after_each_stop_like_failovers() -> None:
    plan = DeployPlan(workers=2, deploys=0, server_restarts=2, interval_s=4.0, warmup_s=1.0)
    plan.check()
    assert server_fault_times(plan) == [3.0, 7.0]
    assert plan.to_json()["server_restarts"] == 2


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"server_restarts": -1}, "server_restarts"),
        ({"server_restarts": 1, "failovers": 1}, "server_restarts"),
        ({"deploys": 0, "server_restarts": 0}, "deploys"),
    ],
)
def test_a_plan_refuses_what_a_server_restart_cannot_be(
    changes: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidInput) as refused:
        DeployPlan(**changes).check()
    assert refused.value.field == field


def test_an_execution_under_way_at_a_restart_is_said_so_in_its_finding() -> None:
    """A job run again after an execution that ran when the server restarted (or ended
    within ``ACK_IN_FLIGHT_S`` before it, its acknowledgement perhaps not yet sent) is
    marked ``across_server_restart``; one that ended long before is not; a run without
    restarts has no such fact."""
    runs = [
        Execution("a", "w0", 1.0, 3.6),
        Execution("a", "w1", 6.0, 7.0),
        Execution("b", "w0", 0.5, 1.0),
        Execution("b", "w1", 8.0, 9.0),
        # Started while the server was down (a task prefetched before the crash).
        Execution("c", "w0", 4.5, 4.8),
        Execution("c", "w1", 9.0, 9.5),
    ]
    fates = {"w0": WorkerFate("w0"), "w1": WorkerFate("w1")}
    stored = {"a": DONE, "b": DONE, "c": DONE}
    keys = ["a", "b", "c"]
    found, _ = judge(keys, runs, fates, {}, stored, "SIGTERM", restarts=[(4.0, 5.0)])
    facts = {a.job: a.facts for a in found if a.kind is Kind.RAN_TWICE}
    across = {key: facts[key]["across_server_restart"] for key in keys}
    assert across == {"a": True, "b": False, "c": True}
    plain, _ = judge(["a"], runs[:2], fates, {}, stored, "SIGTERM")
    assert "across_server_restart" not in plain[0].facts


def test_a_job_received_before_a_restart_and_started_after_it_is_said_never_excused() -> None:
    """Where the library tells when its worker received a job (``received KEY T`` in the
    ledger), a finding says whether the job was received before the server went down and
    started after: a delivery held unstarted across the crash, said, while only an
    execution under way at the restart is ``across_server_restart`` (the documented
    weakness's); a job whose receipt the library never told says nothing of it."""
    ledger = (
        "received d 3.000000\nstart d 6.000000 11\nend d 6.500000\n"
        "received e 5.500000\nstart e 6.000000 11\nend e 6.500000\n"
        "start f 6.000000 11\nend f 6.500000\n"
    )
    runs = [
        *read_ledger(ledger, "w0"),
        Execution("d", "w1", 9.0, 9.5),
        Execution("e", "w1", 9.0, 9.5),
        Execution("f", "w1", 9.0, 9.5),
    ]
    assert [run.received_s for run in runs[:3]] == [3.0, 5.5, None]
    assert runs[0].to_json(0.0)["received_s"] == 3.0
    assert "received_s" not in runs[2].to_json(0.0)
    fates = {"w0": WorkerFate("w0"), "w1": WorkerFate("w1")}
    keys = ["d", "e", "f"]
    stored = dict.fromkeys(keys, DONE)
    found, _ = judge(keys, runs, fates, {}, stored, "SIGTERM", restarts=[(4.0, 5.0)])
    facts = {a.job: a.facts for a in found if a.kind is Kind.RAN_TWICE}
    assert {key: facts[key]["across_server_restart"] for key in keys} == dict.fromkeys(keys, False)
    assert facts["d"]["received_before_server_restart"] is True
    assert facts["e"]["received_before_server_restart"] is False
    assert "received_before_server_restart" not in facts["f"]


def test_a_job_run_again_says_when_its_worker_received_it_against_that_workers_stop() -> None:
    """Celery #3796's pattern: a task taken in the instant its worker's warm shutdown began
    ran to its end unacknowledged, and ran again after the worker was SIGKILLed; the
    finding says how long after the stop signal the job was received (negative: before),
    and says nothing where the receipt or the stop is unknown."""
    runs = [
        Execution("a", "w0", 7.06, 7.25, received_s=7.0595),
        Execution("a", "w1", 8.08, 8.27),
        Execution("b", "w0", 2.0, 2.5, received_s=1.5),
        Execution("b", "w1", 9.0, 9.5),
        Execution("c", "w1", 3.0, 3.5, received_s=2.9),
        Execution("c", "w0", 9.6, 9.8),
    ]
    fates = {"w0": WorkerFate("w0", stop_s=7.059, killed_s=8.07), "w1": WorkerFate("w1")}
    keys = ["a", "b", "c"]
    found, _ = judge(keys, runs, fates, {}, dict.fromkeys(keys, DONE), "SIGTERM")
    facts = {a.job: a.facts for a in found if a.kind is Kind.RAN_TWICE}
    assert facts["a"]["received_from_stop_ms"] == 0
    assert facts["a"]["worker_then"] == "sigkilled"
    assert facts["b"]["received_from_stop_ms"] == -5559
    assert "received_from_stop_ms" not in facts["c"]


def test_a_start_is_dated_by_the_latest_receipt_of_its_key_and_a_receipt_serves_once() -> None:
    """A receipt its worker never ran (a delivery it dropped) must not date a later start:
    the later receipt does; a second start with no receipt of its own has none."""
    ledger = (
        "received a 1.000000\nreceived a 2.000000\nstart a 2.100000 7\nend a 2.200000\n"
        "start a 3.000000 7\nend a 3.100000\nreceived b 4.000000\nreceived\nreceived b x\n"
    )
    assert [(run.key, run.received_s) for run in read_ledger(ledger, "w")] == [
        ("a", 2.0),
        ("a", None),
    ]


def test_a_run_without_a_server_of_its_own_refuses_restarts_and_writes_nothing(
    tmp_path: Path, run_cli: RunCli
) -> None:
    outcome = run_cli(
        "deploys", "--system", "sqlite", "--output-directory", str(tmp_path / "d"),
        "--workers", "1", "--deploys", "1", "--server-restarts", "1",
    )  # fmt: skip
    assert outcome.code == 2
    assert outcome.result["error"]["field"] == "server_restarts"
    assert not (tmp_path / "d").exists()


@pytest.mark.server_fault
def test_rq_across_a_crash_of_its_redis_server_loses_only_what_its_snapshot_did_not_keep(
    tmp_path: Path, run_cli: RunCli
) -> None:
    """The run starts RQ's Redis server (RDB snapshots only) and crashes it half an
    interval after the first stop: what the crash takes back of the jobs in the store when
    it began is the snapshot's documented weakness, named so (each finding says whether its
    job was there); the restart's record says when the server served again."""
    outcome = run_cli(
        "deploys", "--system", "rq", "--output-directory", str(tmp_path / "d"),
        "--workers", "2", "--deploys", "1", "--jobs", "8", "--long-share", "0",
        "--grace-s", "2", "--server-restarts", "1", "--recovery-wait-s", "10",
    )  # fmt: skip
    record: dict[str, Any] = json.loads((tmp_path / "d" / "deploys.json").read_text())
    assert record["error"] is None, record["error"]
    restarts = record["server_restarts"]
    assert restarts["server"] == "its Redis server"
    [restart] = restarts["restarts"]
    assert restart["back_at_s"] >= restart["at_s"]
    assert restart["down_s"] >= 0
    assert "1 crash(es) of its Redis server" in record["headline"]
    assert outcome.result["server_restarts"] == restarts
    promises = record["promises"]
    # Killed before its first snapshot (RDB saves after 60 s at the soonest), the server
    # comes back without the jobs submitted at once: the crash must have struck some.
    struck = {f["text"] for f in record["findings"] if f["facts"]["before_server_restart"]}
    assert struck, record["findings"]
    assert not struck & set(promises["broken_promises"]), promises
    explained = [entry["what"] for entry in promises["weaker_as_documented"]]
    assert any("RDB snapshots" in what for what in explained), explained
    # The lab's contract does not hold across the crash (what it took back), whatever the
    # documentation says of it.
    assert outcome.code == 1, outcome.stderr
    page = (tmp_path / "d" / "report.html").read_text()
    assert "crashes of its Redis server" in page


def test_the_server_a_restart_crashes_is_named_as_the_systems_store_or_broker() -> None:
    from crashqueuelab.lab.deploys.serverfaults import server_name
    from crashqueuelab.systems.registry import resolve_system

    assert server_name(resolve_system("postgres")) == "its PostgreSQL server"
    assert server_name(resolve_system("rq")) == "its Redis server"
    assert server_name(resolve_system("sqlite")) == "its server"


def test_only_a_job_in_the_store_when_a_restart_began_is_the_restarts_to_explain() -> None:
    """A restart's fault explains, through the server's persistence, the findings of jobs
    submitted before it began; a job submitted after every restart that was then lost is
    no snapshot's doing, and stays a broken promise."""
    from crashqueuelab.lab.deploys.judge import with_restart_facts
    from crashqueuelab.lab.runs.promises import classify
    from crashqueuelab.systems.registry import resolve_system

    def lost(key: str) -> Anomaly:
        return Anomaly(Kind.LOST_IN_DEPLOY, f"job {key}: lost", job=key, facts={"stored": "x"})

    marked = with_restart_facts(
        [lost("early"), lost("late")], {"early": 1.0, "late": 6.0}, [(3.0, 3.1), (5.0, None)]
    )
    assert [f.facts["before_server_restart"] for f in marked] == [True, False]
    verdict = classify(resolve_system("rq"), "deploys", marked, ["server restart"])
    assert verdict["broken_promises"] == ["job late: lost"]
    assert with_restart_facts([lost("early")], {"early": 1.0}, []) == [lost("early")]
