"""What the adapters of third-party queues share: crash points at the library's boundary,
one job at a time, and a reader's findings in the lab's words.

``X:before`` is reached before the library is called, ``X:after`` once the call returned
(its transaction committed). No change to a third-party queue is needed to kill a process
there.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from crashqueuelab.systems.contract import (
    Capabilities,
    Claim,
    Hook,
    JobStatus,
    StoredJob,
    StoreReading,
    Verdict,
)
from crashqueuelab.systems.crashpoints import (
    CrashPoint,
    ExpectedState,
)

T = TypeVar("T")


def around(hook: Hook | None, name: str, call: Callable[[], T]) -> T:
    """Call ``call`` between the hook's ``name:before`` and ``name:after`` points."""
    if hook is not None:
        hook(f"{name}:before")
    result = call()
    if hook is not None:
        hook(f"{name}:after")
    return result


def boundary_point(
    library: str,
    name: str,
    effect: tuple[str, int] | None,
    flaky: tuple[str, int] | None,
    effects: int,
    facts: Mapping[str, Any] | None = None,
) -> CrashPoint:
    """A crash point around one of ``library``'s calls (or inside the work), with the state
    of the workload's two jobs and the effects it must leave, and the facts its reader
    reports beside the jobs (the same at every point of a library whose reader has some)."""
    expected = ExpectedState(effect, flaky, effects, dict(facts or {}))
    return CrashPoint(name, f"around {library}'s {name}", expected)


def library_capabilities(*, heartbeats: bool) -> Capabilities:
    """A library driven one job at a time, by worker processes sharing its store, with no
    token of its own."""
    return Capabilities(
        fencing_tokens=False,
        heartbeats=heartbeats,
        several_processes=True,
        batching=False,
        single_owner=False,
        checkpoint=False,
    )


def library_reading(
    *,
    exists: bool,
    jobs: Mapping[str, tuple[str, int]],
    problems: Sequence[str],
    statuses: Mapping[str, JobStatus],
    judge: str,
    facts: Mapping[str, Any] | None = None,
) -> StoreReading:
    """A reader's findings (each job's native state and attempts) in the lab's words; a
    state the reader knows and the lab does not count is pending."""
    return StoreReading(
        exists=exists,
        jobs={
            key: StoredJob(state, statuses.get(state, JobStatus.PENDING), attempts)
            for key, (state, attempts) in jobs.items()
        },
        facts=dict(facts or {}),
        ok=not problems,
        problems=tuple(problems),
        judge=judge,
    )


class OneAtATime(ABC):
    """``claim_many`` and ``succeed_many`` for a library without batches: one call each."""

    @abstractmethod
    def claim(self, worker_id: str, lease_us: int) -> Claim | None: ...

    @abstractmethod
    def succeed(self, claim: Claim) -> Verdict: ...

    def claim_many(self, worker_id: str, lease_us: int, limit: int) -> list[Claim]:
        claim = self.claim(worker_id, lease_us)
        return [] if claim is None else [claim]

    def succeed_many(self, claims: Sequence[Claim]) -> list[Verdict]:
        return [self.succeed(claim) for claim in claims]
