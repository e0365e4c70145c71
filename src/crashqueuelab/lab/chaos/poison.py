"""Poison jobs: a few jobs of every chaos run whose every attempt dies or fails.

A queue must bury such a job in its dead letter after exactly its attempt limit: one that
never gives up on it, or that gives back the attempt each time a lease expires, keeps it
alive for ever; one that buries it early loses a job that had attempts left. Half the poison
jobs kill the worker that runs them (``SIGKILL`` to itself, as a crashing handler would:
the lease is left to expire), half report a failure through ``fail``. Each has a small
limit, so the run sees several of its attempts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from crashqueuelab.judges.findings import Anomaly, Kind
from crashqueuelab.systems.contract import JobSpec, JobStatus, StoredJob

#: Poison jobs in a chaos run unless told otherwise.
DEFAULT_POISON_JOBS = 4
DIE = "die"
FAIL = "fail"


@dataclass(frozen=True)
class PoisonJob:
    key: str
    behaviour: str
    max_attempts: int

    def spec(self) -> JobSpec:
        return JobSpec(
            key=self.key,
            job_type="synthetic.poison",
            payload={"effect_key": self.key, "value": -1, "poison": self.behaviour},
            max_attempts=self.max_attempts,
        )


def poison_jobs(count: int) -> list[PoisonJob]:
    """``count`` poison jobs, dying and failing in turn, with limits of 2 and 3 attempts."""
    return [
        PoisonJob(f"poison-{index:04d}", DIE if index % 2 == 0 else FAIL, 2 + (index // 2) % 2)
        for index in range(count)
    ]


def behaviour(payload: dict[str, Any]) -> str | None:
    """How a claimed job's handler must end: ``die``, ``fail``, or None (a normal job)."""
    value = payload.get("poison")
    return value if value in (DIE, FAIL) else None


def judge_poison(jobs: list[PoisonJob], stored: Mapping[str, StoredJob]) -> list[Anomaly]:
    """One finding per poison job not dead-lettered after exactly its attempt limit (each
    with the fact ``poison``, and how its attempts end: ``behaviour``)."""
    anomalies = []
    for job in jobs:
        found = stored.get(job.key)
        limit = f"its limit is {job.max_attempts} attempts"
        if found is None:
            anomalies.append(_finding(job, found, Kind.LOST, "missing from the store (lost)"))
        elif found.status is JobStatus.SUCCEEDED:
            every = "died" if job.behaviour == DIE else "failed"
            text = f"{found.native_state}, though every attempt of it {every}"
            anomalies.append(_finding(job, found, Kind.POISON_SUCCEEDED, text))
        elif found.status is not JobStatus.DEAD:
            text = (
                f"still {found.native_state} after the run, never dead-lettered"
                f" ({found.attempts} attempts; {limit})"
            )
            anomalies.append(_finding(job, found, Kind.UNFINISHED, text))
        elif found.attempts != job.max_attempts:
            text = f"dead-lettered after {found.attempts} attempts; {limit}"
            anomalies.append(_finding(job, found, Kind.DEAD_LETTERED_OFF_ITS_LIMIT, text))
    return anomalies


def _finding(job: PoisonJob, found: StoredJob | None, kind: Kind, text: str) -> Anomaly:
    # Attempts left: the run ended before the job used them all (its turn never came).
    state: dict[str, str | bool] = (
        {}
        if found is None
        else {"state": found.native_state, "attempts_left": found.attempts < job.max_attempts}
    )
    return Anomaly(
        kind,
        f"job {job.key} (poison): {text}",
        job=job.key,
        attempt=None if found is None else found.attempts,
        limit=job.max_attempts,
        facts={"poison": True, "behaviour": job.behaviour, **state},
    )
