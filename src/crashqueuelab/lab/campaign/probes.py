"""Fencing probes: short scripted races that every queue must refuse, run on every system.

Crashes are not the only way to break a queue: a holder whose lease expired, a worker id
reused after a restart (procrastinate #1518, Oban #862), an acknowledgement landing exactly
at the deadline. Each probe drives the system through its contract on a fresh store and
names the job and what happened when the system accepts what it must refuse. A probe that
needs a capability the system lacks is skipped, and the report says so.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crashqueuelab.core.clock import ManualClock
from crashqueuelab.core.errors import InvalidInput
from crashqueuelab.core.ids import SeededIds
from crashqueuelab.lab.workloads.scenario import LEASE_US, RETRY, START_US
from crashqueuelab.systems.contract import (
    CARRIER_FATES,
    AttemptsClient,
    CarrierStaging,
    ChainingClient,
    Claim,
    JobSpec,
    OpenRequest,
    QueueClient,
    System,
    Verdict,
)


class ProbeFailed(Exception):
    """Raised inside a probe when the system accepted what it must refuse."""


@dataclass
class _Bench:
    client: QueueClient
    clock: ManualClock
    #: Opens the probe's store again, as a restarted process would.
    opener: Callable[[], QueueClient]

    def restart(self) -> None:
        """Close the system and open its store again: nothing held in memory survives."""
        self.client.close()
        self.client = self.opener()

    def job(self, key: str, *, max_attempts: int = 3) -> JobSpec:
        spec = JobSpec(key=key, job_type="probe", payload={"probe": key}, max_attempts=max_attempts)
        self.client.submit(spec)
        return spec

    def claim(self, worker_id: str, key: str) -> Claim:
        claim = self.client.claim(worker_id, LEASE_US)
        if claim is None or claim.key != key:
            offered = "nothing" if claim is None else f"job {claim.key}"
            raise ProbeFailed(
                f"job {key}: {worker_id} should claim it now; the queue offered {offered}"
            )
        return claim

    def expire(self) -> None:
        """Let every lease run out, and any retry come due; the system notices each."""
        self.clock.advance(LEASE_US)
        self.client.recover()
        self.clock.advance(RETRY.max_delay_us)
        self.client.recover()


def _refused(verdict: Verdict | bool, claim: Claim, what: str) -> None:
    if verdict not in (Verdict.STALE, False):
        raise ProbeFailed(
            f"job {claim.key}: {what} by {claim.worker_id} (lease {claim.token}, attempt "
            f"{claim.attempt}) was accepted ({verdict}); it must be refused"
        )


def _accepted(verdict: Verdict, claim: Claim, what: str) -> None:
    if verdict is not Verdict.SUCCEEDED:
        raise ProbeFailed(f"job {claim.key}: {what} by the live holder answered {verdict}")


def stale_holder_after_expiry(bench: _Bench) -> str:
    bench.job("stale-holder")
    first = bench.claim("worker-a", "stale-holder")
    bench.expire()
    second = bench.claim("worker-b", "stale-holder")
    _refused(bench.client.succeed(first), first, "an acknowledgement after the lease expired")
    _accepted(bench.client.succeed(second), second, "the acknowledgement")
    return "the expired holder's acknowledgement was refused; the new holder's accepted"


def worker_id_reused_after_restart(bench: _Bench) -> str:
    bench.job("reused-id")
    first = bench.claim("worker-a", "reused-id")
    bench.expire()
    second = bench.claim("worker-a", "reused-id")
    _refused(
        bench.client.succeed(first), first, "an acknowledgement of the old lease (same worker id)"
    )
    _accepted(bench.client.succeed(second), second, "the acknowledgement")
    return "same worker id, new lease: the old lease's acknowledgement was refused"


def a_leased_job_is_not_claimed_again(bench: _Bench) -> str:
    bench.job("leased")
    first = bench.claim("worker-a", "leased")
    again = bench.client.claim("worker-b", LEASE_US)
    if again is not None:
        raise ProbeFailed(
            f"job {again.key}: handed to worker-b (attempt {again.attempt}) while worker-a's"
            f" lease {first.token} was live"
        )
    _accepted(bench.client.succeed(first), first, "the acknowledgement")
    return "a job under a live lease was not handed to a second claimer"


def acknowledgement_at_the_deadline(bench: _Bench) -> str:
    bench.job("deadline")
    claim = bench.claim("worker-a", "deadline")
    bench.clock.advance(LEASE_US)
    _refused(bench.client.succeed(claim), claim, "an acknowledgement exactly at the deadline")
    return "an acknowledgement exactly at the deadline was refused"


def heartbeat_after_expiry(bench: _Bench) -> str:
    bench.job("heartbeat")
    first = bench.claim("worker-a", "heartbeat")
    bench.expire()
    second = bench.claim("worker-b", "heartbeat")
    _refused(bench.client.heartbeat(first, LEASE_US), first, "a heartbeat after expiry")
    _accepted(bench.client.succeed(second), second, "the acknowledgement")
    return "the expired holder's heartbeat was refused"


def heartbeat_survives_restart(bench: _Bench) -> str:
    """A heartbeat that returned is durable: after a restart, at a time past the claim's
    deadline and before the heartbeat's, the job is still its holder's."""
    bench.job("extended")
    claim = bench.claim("worker-a", "extended")
    bench.clock.advance(LEASE_US // 2)
    if not bench.client.heartbeat(claim, LEASE_US):
        raise ProbeFailed("job extended: the live holder's heartbeat was refused")
    bench.restart()
    bench.clock.advance(LEASE_US // 2 + LEASE_US // 4)  # past the claim's deadline only
    bench.client.recover()
    view = bench.client.job("extended")
    if view is None or view.status != "leased":
        state = "missing" if view is None else f"{view.native_state} ({view.status})"
        raise ProbeFailed(
            f"job extended: {state} after a restart between the claim's deadline and the"
            " heartbeat's; the heartbeat's deadline did not reach the store"
        )
    again = bench.client.claim("worker-b", LEASE_US)
    if again is not None:
        raise ProbeFailed(
            f"job {again.key}: handed to worker-b after a restart, though worker-a's heartbeat"
            " had extended its lease past that moment"
        )
    _accepted(bench.client.succeed(claim), claim, "the acknowledgement after the restart")
    return "a heartbeat's deadline survived a restart; its holder's acknowledgement counted"


def idempotent_submit(bench: _Bench) -> str:
    spec = JobSpec(key="twice", job_type="probe", payload={"n": 1})
    first, second = bench.client.submit(spec), bench.client.submit(spec)
    if first != second:
        raise ProbeFailed(f"job twice: the same key made two jobs, {first} and {second}")
    claim = bench.claim("worker-a", "twice")
    _accepted(bench.client.succeed(claim), claim, "the acknowledgement")
    if bench.client.claim("worker-a", LEASE_US) is not None:
        raise ProbeFailed("job twice: a second job was claimable after one submission key")
    # A producer that retries after the job finished must get the finished job back.
    third = bench.client.submit(spec)
    again = bench.client.claim("worker-a", LEASE_US)
    if third != first or again is not None:
        raise ProbeFailed(
            f"job twice: submitted again after it succeeded, the key made job {third}"
            + ("" if again is None else f", claimable as attempt {again.attempt}")
            + f" (the finished job is {first})"
        )
    return "one key, one job: later submissions, also after success, returned the first job"


def attempts_run_out(bench: _Bench) -> str:
    bench.job("last-attempt", max_attempts=1)
    claim = bench.claim("worker-a", "last-attempt")
    verdict = bench.client.fail(claim, "probe failure")
    if verdict is not Verdict.DEAD:
        raise ProbeFailed(f"job last-attempt: a failure of its only attempt answered {verdict}")
    return "a failure of the last attempt sent the job to the dead letter"


def expired_attempts_run_out(bench: _Bench) -> str:
    bench.job("abandoned", max_attempts=1)
    bench.claim("worker-a", "abandoned")
    bench.expire()  # its holder died: the only attempt ran out with the lease
    again = bench.client.claim("worker-b", LEASE_US)
    view = bench.client.job("abandoned")
    if again is not None or view is None or view.status != "dead":
        state = "missing" if view is None else f"{view.native_state} ({view.status})"
        offered = "" if again is None else f", and handed to worker-b (attempt {again.attempt})"
        raise ProbeFailed(
            f"job abandoned: its only attempt expired, yet it is {state}{offered}; a job whose"
            " every holder dies must reach the dead letter"
        )
    return "an expired last attempt sent the job to the dead letter"


def retry_delay_is_capped(bench: _Bench) -> str:
    failures = 6
    bench.job("backoff", max_attempts=failures + 1)
    for attempt in range(failures):
        claim = bench.client.claim("worker-a", LEASE_US)
        if claim is None:
            raise ProbeFailed(
                f"job backoff: not ready {RETRY.max_delay_us} us after its failure {attempt},"
                " the retry policy's longest delay: the backoff grows past its cap"
            )
        bench.client.fail(claim, "probe failure")
        bench.clock.advance(RETRY.max_delay_us)
        bench.client.recover()
    return f"after each of {failures} failures the job was ready within the delay cap"


def batched_acknowledgement_fences_each_item(bench: _Bench) -> str:
    bench.job("batch-stale")
    stale = bench.claim("worker-a", "batch-stale")
    bench.expire()
    bench.claim("worker-b", "batch-stale")  # the job is worker-b's now
    bench.job("batch-live")
    live = bench.claim("worker-a", "batch-live")
    verdicts = bench.client.succeed_many([live, stale])
    _refused(verdicts[1], stale, "an expired acknowledgement batched after a live one")
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
            f"jobs shortened, kept, overdue: worker-a should claim all three in one batch;"
            f" the queue offered {sorted(claims) or 'nothing'}"
        )
    shortened, kept, overdue = claims["shortened"], claims["kept"], claims["overdue"]
    if not bench.client.heartbeat(shortened, LEASE_US // 10):
        raise ProbeFailed("job shortened: the live holder's heartbeat was refused")
    bench.clock.advance(LEASE_US // 2)
    verdicts = bench.client.succeed_many([shortened, kept])
    _refused(
        verdicts[0], shortened, "a batched acknowledgement after its heartbeat's nearer deadline"
    )
    _accepted(verdicts[1], kept, "the batch's live acknowledgement")
    bench.clock.advance(LEASE_US - LEASE_US // 2)
    [late] = bench.client.succeed_many([overdue])
    _refused(late, overdue, "a batched acknowledgement at the deadline, no recovery run yet")
    return (
        "in batches, a lease a heartbeat had shortened and a lease at its deadline were"
        " refused, the live one accepted"
    )


def _chaining(bench: _Bench) -> ChainingClient:
    client = bench.client
    if not isinstance(client, ChainingClient):
        raise ProbeFailed("the system declares chained calls, and its client has none")
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
    _refused(verdict, first, "a chained acknowledgement after the lease expired")
    if claimed is not None:
        raise ProbeFailed(
            f"job {claimed.key}: leased to worker-a by a chained acknowledgement that was refused"
        )
    verdict, claimed = chaining.succeed_and_claim(second, LEASE_US)
    _accepted(verdict, second, "the chained acknowledgement")
    if claimed is None or claimed.key != "chained-next":
        offered = "nothing" if claimed is None else f"job {claimed.key}"
        raise ProbeFailed(
            f"job chained-next: the live holder's chained acknowledgement should lease it;"
            f" it leased {offered}"
        )
    verdicts, batch = chaining.succeed_many_and_claim([claimed, first], "worker-b", LEASE_US, 2)
    _accepted(verdicts[0], claimed, "the chained batch's live acknowledgement")
    _refused(verdicts[1], first, "an expired acknowledgement in a chained batch")
    if batch:
        raise ProbeFailed(f"job {batch[0].key}: leased though no job was ready")
    return (
        "chained acknowledgements: the expired one refused and claimed nothing, the live"
        " ones accepted with the next job leased"
    )


def _reports(bench: _Bench, key: str, status: str, attempts: int, active: int) -> None:
    view, counted = bench.client.job(key), bench.client.active_count()
    found = None if view is None else (view.status, view.attempts)
    if found != (status, attempts) or counted != active:
        raise ProbeFailed(
            f"job {key}: the system reports it {found} with {counted} unfinished jobs; its"
            f" holders were told ({status!r}, {attempts}) with {active} unfinished"
        )


def _reports_attempts(bench: _Bench, key: str, told: list[tuple[Claim, int, str | None]]) -> None:
    """Where the system reports attempts: each as its holder was told it (lease, number,
    holder, the deadline the last claim or heartbeat set, how it ended)."""
    if not isinstance(bench.client, AttemptsClient):
        return
    reported = [view.to_json() for view in bench.client.attempts(key) or []]
    expected = [
        {"attempt": claim.attempt, "worker": claim.worker_id, "token": claim.token,
         "deadline": deadline, "outcome": outcome}
        for claim, deadline, outcome in told
    ]  # fmt: skip
    if len(reported) != len(expected):
        raise ProbeFailed(
            f"job {key}: the system reports {len(reported)} attempts; its holders were granted"
            f" {len(expected)}"
        )
    differences = [
        f"attempt {want['attempt']} (lease {want['token']}): {name} reported {got[name]},"
        f" told {want[name]}"
        for got, want in zip(reported, expected, strict=True)
        for name in want
        if got[name] != want[name]
    ]
    if differences:
        raise ProbeFailed(f"job {key}: {'; '.join(differences)}")


def self_reports_match_what_holders_were_told(bench: _Bench) -> str:
    """What the system says about a job (its view, its attempts, the count of unfinished
    jobs) after a heartbeat that extends the lease, one that shortens it, a failure, a retry
    and a success: each must be what the job's holders were told."""
    bench.job("reported")
    first = bench.claim("worker-a", "reported")
    bench.clock.advance(LEASE_US // 4)
    for lease in (LEASE_US, LEASE_US // 10):  # the second heartbeat shortens the lease
        if not bench.client.heartbeat(first, lease):
            raise ProbeFailed("job reported: the live holder's heartbeat was refused")
        deadline = bench.clock.now_us() + lease
    _reports(bench, "reported", "leased", 1, 1)
    _reports_attempts(bench, "reported", [(first, deadline, None)])
    if bench.client.fail(first, "probe failure") is not Verdict.RETRY:
        raise ProbeFailed("job reported: a failure of attempt 1 of 3 was not retried")
    bench.expire()
    second = bench.claim("worker-b", "reported")
    told = [(first, deadline, "failed"), (second, bench.clock.now_us() + LEASE_US, None)]
    _reports(bench, "reported", "leased", 2, 1)
    _reports_attempts(bench, "reported", told)
    _accepted(bench.client.succeed(second), second, "the acknowledgement")
    _reports(bench, "reported", "succeeded", 2, 0)
    _reports_attempts(bench, "reported", [told[0], (second, told[1][1], "succeeded")])
    return "the job, its attempts and the unfinished count read as the holders were told"


def _staging(bench: _Bench) -> CarrierStaging:
    client = bench.client
    if not isinstance(client, CarrierStaging):
        raise ProbeFailed("the system declares carried calls, and its client cannot stage them")
    return client


def _stands(bench: _Bench, key: str, status: str, told: str) -> None:
    """The store must hold job ``key`` as the caller was ``told``."""
    view = bench.client.job(key)
    if view is None or view.status != status:
        found = "missing" if view is None else f"{view.native_state} ({view.status})"
        raise ProbeFailed(f"job {key}: the caller was told {told}; the store has it {found}")


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
        raise ProbeFailed(f"job {key}: a claim carried by a writer that {fate} got {claim}")
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
    _refused(verdict, stale, f"an expired acknowledgement carried by a writer that {fate}")
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
            f"job {following}: a chained acknowledgement carried by a writer that {fate}"
            f" should lease it; it leased {chained}"
        )
    _stands(bench, following, "leased", f"it holds the lease (carrier {fate})")
    _accepted(bench.client.succeed(chained), chained, "the chained claim's acknowledgement")


Probe = Callable[[_Bench], str]
#: Each probe, and the capability it needs (None: every system).
PROBES: tuple[tuple[str, Probe, str | None], ...] = (
    ("idempotent_submit", idempotent_submit, None),
    ("stale_holder_after_expiry", stale_holder_after_expiry, None),
    ("a_leased_job_is_not_claimed_again", a_leased_job_is_not_claimed_again, None),
    ("worker_id_reused_after_restart", worker_id_reused_after_restart, "fencing_tokens"),
    ("acknowledgement_at_the_deadline", acknowledgement_at_the_deadline, None),
    ("heartbeat_after_expiry", heartbeat_after_expiry, "heartbeats"),
    ("heartbeat_survives_restart", heartbeat_survives_restart, "heartbeats"),
    ("attempts_run_out", attempts_run_out, None),
    ("expired_attempts_run_out", expired_attempts_run_out, None),
    ("retry_delay_is_capped", retry_delay_is_capped, None),
    ("batched_acknowledgement_fences_each_item", batched_acknowledgement_fences_each_item, None),
    (
        "batched_acknowledgement_sees_the_lease_as_it_stands",
        batched_acknowledgement_sees_the_lease_as_it_stands,
        "heartbeats",
    ),
    (
        "self_reports_match_what_holders_were_told",
        self_reports_match_what_holders_were_told,
        "heartbeats",
    ),
    ("chained_acknowledgement_is_fenced", chained_acknowledgement_is_fenced, "chained"),
    (
        "carried_calls_are_judged_against_the_store",
        carried_calls_are_judged_against_the_store,
        "carried",
    ),
)


def run_probe(system: System, directory: Path, name: str, probe: Probe) -> dict[str, Any]:
    clock = ManualClock(START_US)
    opened = [0]

    def opener() -> QueueClient:
        opened[0] += 1
        ids = SeededIds(0, f"probe/{name}/{opened[0]}")
        return system.open(OpenRequest(directory, clock, ids, RETRY))

    try:
        bench = _Bench(opener(), clock, opener)
    except Exception as error:
        return {"name": name, "ran": True, "ok": False, "detail": f"open raised {error!r}"}
    try:
        detail = probe(bench)
        ok = True
    except ProbeFailed as failure:
        detail, ok = str(failure), False
    except Exception as error:  # a system that raises is reported, never a traceback
        detail, ok = f"the system raised {type(error).__name__}: {error}", False
    finally:
        bench.client.close()
    return {"name": name, "ran": True, "ok": ok, "detail": detail}


#: Why a probe that needs a capability skips a system without it.
_LACKS = {
    "fencing_tokens": "no fencing tokens",
    "heartbeats": "no heartbeats",
    "chained": "no chained calls",
    "carried": "no calls another writer's commit can carry",
}


def check_probe_names(names: Sequence[str] | None) -> None:
    """Refuse, before anything runs, a probe name that does not exist."""
    known = [name for name, _, _ in PROBES]
    unknown = sorted(set(names or ()) - set(known))
    if unknown:
        raise InvalidInput(
            "probe", f"{', '.join(unknown)}: no such probe (there are {', '.join(known)})"
        )


def run_probes(
    system: System, directory: Path, only: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """Every probe (or those named in ``only``) on a fresh store below ``directory``;
    skipped ones say why."""
    check_probe_names(only)
    results = []
    capabilities = system.capabilities.to_json()
    for name, probe, needs in PROBES:
        if only is not None and name not in only:
            continue
        if needs is not None and not capabilities[needs]:
            results.append(
                {"name": name, "ran": False, "ok": True, "detail": f"skipped: {_LACKS[needs]}"}
            )
            continue
        results.append(run_probe(system, directory / name, name, probe))
    return results
