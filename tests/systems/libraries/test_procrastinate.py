"""procrastinate under the lab on the session's PostgreSQL server: crash points, the
independent reader, and the two questions its users asked about workers that die.

procrastinate comes with the ``procrastinate`` extra, which the gates install, and the
server with ``.ci/run``: these tests run in CI.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from crashqueuelab.core.clock import ManualClock
from crashqueuelab.core.ids import SeededIds
from crashqueuelab.core.retry import RetryPolicy
from crashqueuelab.judges.readers.postgres import DESCRIPTOR_FILE
from crashqueuelab.judges.readers.procrastinate import read_procrastinate_store
from crashqueuelab.lab.campaign.run import run_campaign
from crashqueuelab.systems import JobSpec, OpenRequest, Verdict, resolve_system
from crashqueuelab.systems.libraries.procrastinate.client import STALLED_S, ProcrastinateClient


def open_client(directory: Path) -> ProcrastinateClient:
    request = OpenRequest(
        directory, clock=ManualClock(10**9), ids=SeededIds(1, "t"), retry=RetryPolicy()
    )
    client = resolve_system("procrastinate").open(request)
    assert isinstance(client, ProcrastinateClient)
    return client


def test_every_crash_point_passes_and_what_fails_is_what_procrastinate_documents(
    tmp_path: Path, postgres_dsn: str
) -> None:
    system = resolve_system("procrastinate")
    report = run_campaign(
        tmp_path / "c",
        seed=5,
        system="procrastinate",
        probes=["stale_holder_after_expiry", "idempotent_submit", "attempts_run_out"],
        crash_points=[point.name for point in system.crash_points],
    )
    summary = report["summary"]
    # A worker killed after fetch_job, before or after its effect: recovery prunes the dead
    # worker (its jobs' worker_id set to NULL) and then finds the job stalled all the same.
    assert (summary["passed"], summary["failed"]) == (12, 0)
    verdicts = {probe["name"]: probe for probe in report["probes"]}
    assert verdicts["idempotent_submit"]["ok"] is True
    assert verdicts["attempts_run_out"]["ok"] is True
    promises = report["promises"]
    assert promises["broken_promises"] == []
    assert [entry["what"].split(":")[0] for entry in promises["weaker_as_documented"]] == [
        "stalled jobs are found by their worker's heartbeat on the server's clock (0.4 s here)"
    ]


def test_a_job_whose_dead_workers_row_was_pruned_is_still_found_and_retried(
    tmp_path: Path, postgres_dsn: str
) -> None:
    # procrastinate issue 1518, scenario 1: the dead worker's row is pruned first, then
    # the stalled jobs are looked for. The foreign key sets the job's worker_id to NULL,
    # and the stalled-jobs query takes NULL workers: the job is found.
    store = tmp_path / "store"
    dead = open_client(store)
    dead.submit(JobSpec("k/job", "t", {}))
    claim = dead.claim("worker-dead", 5_000_000)
    assert claim is not None
    dead.beats.stop()  # the process dies: no heartbeat from here on
    time.sleep(STALLED_S * 1.5)
    live = open_client(store)
    try:
        pruned = live._run(live.manager.prune_stalled_workers(STALLED_S))
        assert pruned == [dead.workers["worker-dead"]]
        reading = read_procrastinate_store(store)
        assert reading.orphaned == ["k/job"]
        assert reading.jobs["k/job"] == ("doing", 1)
        assert live.recover() == 1
        again = live.claim("worker-live", 5_000_000)
        assert again is not None
        assert (again.key, again.attempt) == ("k/job", 2)
        assert live.succeed(again) is Verdict.SUCCEEDED
        # No token: the dead holder's completion, had it come, is refused only because
        # the job is finished now.
        assert dead.succeed(claim) is Verdict.STALE
    finally:
        live.close()
        dead.beats.workers.clear()
        dead.close()
    assert read_procrastinate_store(store).jobs == {"k/job": ("succeeded", 2)}


def test_a_worker_pruned_while_it_was_stopped_fails_its_next_fetch(
    tmp_path: Path, postgres_dsn: str
) -> None:
    from procrastinate.exceptions import ConnectorException

    store = tmp_path / "store"
    stopped = open_client(store)
    other = open_client(store)
    try:
        stopped.submit(JobSpec("k/one", "t", {}))
        stopped.submit(JobSpec("k/two", "t", {}))
        first = stopped.claim("worker-a", 5_000_000)
        assert first is not None
        stopped.beats.stop()  # SIGSTOP: no heartbeat while it is stopped
        time.sleep(STALLED_S * 1.5)
        assert other.recover() == 1  # prunes worker-a and retries its job
        # Continued: its next fetch names a worker row that is gone.
        with pytest.raises(ConnectorException) as raised:
            stopped.claim("worker-a", 5_000_000)
        assert isinstance(raised.value.__cause__, psycopg.errors.ForeignKeyViolation)
    finally:
        other.close()
        stopped.workers.clear()
        stopped.close()


def test_the_reader_names_rows_the_lab_did_not_write_and_changes_nothing(
    tmp_path: Path, postgres_dsn: str
) -> None:
    store = tmp_path / "store"
    client = open_client(store)
    client.submit(JobSpec("k/one", "t", {"a": 1}))
    client.close()
    schema = json.loads((store / DESCRIPTOR_FILE).read_text())["schema"]
    with psycopg.connect(
        postgres_dsn, autocommit=True, options=f"-c search_path={schema}"
    ) as connection:
        connection.execute(
            f'INSERT INTO "{schema}".procrastinate_jobs (queue_name, task_name, args)'
            " VALUES ('default', 'other', '{\"x\": 1}')"
        )
        before = connection.execute(
            f'SELECT id, status::text, attempts, args FROM "{schema}".procrastinate_jobs'
            " ORDER BY id"
        ).fetchall()
    reading = read_procrastinate_store(store)
    with psycopg.connect(postgres_dsn, autocommit=True) as connection:
        after = connection.execute(
            f'SELECT id, status::text, attempts, args FROM "{schema}".procrastinate_jobs'
            " ORDER BY id"
        ).fetchall()
    assert after == before
    assert reading.jobs == {"k/one": ("todo", 0)}
    assert reading.problems == ["job 2: no key in its arguments ({'x': 1})"]
    missing: Any = read_procrastinate_store(tmp_path / "nothing")
    assert missing.exists is False
