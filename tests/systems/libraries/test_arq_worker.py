"""arq's own worker (``arq WorkerSettings``) in a real process on the test's Redis server:
what SIGTERM does to the job in hand (cancelled at once and put back, as arq documents), and
a job scheduled with ``enqueue_job(_defer_until=...)``, and a small rolling deploy of it."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import pytest

from crashqueuelab.systems import JobSpec, JobStatus, OpenRequest, resolve_system
from tests.conftest import RunCli
from tests.systems.libraries.served import lines, read, serving, wait_for


def submit(store: Path, key: str, max_attempts: int) -> None:
    from crashqueuelab.core.clock import ManualClock
    from crashqueuelab.core.ids import SeededIds
    from crashqueuelab.core.retry import RetryPolicy

    request = OpenRequest(
        store, clock=ManualClock(10**9), ids=SeededIds(1, "t"), retry=RetryPolicy()
    )
    client = resolve_system("arq").open(request)
    try:
        client.submit(JobSpec(key, "t", {}, max_attempts=max_attempts))
    finally:
        client.close()


def test_sigterm_cancels_the_job_in_hand_puts_it_back_and_the_next_worker_runs_it(
    tmp_path: Path, redis_socket: str
) -> None:
    store, ledger = tmp_path / "store", tmp_path / "ledger"
    submit(store, "a", max_attempts=2)
    with serving("arq", store, ledger, work_s=10.0) as worker:
        started = wait_for(ledger, "start", "a")
        worker.signal(signal.SIGTERM)
        code, exited = worker.join()
    # arq's handler cancels the job's task at once and the worker exits, long before the
    # work could have ended: the work (a thread, which no cancellation reaches) ends with
    # the process.
    assert code == 0
    assert exited < started.at + 10.0
    assert [line.what for line in lines(ledger)] == ["start", "exit"]
    job = read("arq", store).jobs["a"]
    # "will remain in the queue to be run again": its try counted.
    assert (job.native_state, job.attempts, job.status) == ("queued", 1, JobStatus.PENDING)
    with serving("arq", store, ledger, work_s=0.0):
        again = wait_for(ledger, "end", "a")
    assert again.pid != started.pid
    job = read("arq", store).jobs["a"]
    assert (job.native_state, job.attempts) == ("complete", 2)


def test_a_job_deferred_with_defer_until_runs_once_and_not_before_it_is_due(
    tmp_path: Path, redis_socket: str
) -> None:
    store, ledger = tmp_path / "store", tmp_path / "ledger"
    submit(store, "a", max_attempts=1)
    own = resolve_system("arq").own_worker
    assert own is not None
    assert own.schedule is not None
    with serving("arq", store, ledger, work_s=0.0):
        wait_for(ledger, "end", "a")
        due = time.time() + 1.0
        own.schedule(store, "s", due)
        assert read("arq", store).jobs["s"].native_state == "deferred"
        ran = wait_for(ledger, "end", "s")
        time.sleep(0.6)  # a second run would have started by now (arq polls every 0.5 s)
    runs = [line for line in lines(ledger) if (line.what, line.key) == ("start", "s")]
    assert len(runs) == 1
    assert runs[0].at >= due
    assert ran.at - due < 3.0
    assert read("arq", store).jobs["s"].status is JobStatus.SUCCEEDED


# Quiet: the one stop must find arq's worker holding its jobs. It falls due 1 s into the run
# (the warm-up), or later once the worker process writes its serving line, which comes
# before arq's own imports, its connection and its first poll. On a busy machine (beside
# the parallel part, with another suite running, before the stop waited for that line) the
# worker took no job before its SIGTERM and its replacement ran all three to their end (no
# execution cut: 1 run of 2).
@pytest.mark.quiet
def test_a_rolling_deploy_of_arqs_own_worker_cancels_the_jobs_in_hand_and_loses_none(
    tmp_path: Path, redis_socket: str, run_cli: RunCli
) -> None:
    directory = tmp_path / "d"
    outcome = run_cli(
        "deploys", "--system", "arq", "--output-directory", str(directory),
        "--workers", "1", "--deploys", "1", "--grace-s", "1", "--jobs", "3",
        "--long-share", "1", "--seed", "3",
    )  # fmt: skip
    record = json.loads((directory / "deploys.json").read_text())
    assert record["worker"]["lab_worker"] is False
    stopped = [w for w in record["workers"] if w["stopped_by"] == "deploy"]
    # arq's handler cancels the jobs at once: the worker exits well within its grace.
    assert len(stopped) == 1
    old = stopped[0]
    assert old["exited_within_grace"] is True
    # Every job it held was cut with it, put back by arq, and run to its end by the
    # replacement: nothing lost, nothing run twice to completion.
    cut = [e for e in record["executions"] if e["how"] != "ended"]
    assert cut, record["executions"]
    assert {e["worker"] for e in cut} == {old["name"]}
    for job in record["jobs"].values():
        assert (job["completed"], job["stored"]) == (1, "complete")
    # arq cancels a job's coroutine and puts the job back at the SIGTERM, but the work runs
    # in a thread, which no cancellation stops (arq issue 395, for its timeout): it goes on
    # until the old process exits. A replacement that takes the job back before that exit
    # runs it beside a live holder, and the lab says so (one gates run: the old worker
    # exited 0.25 s after its SIGTERM, the replacement took both jobs 0.02 s before). That
    # is the only finding a run may have, and only inside that window.
    beside = [f for f in record["findings"] if f["kind"] == "ran_beside_live_holder"]
    assert [f for f in record["findings"] if f not in beside] == []
    for finding in beside:
        assert finding["facts"] == {"holder": old["name"], "holder_stopping": True}
        again = [
            e for e in record["executions"]
            if e["key"] == finding["job"] and e["worker"] != old["name"]
        ]  # fmt: skip
        assert len(again) == 1
        assert old["stop_s"] <= again[0]["start_s"] < old["exit_s"]
    assert record["promises"]["broken_promises"] == [f["text"] for f in beside]
    assert record["ok"] is (not beside)
    assert outcome.code == (1 if beside else 0), record["anomalies"]


#: A worker's traceback when its SIGTERM cancelled run_job in its first read of a job: the
#: CancelledError out of ``pipe.execute()`` in ``run_job``, raised again in ``close``.
STRANDED_BY = re.compile(
    r"in close\n.*await asyncio\.gather.*in run_job\n.*await pipe\.execute\(\).*"
    r"asyncio\.exceptions\.CancelledError",
    re.DOTALL,
)


@pytest.mark.server_fault
def test_arqs_own_worker_across_a_crash_of_redis_keeping_an_always_synced_aof_loses_nothing(
    tmp_path: Path, run_cli: RunCli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``deploys --server-restarts 1`` on ``arq-aof-always``: the run starts its own Redis
    (appendfsync always), SIGKILLs it between the rolling deploys' stops and starts it again
    on its files. arq's own workers go on, and every job is stored complete: what Redis
    answered was on its disk. The stops bring only arq issue 395's findings, never a loss."""
    from crashqueuelab.servers.redis import SOCKET_VARIABLE

    monkeypatch.delenv(SOCKET_VARIABLE, raising=False)
    directory = tmp_path / "d"
    outcome = run_cli(
        "deploys", "--system", "arq-aof-always", "--workers", "2", "--deploys", "2",
        "--jobs", "12", "--server-restarts", "1", "--seed", "3",
        "--output-directory", str(directory), "--quiet",
    )  # fmt: skip
    record = json.loads((directory / "deploys.json").read_text())
    assert record["error"] is None, record["error"]
    [restart] = record["server_restarts"]["restarts"]
    assert restart["down_s"] > 0
    assert record["worker"]["describe"].startswith("arq")
    # Nothing lost to the server's crash. A stop may strand a job whose worker's SIGTERM
    # cancelled run_job in its first read of the job (arq 0.28.0's ``pipe.execute()``, before
    # any handler of the cancellation): start_jobs had set its in-progress key, nothing
    # deletes it, so the job waits for Redis to expire it (job_timeout + 10 s, 310 s here,
    # past the run), never having run, and the CancelledError leaves the worker's close()
    # through asyncio.gather: exit 1. Found in one gates run of the loaded machine; each
    # such job must come with a worker that exited so.
    stranded = {key for key, job in record["jobs"].items() if job["stored"] != "complete"}
    for key, job in record["jobs"].items():
        expected = (0, "in_progress") if key in stranded else (True, "complete")
        assert (job["completed"] if key in stranded else job["completed"] >= 1,
                job["stored"]) == expected, record["jobs"]  # fmt: skip
    if stranded:
        logs = {w["name"]: (directory / f"{w['name']}.log").read_text() for w in record["workers"]}
        cancelled_in_read = [
            w["name"] for w in record["workers"]
            if w["exit"] == "exit 1" and STRANDED_BY.search(logs[w["name"]])
        ]  # fmt: skip
        assert cancelled_in_read, (stranded, record["workers"])
    lost = [f for f in record["findings"] if f["kind"] == "lost_in_deploy"]
    assert {f["job"] for f in lost} == stranded, lost
    for finding in lost:
        assert finding["facts"]["executions"] == 0, finding
        assert finding["facts"]["signal"] == "SIGTERM", finding
    # What else a stop may bring is arq issue 395's (the test above): a job whose coroutine
    # arq cancelled and put back at the SIGTERM goes on in its thread, beside the
    # replacement that took it back, or to its end before the replacement runs it again
    # (one gates run: both, each from an execution its worker's SIGTERM found under way).
    kinds = {"ran_beside_live_holder", "ran_twice", "lost_in_deploy"}
    assert {f["kind"] for f in record["findings"]} <= kinds
    stops = {w["name"]: w["stop_s"] for w in record["workers"] if w["stop_s"] is not None}
    for finding in (f for f in record["findings"] if f["kind"] != "lost_in_deploy"):
        cut = [
            e for e in record["executions"]
            if e["key"] == finding["job"] and e["worker"] in stops
            and e["start_s"] < stops[e["worker"]] <= (e["end_s"] or float("inf"))
        ]  # fmt: skip
        assert cut, (finding, record["executions"])
    assert outcome.code in (0, 1), outcome.stderr
