"""Probes of a job's life from its submission to its end: one key makes one job, a last
attempt (failed or expired) reaches the dead letter, and retry delays stay under their cap."""

from __future__ import annotations

from crashqueuelab.judges.findings import Kind
from crashqueuelab.lab.campaign.probes.harness import ProbeFailed, _accepted, _Bench
from crashqueuelab.lab.workloads.scenario import LEASE_US, RETRY
from crashqueuelab.systems.contract import JobSpec, Verdict


def idempotent_submit(bench: _Bench) -> str:
    spec = JobSpec(key="twice", job_type="probe", payload={"n": 1})
    first, second = bench.client.submit(spec), bench.client.submit(spec)
    bench.settle()
    if first != second:
        raise ProbeFailed(
            Kind.KEY_GAVE_TWO_JOBS,
            f"job twice: the same key made two jobs, {first} and {second}",
            job="twice",
        )
    claim = bench.claim("worker-a", "twice")
    _accepted(bench.client.succeed(claim), claim, "the acknowledgement")
    if bench.client.claim("worker-a", LEASE_US) is not None:
        raise ProbeFailed(
            Kind.KEY_GAVE_TWO_JOBS,
            "job twice: a second job was claimable after one submission key",
            job="twice",
        )
    # A producer that retries after the job finished must get the finished job back.
    third = bench.client.submit(spec)
    bench.settle()
    again = bench.client.claim("worker-a", LEASE_US)
    if third != first or again is not None:
        raise ProbeFailed(
            Kind.KEY_GAVE_TWO_JOBS,
            f"job twice: submitted again after it succeeded, the key made job {third}"
            + ("" if again is None else f", claimable as attempt {again.attempt}")
            + f" (the finished job is {first})",
            job="twice",
            after_success=True,
        )
    return "one key, one job: later submissions, also after success, returned the first job"


def attempts_run_out(bench: _Bench) -> str:
    bench.job("last-attempt", max_attempts=1)
    claim = bench.claim("worker-a", "last-attempt")
    verdict = bench.client.fail(claim, "probe failure")
    if verdict is not Verdict.DEAD:
        raise ProbeFailed(
            Kind.LAST_FAILURE_NOT_DEAD,
            f"job last-attempt: a failure of its only attempt answered {verdict}",
            job="last-attempt",
            attempt=claim.attempt,
            answered=str(verdict),
        )
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
            Kind.EXPIRED_LAST_ATTEMPT_NOT_DEAD,
            f"job abandoned: its only attempt expired, yet it is {state}{offered}; a job whose"
            " every holder dies must reach the dead letter",
            job="abandoned",
            attempt=None if again is None else again.attempt,
            status="missing" if view is None else str(view.status),
            state="missing" if view is None else view.native_state,
            handed_out=again is not None,
        )
    return "an expired last attempt sent the job to the dead letter"


def retry_delay_is_capped(bench: _Bench) -> str:
    failures = 6
    bench.job("backoff", max_attempts=failures + 1)
    for attempt in range(failures):
        claim = bench.client.claim("worker-a", LEASE_US)
        if claim is None:
            raise ProbeFailed(
                Kind.RETRY_NOT_READY,
                f"job backoff: not ready {RETRY.max_delay_us} us after its failure {attempt},"
                " the retry policy's longest delay: the backoff grows past its cap",
                job="backoff",
                attempt=attempt + 1,
            )
        bench.client.fail(claim, "probe failure")
        bench.clock.advance(RETRY.max_delay_us)
        bench.client.recover()
    return f"after each of {failures} failures the job was ready within the delay cap"
