"""Probes of a lease's fence: an expired holder, a reused worker id, a live lease, the
deadline itself, and heartbeats before and after a restart."""

from __future__ import annotations

from crashqueuelab.judges.findings import Kind
from crashqueuelab.lab.campaign.probes.harness import ProbeFailed, _accepted, _Bench, _refused
from crashqueuelab.lab.workloads.scenario import LEASE_US


def stale_holder_after_expiry(bench: _Bench) -> str:
    bench.job("stale-holder")
    first = bench.claim("worker-a", "stale-holder")
    bench.expire()
    second = bench.claim("worker-b", "stale-holder")
    _refused(
        bench.client.succeed(first),
        first,
        "an acknowledgement after the lease expired",
        Kind.LATE_ACKNOWLEDGEMENT_ACCEPTED,
    )
    _accepted(bench.client.succeed(second), second, "the acknowledgement")
    return "the expired holder's acknowledgement was refused; the new holder's accepted"


def worker_id_reused_after_restart(bench: _Bench) -> str:
    bench.job("reused-id")
    first = bench.claim("worker-a", "reused-id")
    bench.expire()
    second = bench.claim("worker-a", "reused-id")
    _refused(
        bench.client.succeed(first),
        first,
        "an acknowledgement of the old lease (same worker id)",
        Kind.LATE_ACKNOWLEDGEMENT_ACCEPTED,
    )
    _accepted(bench.client.succeed(second), second, "the acknowledgement")
    return "same worker id, new lease: the old lease's acknowledgement was refused"


def a_leased_job_is_not_claimed_again(bench: _Bench) -> str:
    bench.job("leased")
    first = bench.claim("worker-a", "leased")
    again = bench.client.claim("worker-b", LEASE_US)
    if again is not None:
        raise ProbeFailed(
            Kind.CLAIMED_WHILE_LEASED,
            f"job {again.key}: handed to worker-b (attempt {again.attempt}) while worker-a's"
            f" lease {first.token} was live",
            job=again.key,
            attempt=again.attempt,
            worker="worker-b",
            holder="worker-a",
        )
    _accepted(bench.client.succeed(first), first, "the acknowledgement")
    return "a job under a live lease was not handed to a second claimer"


def acknowledgement_at_the_deadline(bench: _Bench) -> str:
    bench.job("deadline")
    claim = bench.claim("worker-a", "deadline")
    bench.clock.advance(LEASE_US)
    _refused(
        bench.client.succeed(claim),
        claim,
        "an acknowledgement exactly at the deadline",
        Kind.ACKNOWLEDGEMENT_AT_DEADLINE_ACCEPTED,
    )
    return "an acknowledgement exactly at the deadline was refused"


def heartbeat_after_expiry(bench: _Bench) -> str:
    bench.job("heartbeat")
    first = bench.claim("worker-a", "heartbeat")
    bench.expire()
    second = bench.claim("worker-b", "heartbeat")
    _refused(
        bench.client.heartbeat(first, LEASE_US),
        first,
        "a heartbeat after expiry",
        Kind.DEAD_HEARTBEAT_ACCEPTED,
    )
    _accepted(bench.client.succeed(second), second, "the acknowledgement")
    return "the expired holder's heartbeat was refused"


def heartbeat_survives_restart(bench: _Bench) -> str:
    """A heartbeat that returned is durable: after a restart, at a time past the claim's
    deadline and before the heartbeat's, the job is still its holder's."""
    bench.job("extended")
    claim = bench.claim("worker-a", "extended")
    bench.clock.advance(LEASE_US // 2)
    if not bench.client.heartbeat(claim, LEASE_US):
        raise ProbeFailed(
            Kind.LIVE_HEARTBEAT_REFUSED,
            "job extended: the live holder's heartbeat was refused",
            job="extended",
        )
    bench.restart()
    bench.clock.advance(LEASE_US // 2 + LEASE_US // 4)  # past the claim's deadline only
    bench.client.recover()
    view = bench.client.job("extended")
    if view is None or view.status != "leased":
        state = "missing" if view is None else f"{view.native_state} ({view.status})"
        raise ProbeFailed(
            Kind.LEASE_LOST_ON_RESTART,
            f"job extended: {state} after a restart between the claim's deadline and the"
            " heartbeat's; the heartbeat's deadline did not reach the store",
            job="extended",
            status="missing" if view is None else str(view.status),
        )
    again = bench.client.claim("worker-b", LEASE_US)
    if again is not None:
        raise ProbeFailed(
            Kind.CLAIMED_WHILE_LEASED,
            f"job {again.key}: handed to worker-b after a restart, though worker-a's heartbeat"
            " had extended its lease past that moment",
            job=again.key,
            attempt=again.attempt,
            worker="worker-b",
            holder="worker-a",
        )
    _accepted(bench.client.succeed(claim), claim, "the acknowledgement after the restart")
    return "a heartbeat's deadline survived a restart; its holder's acknowledgement counted"
