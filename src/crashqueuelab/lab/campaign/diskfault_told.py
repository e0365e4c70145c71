"""What a disk-fault case's callers were told, and what that promises of each job: the
answers the workload's calls got (``Told``), the promises they add up to (``obligations``)
and where a store read after a cut falls short of them (``judge``). A promise comes from an
answer that said success only; an error answered promises nothing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from crashqueuelab.judges.findings import Anomaly, Kind, inconsistent
from crashqueuelab.systems.contract import JobSpec, JobStatus, StoredJob, StoreReading, Verdict

#: The workload's two jobs.
JOBS = (JobSpec("job-a", "effect", {"n": 1}), JobSpec("job-b", "effect", {"n": 2}))


@dataclass
class Told:
    """One call and what its caller was told."""

    step: str
    faulted: bool
    value: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict[str, Any]:
        told = {"error": self.error} if self.error is not None else {"value": self.value}
        return {"step": self.step, "faulted": self.faulted, **told}


EXISTS, ATTEMPTED, RELEASED = "exists", "attempted", "released"
TERMINAL = (JobStatus.SUCCEEDED.value, JobStatus.DEAD.value)


def _job_of(step: str) -> str:
    return JOBS[0].key if step.endswith(("-a", JOBS[0].key)) else JOBS[1].key


def obligations(told: Sequence[Told]) -> dict[str, tuple[str, int]]:
    """What the acknowledged answers promise of each job, the last promise standing:
    ``exists``; ``attempted`` n times (a claim of attempt n); ``released`` after n attempts
    (a failure answered ``retry``: no longer leased by attempt n); ``succeeded`` or ``dead``
    (for good: never run again)."""
    promised: dict[str, tuple[str, int]] = {}
    for answer in told:
        if not answer.ok or answer.value is None:
            continue
        value = answer.value
        if isinstance(value, dict) and "claim" in value:
            key, level = value["claim"], (ATTEMPTED, int(value["attempt"]))
        elif answer.step.startswith(("submit", "resubmit")):
            key, level = _job_of(answer.step), (EXISTS, 0)
        elif value in (*TERMINAL, Verdict.RETRY.value):
            key = _job_of(answer.step)
            attempts = promised.get(key, (EXISTS, 0))[1]
            level = (RELEASED if value == Verdict.RETRY.value else str(value), attempts)
        else:
            continue
        standing = promised.get(key)
        if standing is None or (
            standing[0] not in TERMINAL and level[0] != EXISTS and level[1] >= standing[1]
        ):
            promised[key] = level
    return promised


def _short(job: StoredJob | None, status: str, attempts: int) -> bool:
    if job is None:
        return True
    if status in TERMINAL:
        return job.status.value != status
    if status == RELEASED and job.status == JobStatus.LEASED and job.attempts <= attempts:
        return True
    return job.attempts < attempts


def judge(reading: StoreReading, promised: dict[str, tuple[str, int]], where: str) -> list[Anomaly]:
    """Where the store falls short of what its callers were told."""
    found: list[Anomaly] = [inconsistent(problem, f"{where}: ") for problem in reading.problems]
    for key, (status, attempts) in sorted(promised.items()):
        job = reading.jobs.get(key)
        held = "absent" if job is None else f"{job.status.value} after {job.attempts} attempts"
        if _short(job, status, attempts):
            found.append(
                Anomaly(
                    Kind.ACKNOWLEDGED_WORK_LOST,
                    f"{where}: {key}: told {status} (attempts >= {attempts}),"
                    f" the disk holds {held}",
                    job=key,
                    facts={"told": str(status), "held": held, "reading": where},
                )
            )
    return found
