"""What every queue must do for the lab: the contract's behaviour, one check per rule.

Each check drives a ``Harness`` and asserts; a check that needs a capability the system
does not declare does not apply to it (``Check.applies``). The project's own contract tests
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


def a_key_names_one_job_however_often_it_is_submitted(harness: Harness) -> None:
    first = harness.submit("a")
    assert harness.submit("a") == first
    assert _status(harness, "a") == (JobStatus.PENDING, 0)
    assert harness.client.job("never-submitted") is None
    assert harness.client.active_count() == 1


def a_claim_leases_a_ready_job_and_then_nothing_is_left(harness: Harness) -> None:
    harness.submit("a")
    claim = harness.claim("w1")
    assert (claim.key, claim.attempt, claim.worker_id) == ("a", 1, "w1")
    assert claim.payload == {"k": "a"}
    assert _status(harness, "a") == (JobStatus.LEASED, 1)
    assert harness.client.claim("w2", LEASE_US) is None
    assert harness.client.succeed(claim) is Verdict.SUCCEEDED
    assert _status(harness, "a") == (JobStatus.SUCCEEDED, 1)
    assert harness.client.active_count() == 0


def the_live_holder_acknowledges_once(harness: Harness) -> None:
    harness.submit("a")
    claim = harness.claim()
    assert harness.client.succeed(claim) is Verdict.SUCCEEDED
    assert harness.client.succeed(claim) is Verdict.STALE


def an_expired_holder_is_refused_and_the_job_goes_to_another(harness: Harness) -> None:
    harness.submit("a")
    first = harness.claim("w1")
    harness.expire()
    second = harness.claim("w2")
    assert second.key == "a"
    assert second.attempt == 2
    assert harness.client.succeed(first) is Verdict.STALE
    assert harness.client.fail(first, "late") is Verdict.STALE
    assert harness.client.succeed(second) is Verdict.SUCCEEDED


def an_acknowledgement_at_the_deadline_is_refused(harness: Harness) -> None:
    harness.submit("a")
    claim = harness.claim()
    harness.clock.advance(LEASE_US)
    assert harness.client.succeed(claim) is Verdict.STALE


def a_failure_waits_its_delay_then_the_dead_letter_takes_it(harness: Harness) -> None:
    harness.submit("a", max_attempts=2)
    first = harness.claim()
    assert harness.client.fail(first, "boom") is Verdict.RETRY
    assert _status(harness, "a") == (JobStatus.PENDING, 1)
    assert harness.client.claim("w1", LEASE_US) is None  # the retry is not due yet
    harness.expire()
    second = harness.claim()
    assert second.attempt == 2
    assert harness.client.fail(second, "boom") is Verdict.DEAD
    assert _status(harness, "a") == (JobStatus.DEAD, 2)
    harness.expire()
    assert harness.client.claim("w1", LEASE_US) is None


def a_reopened_store_keeps_every_job_and_lease(harness: Harness) -> None:
    for key in ("a", "b", "c"):
        harness.submit(key)
    done, held = harness.claim(), harness.claim()
    assert harness.client.succeed(done) is Verdict.SUCCEEDED
    harness.reopen()
    assert _status(harness, done.key) == (JobStatus.SUCCEEDED, 1)
    assert _status(harness, held.key) == (JobStatus.LEASED, 1)
    assert harness.client.succeed(held) is Verdict.SUCCEEDED
    assert harness.claim().key not in (done.key, held.key)


def a_heartbeat_extends_a_live_lease_only(harness: Harness) -> None:
    harness.submit("a")
    claim = harness.claim()
    harness.clock.advance(LEASE_US - 1)
    assert harness.client.heartbeat(claim, LEASE_US) is True
    harness.clock.advance(LEASE_US - 1)  # past the first deadline, within the second
    assert harness.client.succeed(claim) is Verdict.SUCCEEDED
    assert harness.client.heartbeat(claim, LEASE_US) is False


def batched_claims_and_acknowledgements_are_fenced_one_by_one(harness: Harness) -> None:
    keys = ["a", "b", "c", "d", "e"]
    harness.client.submit_many([JobSpec(key=k, job_type="t", payload={"k": k}) for k in keys])
    old = harness.claim("w1")
    harness.expire()
    first = harness.client.claim_many("w2", LEASE_US, 3)
    rest = harness.client.claim_many("w2", LEASE_US, 3)
    assert (len(first), len(rest)) == (3, 2)
    assert {claim.key for claim in first + rest} == set(keys)
    verdicts = harness.client.succeed_many([old, *first])
    assert verdicts == [Verdict.STALE] + [Verdict.SUCCEEDED] * 3
    assert harness.client.active_count() == 2


def a_batch_naming_one_job_under_its_old_and_its_live_lease_accepts_the_live_one(
    harness: Harness,
) -> None:
    harness.submit("a")
    old = harness.claim("w1")
    harness.expire()
    live = harness.claim("w1")  # the same worker id, after a restart
    assert harness.client.succeed_many([old, live]) == [Verdict.STALE, Verdict.SUCCEEDED]
    assert harness.client.succeed_many([live, old]) == [Verdict.STALE, Verdict.STALE]


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
