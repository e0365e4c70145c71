"""pgqueuer and procrastinate on the replicated PostgreSQL a failover run starts: a
submission answered from a job found under its key waits for the synchronous standbys,
and a run through either library keeps every acknowledged job at a waiting level."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from crashqueuelab.core.clock import SystemClock
from crashqueuelab.core.ids import RandomIds
from crashqueuelab.judges.readers.pgqueuer import KEYS_FILE
from crashqueuelab.lab.failover.cluster import ReplicatedPostgres
from crashqueuelab.lab.failover.targets import RETRY, environment
from crashqueuelab.lab.runs.reopening import Reopening
from crashqueuelab.servers.base import wait_until
from crashqueuelab.servers.postgres import find_binaries
from crashqueuelab.systems.contract import Claim, JobSpec, OpenRequest, Verdict
from crashqueuelab.systems.registry import resolve_system
from tests.conftest import RunCli

needs_postgres = pytest.mark.skipif(find_binaries() is None, reason="no PostgreSQL binaries")
#: Long past anything the standby's link could need: the answer waits for the link itself.
STILL_WAITING_S = 0.5
JOIN_TIMEOUT_S = 30.0


def _job(key: str) -> JobSpec:
    return JobSpec(key, "synthetic.effect", {"value": 1}, 5)


@needs_postgres
@pytest.mark.parametrize("system", ["pgqueuer", "procrastinate"])
def test_a_submission_found_under_its_key_is_answered_once_the_standby_has_it(
    system: str, tmp_path: Path
) -> None:
    with (
        ReplicatedPostgres("on") as cluster,
        environment(cluster.client_environment(), os.environ),
    ):
        request = OpenRequest(tmp_path / "store", SystemClock(), RandomIds(), RETRY)
        first, second = (resolve_system(system).open(request) for _ in range(2))
        try:
            first.submit(_job("a"))
            if system == "pgqueuer":
                # Its answer lost before the adapter noted the job's id (which it answers
                # from at once): only pgqueuer's DuplicateJobError tells it "a" is queued.
                (tmp_path / "store" / KEYS_FILE).unlink()
            # The standby stops receiving WAL: whatever commits now waits for it, and an
            # answer read from the row "a" (committed and replicated) would not.
            cluster.cut_replication()
            answered: list[str] = []
            again = threading.Thread(target=lambda: answered.append(second.submit(_job("a"))))
            again.start()
            again.join(STILL_WAITING_S)
            # A loaded host may bring the submission to its COMMIT later: wait, bounded, until
            # it waits there (or was answered, which fails below).
            wait_until(
                lambda: (
                    not again.is_alive() or cluster.lag()["commits_waiting_for_the_standby"] >= 1
                ),
                JOIN_TIMEOUT_S,
                poll_s=0.05,
            )
            # The lab cannot tell a committed-locally row from a replicated one by reading
            # it: the answer waits for the standbys whatever the row, and goes on with them.
            assert again.is_alive(), "answered from the row without waiting for the standby"
            assert cluster.lag()["commits_waiting_for_the_standby"] >= 1
            cluster.heal_replication()
            again.join(JOIN_TIMEOUT_S)
            assert not again.is_alive()
            assert len(answered) == 1
        finally:
            first.close()
            second.close()


@pytest.mark.server_fault
@needs_postgres
def test_procrastinate_keeps_every_acknowledged_job_when_waiting_sessions_are_ended(
    run_cli: RunCli, tmp_path: Path
) -> None:
    out = tmp_path / "procrastinate"
    run = run_cli(
        "failover", "--system", "procrastinate", "--synchronous-commit", "on",
        "--terminate-waiting", "--failovers", "1", "--jobs", "120", "--deadline-s", "90", "--quiet",
        "--output-directory", out,
    )  # fmt: skip
    assert run.code == 0, run.result
    assert run.result["failovers"][0]["sessions_terminated_while_waiting"] >= 1
    assert run.result["counts"]["lost_enqueues"] == 0
    record = json.loads((out / "failover.json").read_text())
    assert record["findings"]["enqueues_acknowledged"] == 120
    assert record["final_store"]["ok"]
    # Its clients were told of the ended sessions, and went on with new ones.
    assert any(name.startswith("submit:") for name in record["callers_told_failure"])
    page = (out / "report.html").read_text()
    assert "--system procrastinate --synchronous-commit on" in page


class _Client:
    """A client whose calls raise while ``broken`` (a connection that went away)."""

    def __init__(self, opened: list[_Client], broken: Callable[[], bool]) -> None:
        self.broken = broken
        self.closed = False
        opened.append(self)

    def _call(self) -> None:
        if self.broken():
            raise ConnectionError("the server went away")

    def submit(self, job: JobSpec) -> str:
        self._call()
        return job.key

    def claim(self, worker_id: str, lease_us: int) -> Claim | None:
        self._call()
        return None

    def succeed(self, claim: Claim) -> Verdict:
        self._call()
        return Verdict.SUCCEEDED

    def recover(self) -> int:
        self._call()
        return 0

    def close(self) -> None:
        self.closed = True


def test_a_reopening_client_opens_a_new_one_before_the_call_after_a_failure() -> None:
    opened: list[_Client] = []
    down = [False]
    refuse_open = [False]

    def open_client() -> Any:
        if refuse_open[0]:
            raise ConnectionError("no server")
        return _Client(opened, lambda: down[0])

    client = Reopening(open_client)
    assert client.submit(_job("a")) == "a"
    down[0] = True
    with pytest.raises(ConnectionError):
        client.claim("w", 1000)
    # The failed call's client is closed; the next call opens another.
    assert opened[0].closed
    down[0] = False
    refuse_open[0] = True
    with pytest.raises(ConnectionError, match="no server"):
        client.recover()
    refuse_open[0] = False
    assert client.recover() == 0
    assert len(opened) == 2
    down[0] = True
    with pytest.raises(ConnectionError):
        client.succeed(_claim())
    with pytest.raises(ConnectionError):
        client.submit(_job("b"))
    down[0] = False
    assert client.succeed(_claim()) is Verdict.SUCCEEDED
    client.close()
    client.close()
    assert all(one.closed for one in opened)


def _claim() -> Claim:
    return Claim("1", "k", "synthetic.effect", {}, 1, "w", "t")
