"""RQ on a replicated Redis the run starts: a primary, a replica and three Sentinels, every
node behind the fault proxy, the replica's link partitioned before the primary dies. What
Redis's documentation allows (asynchronous replication loses acknowledged writes; with
``min-replicas-to-write`` the window is bounded; the clients' ``WAIT`` improves "the real
world data safety") is what the runs show."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crashqueuelab.core.errors import InvalidInput
from crashqueuelab.lab.failover.run import run_failover
from crashqueuelab.lab.failover.targets import rq_target
from crashqueuelab.lab.pages.render import write_report
from crashqueuelab.servers.redis import find_redis_server
from tests.conftest import RunCli
from tests.lab.failover.losses import lost_is_the_tail_from_the_cut

pytestmark = pytest.mark.skipif(find_redis_server() is None, reason="no redis-server")


@pytest.mark.cluster
def test_rq_through_sentinel_loses_what_the_replica_never_received_as_documented(
    run_cli: RunCli, tmp_path: Path
) -> None:
    out = tmp_path / "async"
    run = run_cli(
        "failover", "--system", "rq", "--failovers", "1", "--jobs", "150", "--lag-s", "1",
        "--deadline-s", "20", "--quiet", "--output-directory", out,
    )  # fmt: skip
    assert run.code == 1, run.result
    assert run.result["keeps_its_promises"]
    assert run.result["setting"] == "asynchronous"
    assert run.result["headline"].startswith("as documented: rq at asynchronous")
    record = json.loads((out / "failover.json").read_text())
    failover = record["failovers"][0]
    # A second of enqueues went to the primary alone: all of them are gone.
    acknowledged_at = lost_is_the_tail_from_the_cut(out, record)
    assert failover["before"]["lag_bytes"] > 0
    # Clients found the new primary through the Sentinels: the work went on after it. (Not
    # that all 150 were acknowledged: on a loaded host the producer can still be submitting
    # at the deadline.)
    assert any(at > failover["promoted_at_s"] for at in acknowledged_at.values()), failover
    assert record["server"]["clients"].startswith("through the Sentinels")
    page = (out / "report.html").read_text()
    assert "acknowledged writes can still be lost during a failover" in page


@pytest.mark.cluster
@pytest.mark.parametrize("fault", ["pause", "partition"])
def test_a_primary_paused_or_cut_off_acknowledges_writes_that_its_demotion_loses(
    run_cli: RunCli, tmp_path: Path, fault: str
) -> None:
    """SIGSTOP, or a partition from the Sentinels and the replica, instead of SIGKILL: the
    Sentinels promote the replica; the old primary, back (or reached by its clients all
    along), answers them as a primary until a Sentinel demotes it to a replica of the new
    one, which discards what it wrote."""
    out = tmp_path / fault
    run = run_cli(
        "failover", "--system", "rq", "--primary-fault", fault, "--failovers", "1",
        "--jobs", "300", "--lag-s", "1", "--deadline-s", "30", "--quiet",
        "--output-directory", out,
    )  # fmt: skip
    assert run.code == 1, run.result
    assert run.result["keeps_its_promises"]
    record = json.loads((out / "failover.json").read_text())
    (failover,) = record["failovers"]
    assert failover["primary_fault"] == fault
    assert failover["promoted_s"] < failover["resumed_s"] < failover["demoted_s"]
    counts = record["findings"]["counts"]
    assert counts["lost_from_the_old_primary_after_the_fault"] > 0
    assert "acknowledged by the old primary after it was paused or cut off" in record["headline"]
    # The demoted primary is the replica of the new one: no new node was made for it.
    assert record["server"]["primary_fault"] == fault
    assert f"--primary-fault {fault}" in (out / "report.html").read_text()


def test_the_proxy_tells_a_replicas_link_and_a_sentinels_connections_from_a_client() -> None:
    from crashqueuelab.lab.failover.sentinel import _replica_link

    assert _replica_link("node1", b"*3\r\n$8\r\nREPLCONF\r\n") == "node1/replication"
    setname = b"*3\r\n$6\r\nCLIENT\r\n$7\r\nSETNAME\r\n$24\r\nsentinel-1a2b3c4d-cmd\r\n"
    assert _replica_link("node1", setname) == "node1/sentinels"
    assert _replica_link("node1", b"*2\r\n$5\r\nHELLO\r\n$1\r\n3\r\n") is None


@pytest.mark.cluster
def test_min_replicas_to_write_refuses_writes_once_the_replica_lags_and_bounds_the_loss(
    tmp_path: Path,
) -> None:
    record = run_failover(
        tmp_path / "bounded",
        target=rq_target(min_replicas=1, max_lag_s=1),
        failovers=1,
        jobs=400,
        lag_s=6.0,
        deadline_s=25.0,
    )
    failover = record["failovers"][0]
    told = record["callers_told_failure"]
    # The primary answered NOREPLICAS once its replica had not acknowledged for a second.
    assert any("ResponseError" in name for name in told), told
    lost = record["findings"]["lost_enqueues"]
    assert lost, record["headline"]
    # Only what was acknowledged before the refusals began is lost, never the whole cut.
    # Redis bounds it by whole seconds: the replica acknowledges once a second, its lag is
    # the server's seconds clock minus that acknowledgement's second (so up to max-lag + 1
    # s), and the count of good replicas is refreshed once a second (replicationCron); an
    # answer is written down up to half a second after the primary gave it under load.
    window = failover["cut_at_s"] + 1.0 + (1.0 + 1.0) + 1.0 + 0.5
    assert all(item["acknowledged_at_s"] <= window for item in lost), (window, lost[-1])
    assert failover["killed_at_s"] - failover["cut_at_s"] >= 6.0
    assert record["findings"]["promise"]["allows_loss"]
    assert record["setting"] == "min-replicas"


def test_a_postgres_setting_for_rq_is_refused_before_anything_starts(
    run_cli: RunCli, tmp_path: Path
) -> None:
    run = run_cli(
        "failover", "--system", "rq", "--synchronous-commit", "on",
        "--output-directory", tmp_path / "no",
    )  # fmt: skip
    assert run.code == 2
    assert run.result["error"]["field"] == "synchronous_commit"
    run = run_cli(
        "failover", "--min-replicas-to-write", "1", "--output-directory", tmp_path / "no",
    )  # fmt: skip
    assert run.code == 2
    assert run.result["error"]["field"] == "min_replicas_to_write"
    for system in ("postgres", "rabbitmq"):
        run = run_cli(
            "failover", "--system", system, "--primary-fault", "pause",
            "--output-directory", tmp_path / "no",
        )  # fmt: skip
        assert run.code == 2
        assert run.result["error"]["field"] == "primary_fault"
    assert not (tmp_path / "no").exists()


@pytest.mark.cluster
def test_a_wait_after_each_enqueue_tells_the_cut_s_submissions_unknown_and_loses_none(
    tmp_path: Path,
) -> None:
    out = tmp_path / "wait"
    record = run_failover(
        out,
        target=rq_target(wait_replicas=1, wait_timeout_ms=300),
        failovers=1,
        # Few enough that the producer, about ten enqueues a second with a WAIT each on a
        # loaded host, submits them all well inside the deadline (150 did not, once: 148).
        jobs=60,
        lag_s=1.0,
        deadline_s=20.0,
    )
    assert record["setting"] == "wait"
    assert record["server"]["replication"] == (
        "asynchronous, the clients' WAIT 1 300 after each enqueue"
    )
    # Every submission the replica did not acknowledge in time was told so, never "done".
    told = record["callers_told_failure"]
    assert told.get("submit: OutcomeUnknown", 0) >= 1, told
    # What was acknowledged had reached the replica the Sentinels promoted.
    assert record["findings"]["lost_enqueues"] == [], record["headline"]
    assert record["findings"]["enqueues_acknowledged"] == 60
    assert record["findings"]["promise"]["source"] == "https://redis.io/docs/latest/commands/wait/"
    page = write_report(out).read_text()
    assert "--system rq --wait-replicas 1 --wait-timeout-ms 300" in page


def test_wait_and_min_replicas_are_one_setting_each(run_cli: RunCli, tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="WAIT or min-replicas-to-write"):
        rq_target(min_replicas=1, wait_replicas=1)
    run = run_cli(
        "failover", "--wait-replicas", "1", "--output-directory", tmp_path / "no",
    )  # fmt: skip
    assert run.code == 2
    assert run.result["error"]["field"] == "wait_replicas"
    assert not (tmp_path / "no").exists()
