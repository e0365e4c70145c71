"""The harness every probe runs in: a system's client on a fresh store and a manual clock,
and how a probe says the system accepted what it must refuse."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from crashqueuelab.core.clock import ManualClock
from crashqueuelab.judges.findings import Anomaly, Fact, Kind
from crashqueuelab.lab.workloads.scenario import LEASE_US, RETRY
from crashqueuelab.systems.contract import Claim, JobSpec, QueueClient, Verdict

#: How far the probe's clock moves after each submission: some libraries hand out a job
#: only strictly after the instant it was enqueued (``eta < now``).
SUBMIT_SETTLE_US = 1_000


class ProbeFailed(Exception):
    """Raised inside a probe when the system did what it must not: its message is the
    probe's detail, ``finding`` what happened as data."""

    def __init__(
        self,
        kind: Kind,
        text: str,
        *,
        job: str | None = None,
        attempt: int | None = None,
        **facts: Fact,
    ) -> None:
        super().__init__(text)
        self.finding = Anomaly(kind, text, job=job, attempt=attempt, facts=facts)


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
        self.settle()
        return spec

    def settle(self) -> None:
        """Let the time a submission needs before its job is due pass."""
        self.clock.advance(SUBMIT_SETTLE_US)

    def claim(self, worker_id: str, key: str) -> Claim:
        claim = self.client.claim(worker_id, LEASE_US)
        if claim is None or claim.key != key:
            offered = "nothing" if claim is None else f"job {claim.key}"
            raise ProbeFailed(
                Kind.CLAIM_NOT_OFFERED,
                f"job {key}: {worker_id} should claim it now; the queue offered {offered}",
                job=key,
                offered="nothing" if claim is None else "another job",
                worker=worker_id,
            )
        return claim

    def expire(self) -> None:
        """Let every lease run out, and any retry come due; the system notices each."""
        self.clock.advance(LEASE_US)
        self.client.recover()
        self.clock.advance(RETRY.max_delay_us)
        self.client.recover()


def _refused(verdict: Verdict | bool, claim: Claim, what: str, kind: Kind) -> None:
    """``what`` (of ``kind`` when accepted) must have been refused."""
    if verdict not in (Verdict.STALE, False):
        raise ProbeFailed(
            kind,
            f"job {claim.key}: {what} by {claim.worker_id} (lease {claim.token}, attempt "
            f"{claim.attempt}) was accepted ({verdict}); it must be refused",
            job=claim.key,
            attempt=claim.attempt,
            worker=claim.worker_id,
            answered=str(verdict),
        )


def _accepted(verdict: Verdict, claim: Claim, what: str) -> None:
    if verdict is not Verdict.SUCCEEDED:
        raise ProbeFailed(
            Kind.LIVE_REPORT_ANSWERED_WRONG,
            f"job {claim.key}: {what} by the live holder answered {verdict}",
            job=claim.key,
            attempt=claim.attempt,
            answered=str(verdict),
        )
