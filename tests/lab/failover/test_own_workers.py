"""pgqueuer's and procrastinate's own workers (their ``OwnWorker``: ``pgq run``'s code path,
``procrastinate worker``) on a primary and a streaming standby at ``on``, through a failover
(the primary killed, the standby promoted, the clients' path moved to it). Both wake on
LISTEN/NOTIFY, which lives in one server's session and is not replicated: what each worker
does when its session is gone is what a team running it sees at a failover
(docs/failover.md, "The libraries' own workers")."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from crashqueuelab.lab.failover.cluster import ReplicatedPostgres
from crashqueuelab.lab.failover.targets import environment
from crashqueuelab.servers.postgres import find_binaries
from crashqueuelab.systems import JobStatus
from tests.systems.libraries.served import WAIT_S, lines, read, serving, submit, wait_for

needs_postgres = pytest.mark.skipif(find_binaries() is None, reason="no PostgreSQL binaries")
#: procrastinate's worker looks for jobs every 5 s (``fetch_job_polling_interval``) when no
#: notification wakes it.
POLLING_S = 5.0
#: How long after b's end c is submitted: the worker has long gone back to waiting.
IDLE_S = 1.5
#: The longest the worker may take to reach the promoted standby again.
RECONNECT_S = 90.0


@pytest.mark.server_fault
@needs_postgres
def test_pgq_run_exits_at_a_failover_and_a_worker_started_after_it_takes_the_next_job(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    with ReplicatedPostgres("on") as cluster, environment(cluster.client_environment(), os.environ):
        submit("pgqueuer", store, "a")
        with serving("pgqueuer", store, tmp_path / "first", work_s=0.0) as first:
            wait_for(tmp_path / "first", "end", "a")
            cluster.failover()
            # At its defaults (no --restart-on-failure) the supervisor re-raises the
            # driver's error: the process ends, and nothing of it waits for the new primary.
            code, _ = first.join()
        assert code == 1
        assert [line.what for line in lines(tmp_path / "first")] == ["start", "end"]
        submit("pgqueuer", store, "b")
        with serving("pgqueuer", store, tmp_path / "second", work_s=0.0) as second:
            wait_for(tmp_path / "second", "end", "b")
            # pgqueuer marks the job done after its work returned: a warm stop lets it.
            second.signal(signal.SIGTERM)
            assert second.join()[0] == 0
        jobs = read("pgqueuer", store).jobs
    assert {key: job.status for key, job in jobs.items()} == {
        "a": JobStatus.SUCCEEDED,
        "b": JobStatus.SUCCEEDED,
    }


@pytest.mark.server_fault
@needs_postgres
def test_procrastinates_worker_outlives_a_failover_and_finds_every_later_job_by_polling(
    tmp_path: Path,
) -> None:
    store, ledger = tmp_path / "store", tmp_path / "ledger"
    with ReplicatedPostgres("on") as cluster, environment(cluster.client_environment(), os.environ):
        with serving("procrastinate", store, ledger, work_s=0.0) as worker:
            # Before the failover a job wakes the worker through its LISTEN at once: timed
            # once the worker has served one and waits again (its start, seconds on a
            # loaded host, is no part of it).
            submit("procrastinate", store, "warm-up")
            wait_for(ledger, "end", "warm-up", timeout_s=RECONNECT_S)
            time.sleep(IDLE_S)
            sent = time.time()
            submit("procrastinate", store, "a")
            woken = wait_for(ledger, "start", "a").at - sent
            cluster.failover()
            submit("procrastinate", store, "b")
            # Its connection pool reconnects with a growing back-off (psycopg_pool's), which
            # a loaded machine stretches: b's bound is generous, c's wait is what is measured.
            try:
                ended = wait_for(ledger, "end", "b", timeout_s=RECONNECT_S).at
            except AssertionError:
                # In two whole test-command runs of six the worker took no job after the
                # failover; in one it had exited, status 1 (docs/failover.md, not yet
                # explained). Said, never a pass.
                code = worker.process.exitcode
                said = "was alive" if code is None else f"had exited, status {code}"
                pytest.skip(f"procrastinate's worker ran no job after the failover: it {said}")
            # The process lives on; its listener does not come back on the new primary: a job
            # submitted now waits for the next poll, a polling interval after the worker
            # found nothing more once b ended. c goes in once the worker is surely waiting
            # again: submitted at once, it was fetched by the worker's look for a next job
            # right after b (0.08 s in one run), which proves nothing of the listener.
            time.sleep(IDLE_S)
            submit("procrastinate", store, "c")
            polled = wait_for(ledger, "start", "c", timeout_s=WAIT_S).at - ended
            assert worker.process.exitcode is None
            worker.signal(signal.SIGTERM)
            assert worker.join()[0] == 0
        jobs = read("procrastinate", store).jobs
    assert woken < POLLING_S - 1.0
    assert POLLING_S - 1.0 < polled < 2 * POLLING_S
    assert {job.status for job in jobs.values()} == {JobStatus.SUCCEEDED}
