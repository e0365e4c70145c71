"""The adapter that puts TinyQueue (``tiny_queue.py``) under crashqueuelab: the walk-through
of docs/systems.md. Run it with ``crashqueuelab campaign --system tiny_adapter:tiny_system``
(with this directory on PYTHONPATH).

Crash points sit at the adapter's boundary: ``X:before`` is reached before the queue is
called, ``X:after`` once its call returned (its transaction committed). That needs no change
to the queue itself, which is how a third-party queue is put under the lab too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import TypeVar

from tiny_queue import TinyQueue

from crashqueuelab.core.errors import OperationUnsupported
from crashqueuelab.systems import (
    Capabilities,
    Claim,
    CrashPoint,
    ExpectedState,
    JobSpec,
    JobStatus,
    JobView,
    OpenRequest,
    System,
    Verdict,
)
from crashqueuelab.systems.boundary import around

T = TypeVar("T")
STATUS = {
    "ready": JobStatus.PENDING,
    "leased": JobStatus.LEASED,
    "done": JobStatus.SUCCEEDED,
    "dead": JobStatus.DEAD,
}


class TinyClient:
    def __init__(self, request: OpenRequest, queue_class: type[TinyQueue] = TinyQueue) -> None:
        request.directory.mkdir(parents=True, exist_ok=True)
        self.queue = queue_class(request.directory / "tiny.sqlite")
        self.clock, self.retry = request.clock, request.retry
        self.hook = request.hook

    def _call(self, name: str, call: Callable[..., T], *args: object) -> T:
        # The lab's helper for queues that call no hook: name:before, the call, name:after.
        return around(self.hook, name, partial(call, *args))

    def submit(self, job: JobSpec) -> str:
        args = (job.key, job.job_type, job.payload, job.max_attempts)
        self._call("submit", self.queue.submit, *args)
        return job.key

    def submit_many(self, jobs: Sequence[JobSpec]) -> list[str]:
        return [self.submit(job) for job in jobs]

    def claim(self, worker_id: str, lease_us: int) -> Claim | None:
        now = self.clock.now_us()
        row = self._call("claim", self.queue.claim, worker_id, now, lease_us)
        if row is None:
            return None
        return Claim(
            job_id=row["key"], key=row["key"], job_type=row["job_type"], payload=row["payload"],
            attempt=row["attempts"], worker_id=worker_id, token=row["token"],
        )  # fmt: skip

    def claim_many(self, worker_id: str, lease_us: int, limit: int) -> list[Claim]:
        claim = self.claim(worker_id, lease_us)
        return [] if claim is None else [claim]

    def heartbeat(self, claim: Claim, lease_us: int) -> bool:
        raise OperationUnsupported("TinyQueue", "heartbeat")

    def succeed(self, claim: Claim) -> Verdict:
        done = self._call("ack", self.queue.ack, claim.key, claim.token, self.clock.now_us())
        return Verdict.SUCCEEDED if done else Verdict.STALE

    def succeed_many(self, claims: Sequence[Claim]) -> list[Verdict]:
        return [self.succeed(claim) for claim in claims]

    def fail(self, claim: Claim, error: str) -> Verdict:
        delay = self.retry.delay_us(claim.attempt)
        args = (claim.key, claim.token, self.clock.now_us(), delay)
        if not self._call("fail", self.queue.nack, *args):
            return Verdict.STALE
        return Verdict.DEAD if self.queue.get(claim.key)["state"] == "dead" else Verdict.RETRY

    def recover(self) -> int:
        return int(self._call("recover", self.queue.expire, self.clock.now_us()))

    def checkpoint(self) -> None:
        return None

    def job(self, key: str) -> JobView | None:
        try:
            row = self.queue.get(key)
        except KeyError:
            return None
        return JobView(key, STATUS[row["state"]], row["attempts"], row["state"])

    def active_count(self) -> int:
        return self.queue.unfinished()

    def close(self) -> None:
        self.queue.close()


def point(name: str, effect: tuple[str, int] | None, flaky: tuple[str, int] | None,
          effects: int) -> CrashPoint:  # fmt: skip
    return CrashPoint(name, f"TinyQueue at {name}", ExpectedState(effect, flaky, effects))


# The durable state after each point's first occurrence in the lab's workload (submit both
# jobs; run the effect job; fail the flaky job once; recover; ...), as TinyQueue names it.
READY, LEASED, DONE = ("ready", 0), ("leased", 1), ("done", 1)
CRASH_POINTS = (
    point("submit:before", None, None, 0),
    point("submit:after", READY, None, 0),
    point("claim:before", READY, READY, 0),
    point("claim:after", LEASED, READY, 0),
    point("BEFORE_EFFECT_COMMIT", LEASED, READY, 0),
    point("AFTER_EFFECT_COMMIT", LEASED, READY, 1),
    point("ack:before", LEASED, READY, 1),
    point("ack:after", DONE, READY, 1),
    point("fail:before", DONE, ("leased", 1), 1),
    point("fail:after", DONE, ("ready", 1), 1),
    point("recover:before", DONE, ("ready", 1), 1),
    point("recover:after", DONE, ("ready", 1), 1),
)
CAPABILITIES = Capabilities(
    fencing_tokens=True, heartbeats=False, several_processes=True,
    batching=False, single_owner=False, checkpoint=False,
)  # fmt: skip


def tiny_system() -> System:
    return System(
        name="tinyqueue",
        version="examples/tiny_queue.py",
        durability="SQLite WAL, synchronous=FULL",
        capabilities=CAPABILITIES,
        crash_points=CRASH_POINTS,
        open=TinyClient,
    )
