"""What a chaos run knows of its workers while it runs: their logs, read as they grow.

The run never opens the store while it runs (a single owner would refuse it), so how much
is done and which worker holds which lease come from the workers' logs (``worklog.py``).
"""

from __future__ import annotations

from collections.abc import Iterable

from crashqueuelab.lab.chaos.worklog import LogFollower


class Watcher(LogFollower):
    """What the workers' logs say: how much is done, and who holds what."""

    def finished(self) -> int:
        """Jobs whose acknowledgement a worker heard accepted."""
        return len(self.acknowledged)

    def progressed(self) -> int:
        """Jobs whose acknowledgement was accepted or sent: what the faults' progress marks
        count. A job acknowledged by a worker killed before it could log the answer is done
        in the store yet absent from ``finished``; counted here, the marks stay reachable
        until the work ends (a refused acknowledgement's job is done later under the same
        key, so nothing counts twice)."""
        return len(self.acknowledged | self.sent)

    def refused_unfinished(self) -> set[str]:
        """Keys whose every acknowledgement sent was refused as stale and none accepted: jobs
        not done, though ``progressed`` counts them (their taker is expected to finish them)."""
        refused: set[str] = set()
        unanswered: set[str] = set()
        for log in self.logs.values():
            stale, accepted = set(log.stale), set(log.acks)
            for key, token in log.acking:
                if (key, token) in stale:
                    refused.add(key)
                elif (key, token) not in accepted:
                    unanswered.add(key)
        return refused - unanswered - self.acknowledged

    def found_no_work(self, worker_ids: Iterable[str]) -> bool:
        """Whether one of these workers found no unfinished job left."""
        return any(
            self.logs[worker_id].idle_at is not None
            for worker_id in worker_ids
            if worker_id in self.logs
        )

    def leases_of(self, worker_id: str) -> set[tuple[str, str]]:
        """(key, lease token) of every lease the worker holds, as far as its log tells."""
        log = self.logs.get(worker_id)
        return set() if log is None else log.held()

    def claimed_by_others(self, worker_id: str, keys: set[str], since: float) -> set[str]:
        """The keys another worker claimed after ``since`` (monotonic seconds)."""
        return {
            key
            for key in keys
            if any(other != worker_id and at > since for other, at in self.claimers.get(key, []))
        }
