"""Probes of acknowledgements that carry more than one job: batched ones fence each item as its
lease stands, and chained ones (acknowledge and lease the next) are fenced as plain ones."""

from __future__ import annotations

from crashqueuelab.judges.findings import Kind
from crashqueuelab.lab.campaign.probes.harness import ProbeFailed, _accepted, _Bench, _refused
from crashqueuelab.lab.workloads.scenario import LEASE_US
from crashqueuelab.systems.contract import ChainingClient


def batched_acknowledgement_fences_each_item(bench: _Bench) -> str:
    bench.job("batch-stale")
    stale = bench.claim("worker-a", "batch-stale")
    bench.expire()
    bench.claim("worker-b", "batch-stale")  # the job is worker-b's now
    bench.job("batch-live")
    live = bench.claim("worker-a", "batch-live")
    verdicts = bench.client.succeed_many([live, stale])
    _refused(
        verdicts[1],
        stale,
        "an expired acknowledgement batched after a live one",
        Kind.LATE_ACKNOWLEDGEMENT_ACCEPTED,
    )
    _accepted(verdicts[0], live, "the batch's live acknowledgement")
    return "in one batch, the live item was accepted and the expired one refused"


def batched_acknowledgement_sees_the_lease_as_it_stands(bench: _Bench) -> str:
    """A batch's leases count as they stand when it is acknowledged, not as they were when
    it was claimed: a queue that remembers the leases it granted must not trust the memory."""
    for key in ("shortened", "kept", "overdue"):
        bench.job(key)
    claims = {claim.key: claim for claim in bench.client.claim_many("worker-a", LEASE_US, 3)}
    if sorted(claims) != ["kept", "overdue", "shortened"]:
        raise ProbeFailed(
            Kind.CLAIM_NOT_OFFERED,
            f"jobs shortened, kept, overdue: worker-a should claim all three in one batch;"
            f" the queue offered {sorted(claims) or 'nothing'}",
            offered="another job" if claims else "nothing",
            worker="worker-a",
        )
    shortened, kept, overdue = claims["shortened"], claims["kept"], claims["overdue"]
    if not bench.client.heartbeat(shortened, LEASE_US // 10):
        raise ProbeFailed(
            Kind.LIVE_HEARTBEAT_REFUSED,
            "job shortened: the live holder's heartbeat was refused",
            job="shortened",
        )
    bench.clock.advance(LEASE_US // 2)
    verdicts = bench.client.succeed_many([shortened, kept])
    _refused(
        verdicts[0],
        shortened,
        "a batched acknowledgement after its heartbeat's nearer deadline",
        Kind.ACKNOWLEDGEMENT_AT_DEADLINE_ACCEPTED,
    )
    _accepted(verdicts[1], kept, "the batch's live acknowledgement")
    bench.clock.advance(LEASE_US - LEASE_US // 2)
    [late] = bench.client.succeed_many([overdue])
    _refused(
        late,
        overdue,
        "a batched acknowledgement at the deadline, no recovery run yet",
        Kind.ACKNOWLEDGEMENT_AT_DEADLINE_ACCEPTED,
    )
    return (
        "in batches, a lease a heartbeat had shortened and a lease at its deadline were"
        " refused, the live one accepted"
    )


def _chaining(bench: _Bench) -> ChainingClient:
    client = bench.client
    if not isinstance(client, ChainingClient):
        raise ProbeFailed(
            Kind.CAPABILITY_MISSING,
            "the system declares chained calls, and its client has none",
            capability="chained",
        )
    return client


def chained_acknowledgement_is_fenced(bench: _Bench) -> str:
    """The acknowledgement that also leases the next job is fenced as a plain one: a stale
    one changes nothing, claims nothing, and its caller is told so."""
    chaining = _chaining(bench)
    bench.job("chained-stale")
    first = bench.claim("worker-a", "chained-stale")
    bench.expire()
    second = bench.claim("worker-b", "chained-stale")
    bench.job("chained-next")
    verdict, claimed = chaining.succeed_and_claim(first, LEASE_US)
    _refused(
        verdict,
        first,
        "a chained acknowledgement after the lease expired",
        Kind.LATE_ACKNOWLEDGEMENT_ACCEPTED,
    )
    if claimed is not None:
        raise ProbeFailed(
            Kind.UNEXPECTED_CLAIM,
            f"job {claimed.key}: leased to worker-a by a chained acknowledgement that was refused",
            job=claimed.key,
            attempt=claimed.attempt,
        )
    verdict, claimed = chaining.succeed_and_claim(second, LEASE_US)
    _accepted(verdict, second, "the chained acknowledgement")
    if claimed is None or claimed.key != "chained-next":
        offered = "nothing" if claimed is None else f"job {claimed.key}"
        raise ProbeFailed(
            Kind.CLAIM_NOT_OFFERED,
            f"job chained-next: the live holder's chained acknowledgement should lease it;"
            f" it leased {offered}",
            job="chained-next",
            offered="nothing" if claimed is None else "another job",
        )
    verdicts, batch = chaining.succeed_many_and_claim([claimed, first], "worker-b", LEASE_US, 2)
    _accepted(verdicts[0], claimed, "the chained batch's live acknowledgement")
    _refused(
        verdicts[1],
        first,
        "an expired acknowledgement in a chained batch",
        Kind.LATE_ACKNOWLEDGEMENT_ACCEPTED,
    )
    if batch:
        raise ProbeFailed(
            Kind.UNEXPECTED_CLAIM,
            f"job {batch[0].key}: leased though no job was ready",
            job=batch[0].key,
            attempt=batch[0].attempt,
        )
    return (
        "chained acknowledgements: the expired one refused and claimed nothing, the live"
        " ones accepted with the next job leased"
    )
