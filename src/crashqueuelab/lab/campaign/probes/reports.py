"""The probe of what a system says about a job (its view, its attempts, the unfinished count):
each must be what the job's holders were told."""

from __future__ import annotations

from crashqueuelab.judges.findings import Kind
from crashqueuelab.lab.campaign.probes.harness import ProbeFailed, _accepted, _Bench
from crashqueuelab.lab.workloads.scenario import LEASE_US
from crashqueuelab.systems.contract import AttemptsClient, Claim, Verdict


def _reports(bench: _Bench, key: str, status: str, attempts: int, active: int) -> None:
    view, counted = bench.client.job(key), bench.client.active_count()
    found = None if view is None else (view.status, view.attempts)
    if found != (status, attempts) or counted != active:
        raise ProbeFailed(
            Kind.REPORT_DIFFERS,
            f"job {key}: the system reports it {found} with {counted} unfinished jobs; its"
            f" holders were told ({status!r}, {attempts}) with {active} unfinished",
            job=key,
            about="status",
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
            Kind.REPORT_DIFFERS,
            f"job {key}: the system reports {len(reported)} attempts; its holders were granted"
            f" {len(expected)}",
            job=key,
            about="attempts",
        )
    differences = [
        f"attempt {want['attempt']} (lease {want['token']}): {name} reported {got[name]},"
        f" told {want[name]}"
        for got, want in zip(reported, expected, strict=True)
        for name in want
        if got[name] != want[name]
    ]
    if differences:
        raise ProbeFailed(
            Kind.REPORT_DIFFERS, f"job {key}: {'; '.join(differences)}", job=key, about="attempts"
        )


def self_reports_match_what_holders_were_told(bench: _Bench) -> str:
    """What the system says about a job (its view, its attempts, the count of unfinished
    jobs) after a heartbeat that extends the lease, one that shortens it, a failure, a retry
    and a success: each must be what the job's holders were told."""
    bench.job("reported")
    first = bench.claim("worker-a", "reported")
    bench.clock.advance(LEASE_US // 4)
    for lease in (LEASE_US, LEASE_US // 10):  # the second heartbeat shortens the lease
        if not bench.client.heartbeat(first, lease):
            raise ProbeFailed(
                Kind.LIVE_HEARTBEAT_REFUSED,
                "job reported: the live holder's heartbeat was refused",
                job="reported",
            )
        deadline = bench.clock.now_us() + lease
    _reports(bench, "reported", "leased", 1, 1)
    _reports_attempts(bench, "reported", [(first, deadline, None)])
    if bench.client.fail(first, "probe failure") is not Verdict.RETRY:
        raise ProbeFailed(
            Kind.LIVE_REPORT_ANSWERED_WRONG,
            "job reported: a failure of attempt 1 of 3 was not retried",
            job="reported",
            attempt=first.attempt,
        )
    bench.expire()
    second = bench.claim("worker-b", "reported")
    told = [(first, deadline, "failed"), (second, bench.clock.now_us() + LEASE_US, None)]
    _reports(bench, "reported", "leased", 2, 1)
    _reports_attempts(bench, "reported", told)
    _accepted(bench.client.succeed(second), second, "the acknowledgement")
    _reports(bench, "reported", "succeeded", 2, 0)
    _reports_attempts(bench, "reported", [told[0], (second, told[1][1], "succeeded")])
    return "the job, its attempts and the unfinished count read as the holders were told"
