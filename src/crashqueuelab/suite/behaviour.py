"""What every queue must do for the lab: the contract's behaviour, one check per rule.

Each check drives a ``Harness`` and asserts, each assertion saying in the lab's words what
the system did and what it must do; a check that needs a capability the system does not
declare does not apply to it (``Check.applies``). The project's own contract tests
run these on every system it ships, and the pytest plugin on yours.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from crashqueuelab.core.errors import OperationUnsupported
from crashqueuelab.suite.harness import LEASE_US, Harness
from crashqueuelab.systems.contract import Capabilities, JobSpec, JobStatus, Verdict


def _status(harness: Harness, key: str) -> tuple[JobStatus, int] | None:
    view = harness.client.job(key)
    return None if view is None else (view.status, view.attempts)


def _said(status: tuple[JobStatus, int] | None) -> str:
    return "nothing" if status is None else f"{status[0].value} after {status[1]} attempts"


def _answered(
    got: Verdict | bool | None, want: Verdict | bool | None, what: str, why: str = ""
) -> None:
    """``what`` must answer ``want``; else say what it answered instead."""
    said = got.value if isinstance(got, Verdict) else got
    wanted = want.value if isinstance(want, Verdict) else want
    assert got is want, f"{what} answered {said}; it must answer {wanted}{why}"


def _holds(harness: Harness, key: str, want: tuple[JobStatus, int] | None, when: str) -> None:
    found = _status(harness, key)
    assert found == want, f"job {key} {when}: the system reports {_said(found)}, not {_said(want)}"


def _nothing_claimable(harness: Harness, worker: str, why: str) -> None:
    claim = harness.client.claim(worker, LEASE_US)
    assert claim is None, (
        f"{worker} claimed job {claim.key} as attempt {claim.attempt}; nothing may be"
        f" claimable: {why}"
    )


def a_key_names_one_job_however_often_it_is_submitted(harness: Harness) -> None:
    first = harness.submit("a")
    again = harness.submit("a")
    assert again == first, f"key a submitted twice made two jobs, {first} and {again}"
    _holds(harness, "a", (JobStatus.PENDING, 0), "once submitted")
    never = harness.client.job("never-submitted")
    assert never is None, f"a key never submitted is reported as {never}"
    active = harness.client.active_count()
    assert active == 1, f"one job submitted, {active} reported active"


def a_claim_leases_a_ready_job_and_then_nothing_is_left(harness: Harness) -> None:
    harness.submit("a")
    claim = harness.claim("w1")
    got = (claim.key, claim.attempt, claim.worker_id)
    assert got == ("a", 1, "w1"), f"w1's first claim gave job, attempt, holder {got}"
    assert claim.payload == {"k": "a"}, f"job a's payload came back as {claim.payload}"
    _holds(harness, "a", (JobStatus.LEASED, 1), "once claimed")
    _nothing_claimable(harness, "w2", "the only job is under a live lease")
    _answered(harness.client.succeed(claim), Verdict.SUCCEEDED, "the holder's acknowledgement")
    _holds(harness, "a", (JobStatus.SUCCEEDED, 1), "once acknowledged")
    active = harness.client.active_count()
    assert active == 0, f"every job finished, {active} reported active"


def the_live_holder_acknowledges_once(harness: Harness) -> None:
    harness.submit("a")
    claim = harness.claim()
    _answered(harness.client.succeed(claim), Verdict.SUCCEEDED, "the live holder's acknowledgement")
    _answered(
        harness.client.succeed(claim),
        Verdict.STALE,
        "a second acknowledgement of the same lease",
        " (the lease ended with the first)",
    )


def an_expired_holder_is_refused_and_the_job_goes_to_another(harness: Harness) -> None:
    harness.submit("a")
    first = harness.claim("w1")
    harness.expire()
    second = harness.claim("w2")
    got = (second.key, second.attempt)
    assert got == ("a", 2), f"after w1's lease expired, w2 claimed job, attempt {got}"
    expired = " (w1's lease expired and the job is w2's)"
    _answered(harness.client.succeed(first), Verdict.STALE, "w1's late acknowledgement", expired)
    _answered(harness.client.fail(first, "late"), Verdict.STALE, "w1's late failure", expired)
    _answered(harness.client.succeed(second), Verdict.SUCCEEDED, "w2's acknowledgement")


def an_acknowledgement_at_the_deadline_is_refused(harness: Harness) -> None:
    harness.submit("a")
    claim = harness.claim()
    harness.clock.advance(LEASE_US)
    _answered(
        harness.client.succeed(claim),
        Verdict.STALE,
        "an acknowledgement exactly at the lease's deadline",
        " (a lease is live strictly before its deadline)",
    )


def a_failure_waits_its_delay_then_the_dead_letter_takes_it(harness: Harness) -> None:
    harness.submit("a", max_attempts=2)
    first = harness.claim()
    _answered(harness.client.fail(first, "boom"), Verdict.RETRY, "the first attempt's failure")
    _holds(harness, "a", (JobStatus.PENDING, 1), "after its first attempt failed")
    _nothing_claimable(harness, "w1", "the retry's delay has not passed")
    harness.expire()
    second = harness.claim()
    assert second.attempt == 2, f"the retry was claimed as attempt {second.attempt}, not 2"
    _answered(
        harness.client.fail(second, "boom"), Verdict.DEAD, "the last attempt's failure", " (2 of 2)"
    )
    _holds(harness, "a", (JobStatus.DEAD, 2), "after its last attempt failed")
    harness.expire()
    _nothing_claimable(harness, "w1", "the only job is dead")


def a_reopened_store_keeps_every_job_and_lease(harness: Harness) -> None:
    for key in ("a", "b", "c"):
        harness.submit(key)
    done = harness.claim()
    held = harness.claim(holding=done)
    _answered(harness.client.succeed(done), Verdict.SUCCEEDED, f"job {done.key}'s acknowledgement")
    harness.reopen()
    _holds(harness, done.key, (JobStatus.SUCCEEDED, 1), "acknowledged, once the store reopened")
    _holds(harness, held.key, (JobStatus.LEASED, 1), "under a live lease, once the store reopened")
    _answered(
        harness.client.succeed(held),
        Verdict.SUCCEEDED,
        f"the acknowledgement of job {held.key}'s lease, taken before the reopening",
    )
    last = harness.claim()
    assert last.key not in (done.key, held.key), (
        f"after the reopening the next claim took job {last.key} again, not the third job"
    )


def a_heartbeat_extends_a_live_lease_only(harness: Harness) -> None:
    harness.submit("a")
    claim = harness.claim()
    harness.clock.advance(LEASE_US - 1)
    _answered(harness.client.heartbeat(claim, LEASE_US), True, "a heartbeat of a live lease")
    harness.clock.advance(LEASE_US - 1)  # past the first deadline, within the second
    _answered(
        harness.client.succeed(claim),
        Verdict.SUCCEEDED,
        "an acknowledgement past the claim's deadline but within the heartbeat's",
    )
    _answered(
        harness.client.heartbeat(claim, LEASE_US), False, "a heartbeat of an acknowledged lease"
    )


def batched_claims_and_acknowledgements_are_fenced_one_by_one(harness: Harness) -> None:
    keys = ["a", "b", "c", "d", "e"]
    harness.client.submit_many([JobSpec(key=k, job_type="t", payload={"k": k}) for k in keys])
    old = harness.claim("w1")
    harness.expire()
    first = harness.client.claim_many("w2", LEASE_US, 3)
    rest = harness.client.claim_many("w2", LEASE_US, 3)
    sizes = (len(first), len(rest))
    assert sizes == (3, 2), f"two batched claims of at most 3 from 5 jobs took {sizes}"
    taken = sorted(claim.key for claim in first + rest)
    assert taken == keys, f"the batches took jobs {taken}, not each of {keys} once"
    verdicts = [v.value for v in harness.client.succeed_many([old, *first])]
    want = ["stale"] + ["succeeded"] * 3
    assert verdicts == want, (
        f"a batch of w1's expired lease and w2's three live ones answered {verdicts}, not {want}"
    )
    active = harness.client.active_count()
    assert active == 2, f"two jobs still leased, {active} reported active"


def a_batch_naming_one_job_under_its_old_and_its_live_lease_accepts_the_live_one(
    harness: Harness,
) -> None:
    harness.submit("a")
    old = harness.claim("w1")
    harness.expire()
    live = harness.claim("w1")  # the same worker id, after a restart
    first = [v.value for v in harness.client.succeed_many([old, live])]
    assert first == ["stale", "succeeded"], (
        f"a batch of one job's expired lease, then its live one (same worker id) answered {first}"
    )
    second = [v.value for v in harness.client.succeed_many([live, old])]
    assert second == ["stale", "stale"], (
        f"the same batch again, the job acknowledged, answered {second}; both must be stale"
    )


def a_system_without_heartbeats_says_so_when_asked(harness: Harness) -> None:
    harness.submit("a")
    claim = harness.claim()
    with pytest.raises(OperationUnsupported, match="has no heartbeat"):
        harness.client.heartbeat(claim, LEASE_US)
    assert harness.client.succeed(claim) is Verdict.SUCCEEDED


@dataclass(frozen=True)
class Check:
    name: str
    run: Callable[[Harness], None]
    #: Why the check does not apply to a system with these capabilities (None: it does);
    #: no function: it applies to every system.
    needs: Callable[[Capabilities], str | None] | None = None

    def not_for(self, capabilities: Capabilities) -> str | None:
        """None when the check applies; otherwise why it does not."""
        return None if self.needs is None else self.needs(capabilities)


def _with(capability: str) -> Callable[[Capabilities], str | None]:
    def needs(capabilities: Capabilities) -> str | None:
        declared = capabilities.to_json()[capability]
        return None if declared else f"the system declares no {capability}"

    return needs


def _without_heartbeats(capabilities: Capabilities) -> str | None:
    return "the system has heartbeats" if capabilities.heartbeats else None


CHECKS = tuple(
    Check(function.__name__, function, needs)
    for function, needs in (
        (a_key_names_one_job_however_often_it_is_submitted, None),
        (a_claim_leases_a_ready_job_and_then_nothing_is_left, None),
        (the_live_holder_acknowledges_once, None),
        (an_expired_holder_is_refused_and_the_job_goes_to_another, None),
        (an_acknowledgement_at_the_deadline_is_refused, None),
        (a_failure_waits_its_delay_then_the_dead_letter_takes_it, None),
        (a_reopened_store_keeps_every_job_and_lease, None),
        (a_heartbeat_extends_a_live_lease_only, _with("heartbeats")),
        (batched_claims_and_acknowledgements_are_fenced_one_by_one, _with("batching")),
        (
            a_batch_naming_one_job_under_its_old_and_its_live_lease_accepts_the_live_one,
            _with("batching"),
        ),
        (a_system_without_heartbeats_says_so_when_asked, _without_heartbeats),
    )
)
