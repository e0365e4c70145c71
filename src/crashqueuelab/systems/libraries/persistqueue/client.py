"""persist-queue's client: the lab's calls, made as its documentation shows.

The adapter drives persist-queue as its documentation shows, and adds only what the
contract needs and a user would add: items are JSON objects carrying the job's key, type,
payload and an attempt counter; idempotent submission checks the stored keys first; a
failure past ``max_attempts`` is ``ack_failed`` (the dead letter).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import persistqueue
from persistqueue.serializers import json as json_serializer

from crashqueuelab.core.errors import OperationUnsupported
from crashqueuelab.systems.boundary import around
from crashqueuelab.systems.contract import Claim, JobSpec, JobStatus, JobView, OpenRequest, Verdict
from crashqueuelab.systems.libraries.skeleton import LibraryClient, tokenless_claim

#: Where an item stands (persist-queue's status names), in the lab's words.
STATUS = {
    "inited": JobStatus.PENDING,
    "ready": JobStatus.PENDING,
    "unack": JobStatus.LEASED,
    "acked": JobStatus.SUCCEEDED,
    "ack_failed": JobStatus.DEAD,
}
_NAMES = {0: "inited", 1: "ready", 2: "unack", 5: "acked", 9: "ack_failed"}


class PersistQueueClient(LibraryClient):
    """``QueueClient`` over one ``SQLiteAckQueue`` directory."""

    def __init__(self, request: OpenRequest) -> None:
        request.directory.mkdir(parents=True, exist_ok=True)
        self.hook = request.hook
        # auto_resume: every unacknowledged task becomes ready again, as at any restart.
        self.queue = persistqueue.SQLiteAckQueue(
            str(request.directory), auto_resume=True, serializer=json_serializer
        )

    def _rows(self) -> list[dict[str, Any]]:
        return list(self.queue.queue())

    def _row(self, key: str) -> dict[str, Any] | None:
        return next((row for row in self._rows() if row["data"]["key"] == key), None)

    def submit_many(self, jobs: Sequence[JobSpec]) -> list[str]:
        known = {row["data"]["key"]: str(row["id"]) for row in self._rows()}
        ids = []
        for job in jobs:
            if job.key not in known:
                item = {
                    "key": job.key,
                    "job_type": job.job_type,
                    "payload": job.payload,
                    "max_attempts": job.max_attempts,
                    "attempts": 0,
                }
                put = partial(self.queue.put, item)
                known[job.key] = str(around(self.hook, "submit", put))
            ids.append(known[job.key])
        return ids

    def claim(self, worker_id: str, lease_us: int) -> Claim | None:
        def take() -> dict[str, Any] | None:
            try:
                raw: dict[str, Any] = self.queue.get(block=False, raw=True)
            except persistqueue.Empty:
                return None
            # persist-queue counts no attempts: the item carries its own counter.
            item = dict(raw["data"], attempts=raw["data"]["attempts"] + 1)
            self.queue.update(item, id=raw["pqid"])
            return {"pqid": raw["pqid"], "data": item}

        taken = around(self.hook, "claim", take)
        if taken is None:
            return None
        item, pqid = taken["data"], taken["pqid"]
        return tokenless_claim(
            job_id=str(pqid),
            key=item["key"],
            job_type=item["job_type"],
            payload=item["payload"],
            attempt=item["attempts"],
            worker_id=worker_id,
        )

    def heartbeat(self, claim: Claim, lease_us: int) -> bool:
        raise OperationUnsupported("persist-queue", "heartbeat")

    def succeed(self, claim: Claim) -> Verdict:
        acked = around(self.hook, "ack", lambda: self.queue.ack(id=int(claim.job_id)))
        return Verdict.STALE if acked is None else Verdict.SUCCEEDED

    def fail(self, claim: Claim, error: str) -> Verdict:
        row = self._row(claim.key)
        dead = row is not None and row["data"]["attempts"] >= row["data"]["max_attempts"]
        mark = self.queue.ack_failed if dead else self.queue.nack
        if around(self.hook, "fail", lambda: mark(id=int(claim.job_id))) is None:
            return Verdict.STALE
        return Verdict.DEAD if dead else Verdict.RETRY

    def recover(self) -> int:
        # No expiry exists: unacknowledged tasks return only when a process opens the queue.
        return 0

    def job(self, key: str) -> JobView | None:
        row = self._row(key)
        if row is None:
            return None
        name = _NAMES[int(row["status"])]
        return JobView(key, STATUS[name], int(row["data"]["attempts"]), name)

    def active_count(self) -> int:
        return sum(1 for row in self._rows() if int(row["status"]) < 5)

    def close(self) -> None:
        self.queue.close()
        # persist-queue's __del__ closes its connections again, from whichever thread the
        # garbage collector runs in, and sqlite3 refuses a close from another thread even
        # for a closed connection: an error at some random later moment. Closed is closed.
        self.queue._getter = None
        self.queue._putter = None
