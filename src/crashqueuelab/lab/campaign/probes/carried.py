"""The probe of calls carried by another writer's commit: each caller's answer must be what the
store holds, whether that writer commits or dies."""

from __future__ import annotations

import functools

from crashqueuelab.judges.findings import Kind
from crashqueuelab.lab.campaign.probes.harness import ProbeFailed, _accepted, _Bench, _refused
from crashqueuelab.lab.workloads.scenario import LEASE_US
from crashqueuelab.systems.contract import CARRIER_FATES, CarrierStaging, ChainingClient, Claim


def _staging(bench: _Bench) -> CarrierStaging:
    client = bench.client
    if not isinstance(client, CarrierStaging):
        raise ProbeFailed(
            Kind.CAPABILITY_MISSING,
            "the system declares carried calls, and its client cannot stage them",
            capability="carried",
        )
    return client


def _stands(bench: _Bench, key: str, status: str, told: str) -> None:
    """The store must hold job ``key`` as the caller was ``told``."""
    view = bench.client.job(key)
    if view is None or view.status != status:
        found = "missing" if view is None else f"{view.native_state} ({view.status})"
        raise ProbeFailed(
            Kind.STORE_DIFFERS,
            f"job {key}: the caller was told {told}; the store has it {found}",
            job=key,
            told=status,
            stored="missing" if view is None else str(view.status),
        )


def carried_calls_are_judged_against_the_store(bench: _Bench) -> str:
    """Single calls carried by another writer's commit, that writer committing or dying
    before or after its commit: each caller's answer must be what the store holds."""
    staging = _staging(bench)
    for fate in CARRIER_FATES:
        _carried_claim(bench, staging, fate)
        _carried_acknowledgements(bench, staging, fate)
        if isinstance(bench.client, ChainingClient):
            _carried_chain(bench, staging, bench.client, fate)
    return (
        f"carried claims and acknowledgements, the carrier committing or dying at each of"
        f" {len(CARRIER_FATES) - 1} moments: every caller was told what the store holds"
    )


def _carried_claim(bench: _Bench, staging: CarrierStaging, fate: str) -> None:
    key = f"carried-claim-{fate}"
    bench.job(key)
    claim = staging.behind_a_carrier(
        functools.partial(bench.client.claim, "worker-a", LEASE_US), fate
    )
    if not isinstance(claim, Claim) or claim.key != key:
        raise ProbeFailed(
            Kind.CLAIM_NOT_OFFERED,
            f"job {key}: a claim carried by a writer that {fate} got {claim}",
            job=key,
            offered="nothing" if claim is None else "another job",
            carrier=fate,
        )
    _stands(bench, key, "leased", f"it holds the lease (carrier {fate})")
    _accepted(bench.client.succeed(claim), claim, f"the acknowledgement (carrier {fate})")


def _carried_acknowledgements(bench: _Bench, staging: CarrierStaging, fate: str) -> None:
    key = f"carried-ack-{fate}"
    bench.job(key)
    claim = bench.claim("worker-a", key)
    verdict = staging.behind_a_carrier(functools.partial(bench.client.succeed, claim), fate)
    _accepted(verdict, claim, f"an acknowledgement carried by a writer that {fate}")
    _stands(bench, key, "succeeded", f"{verdict} (carrier {fate})")

    key = f"carried-stale-{fate}"
    bench.job(key)
    stale = bench.claim("worker-a", key)
    bench.expire()
    live = bench.claim("worker-b", key)
    verdict = staging.behind_a_carrier(functools.partial(bench.client.succeed, stale), fate)
    _refused(
        verdict,
        stale,
        f"an expired acknowledgement carried by a writer that {fate}",
        Kind.LATE_ACKNOWLEDGEMENT_ACCEPTED,
    )
    _stands(bench, key, "leased", f"{verdict} (carrier {fate})")
    _accepted(bench.client.succeed(live), live, "the new holder's acknowledgement")


def _carried_chain(
    bench: _Bench, staging: CarrierStaging, chaining: ChainingClient, fate: str
) -> None:
    key, following = f"carried-chain-{fate}", f"carried-chain-next-{fate}"
    bench.job(key)
    claim = bench.claim("worker-a", key)
    bench.job(following)
    verdict, chained = staging.behind_a_carrier(
        functools.partial(chaining.succeed_and_claim, claim, LEASE_US), fate
    )
    _accepted(verdict, claim, f"a chained acknowledgement carried by a writer that {fate}")
    _stands(bench, key, "succeeded", f"{verdict} (carrier {fate})")
    if chained is None or chained.key != following:
        raise ProbeFailed(
            Kind.CLAIM_NOT_OFFERED,
            f"job {following}: a chained acknowledgement carried by a writer that {fate}"
            f" should lease it; it leased {chained}",
            job=following,
            offered="nothing" if chained is None else "another job",
            carrier=fate,
        )
    _stands(bench, following, "leased", f"it holds the lease (carrier {fate})")
    _accepted(bench.client.succeed(chained), chained, "the chained claim's acknowledgement")
