"""What each library documents of a deploy sorts the deploy's findings: a loss its shutdown
documentation states is a documented weakness, any other a broken promise."""

from __future__ import annotations

import pytest

from crashqueuelab.judges.findings import Anomaly, Kind
from crashqueuelab.lab.runs.promises import classify
from crashqueuelab.systems import resolve_system


def _lost(stored: str, last_end: str) -> Anomaly:
    return Anomaly(
        Kind.LOST_IN_DEPLOY,
        f"job job-01: lost: 1 execution(s), none ran to completion (the last: {last_end}),"
        f" and the store holds it {stored}",
        job="job-01",
        facts={"executions": 1, "stored": stored, "last_end": last_end, "signal": "SIGTERM"},
    )


@pytest.mark.parametrize(
    ("system", "documented", "broken"),
    [
        # huey: SIGTERM is an immediate stop, and a dequeued task is in no store.
        ("huey", [("nowhere", "abandoned"), ("nowhere", "killed")], [("pending", "abandoned")]),
        # procrastinate: a killed worker's job stays doing until the user's own recovery.
        ("procrastinate", [("doing", "killed"), ("doing", "abandoned")], [("nowhere", "killed")]),
        # RQ: a job killed in its horse stays started, then fails; a worker that left a job
        # it was stopped with (a warm shutdown) or one never started is no documented loss.
        (
            "rq",
            [("started", "killed"), ("failed", "killed")],
            [("started", "abandoned"), ("queued", "never ran")],
        ),
    ],
)
def test_a_deploys_loss_is_documented_only_as_the_library_states_it(
    system: str, documented: list[tuple[str, str]], broken: list[tuple[str, str]]
) -> None:
    resolved = resolve_system(system)
    findings = [_lost(*case) for case in documented + broken]
    verdict = classify(resolved, "deploys", findings)
    assert verdict["broken_promises"] == [_lost(*case).text for case in broken]
    explained = sum(entry["lines"] for entry in verdict["weaker_as_documented"])
    assert explained == len(documented)
    assert verdict["keeps_its_promises"] is (not broken)


def _on_schedule(kind: Kind) -> Anomaly:
    facts = {"late_ms": 9000, "tolerance_ms": 7000} if kind is Kind.SCHEDULED_LATE else {}
    facts_all: dict[str, str | int | bool] = {"window": "grace", "submitted": "before", **facts}
    return Anomaly(kind, f"job s: {kind.value}", job="s", facts=facts_all)


@pytest.mark.parametrize("system", ["huey", "rq", "procrastinate", "pgqueuer"])
def test_a_scheduled_job_late_is_documented_and_one_early_is_a_broken_promise(system: str) -> None:
    """Every library documents a due time as the earliest, with no latest; none that a job
    may run before it."""
    late, early = _on_schedule(Kind.SCHEDULED_LATE), _on_schedule(Kind.SCHEDULED_EARLY)
    verdict = classify(resolve_system(system), "deploys", [late, early])
    assert verdict["broken_promises"] == [early.text]
    assert sum(entry["lines"] for entry in verdict["weaker_as_documented"]) == 1


def test_rq_documents_a_scheduled_job_left_in_its_registry_by_a_stopped_active_scheduler() -> None:
    def never(stored: str, scheduled: bool) -> Anomaly:
        facts: dict[str, str | int | bool] = {
            "executions": 0,
            "stored": stored,
            "last_end": "never ran",
            "signal": "SIGTERM",
            "scheduled": scheduled,
        }
        return Anomaly(Kind.LOST_IN_DEPLOY, f"job s: lost ({stored})", job="s", facts=facts)

    waiting, queued = never("scheduled", True), never("queued", True)
    verdict = classify(resolve_system("rq"), "deploys", [waiting, queued])
    assert verdict["broken_promises"] == [queued.text]
