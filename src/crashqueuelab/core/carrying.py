"""A queue's side of group commit: a waiting writer's single claim or acknowledgement
carried by the commit of the writer ahead of it.

The writer being served runs the requests posted behind it (``_carry``), each in a
savepoint of its own transaction; a writer waiting in line learns from ``_enter`` whether
its request was carried, and with what result; one whose carrier vanished finds out,
holding the write lock, whether that carrier's transaction committed it (``_reclaim``). The
requests' encoding is groupcommit.py's, the slots they travel in requestslots.py's, the
line they wait in turns.py's.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from crashqueuelab.core import groupcommit
from crashqueuelab.core.errors import JobNotFound, StaleLease
from crashqueuelab.core.leases import LeaseTransitions
from crashqueuelab.core.models import ClaimedJob, EventType
from crashqueuelab.core.storage import write_transaction
from crashqueuelab.core.turns import Carried, Served


class GroupCommits(LeaseTransitions):
    """Transactions that carry the writers waiting behind them, and the counts of it."""

    # Set by DurableQueue.__init__.
    _shared: groupcommit.SharedCommits

    if TYPE_CHECKING:
        # DurableQueue's, in queue.py (whose docstring says why it stays there).
        def _lease_next(
            self, worker: str, lease: int, now: int, token: str
        ) -> ClaimedJob | None: ...

    def _transaction(
        self, served: Served | None = None
    ) -> AbstractContextManager[sqlite3.Connection]:
        return write_transaction(
            self.connection,
            timeout_ms=self._timeout_ms,
            turns=self._turns,
            served=served,
            carrier=self._carry,
            shared=self._shared,
        )

    def _enter(self, request: Callable[[], bytes]) -> Served | Carried:
        _ = self.connection  # a closed queue, or one opened in another process, is refused first
        entry = self._turns.enter(request, timeout_s=self._timeout_ms / 1000)
        if isinstance(entry, Carried):
            self._shared.carried_by_others += 1
        return entry

    def _count_vanished(self, noted: bytes | None, *, applied: bool) -> None:
        if noted is None:
            return
        if applied:
            self._shared.carrier_vanished_applied += 1
        else:
            self._shared.carrier_vanished_rerun += 1

    @property
    def shared_commits(self) -> groupcommit.SharedCommits:
        """A copy of the group-commit counts of this handle since it opened."""
        return dataclasses.replace(self._shared)

    def _carry(self, taken: list[tuple[int, bytes]]) -> list[bytes | None]:
        """Run the requests of the writers behind this one, in this transaction.

        After the first one given back, the rest are given back too, unrun: the line can
        then move past exactly the run of carried writers right behind this turn.
        """
        results: list[bytes | None] = []
        for _, request in taken:
            results.append(None if None in results else self._run_carried(request))
        return results

    def _run_carried(self, request: bytes) -> bytes | None:
        """One waiting writer's request, inside a savepoint: its result, or None (and
        nothing written) when it is given back to its writer."""
        decoded = groupcommit.decode_request(request)
        if decoded is None:
            return None
        conn = self.connection
        conn.execute("SAVEPOINT carried")
        try:
            result = self._carried_transitions(decoded)
        except (StaleLease, JobNotFound):
            result = None  # the writer's own call explains it
        if result is None:
            conn.execute("ROLLBACK TO carried")
        conn.execute("RELEASE carried")
        return result

    def _carried_transitions(self, request: groupcommit.Request) -> bytes | None:
        """The transitions of ``request``, as its writer's own call would run them; a
        claimed row too large for the result slot is given back (None)."""
        if isinstance(request, groupcommit.SuccessRequest):
            self._succeed_live_lease(
                request.job_id, request.worker_id, request.lease_token, request.now_us
            )
            return groupcommit.APPLIED
        if isinstance(request, groupcommit.ChainRequest):
            self._succeed_live_lease(
                request.job_id, request.worker_id, request.lease_token, request.now_us
            )
            token = request.next_token
        else:
            token = request.lease_token
        claimed = self._lease_next(request.worker_id, request.lease_us, request.now_us, token)
        return groupcommit.encode_claim(claimed)

    def _reclaim(self, served: Served | None) -> bytes | None:
        """What a vanished carrier noted for this writer's request (None: no carrier took
        it). Called holding the write lock, so the carrier's transaction has ended."""
        if served is None or not served.taken:
            return None
        return self._turns.reclaim(served.ticket, timeout_s=self._timeout_ms / 1000)

    def _claim_committed(self, noted: bytes, token: str) -> ClaimedJob | None:
        """The claim a vanished carrier noted, if its transaction committed it."""
        claimed = groupcommit.decode_claim(noted, token) if noted else None
        if claimed is None:
            return None
        row = self.connection.execute(
            "SELECT 1 FROM events WHERE job_id = ? AND lease_token = ? AND event_type = ?",
            (claimed.job.job_id, token, EventType.CLAIMED.value),
        ).fetchone()
        return claimed if row is not None else None

    def _committed_by_carrier(self, noted: bytes | None, job_id: str, lease_token: str) -> bool:
        """Whether a vanished carrier committed this writer's acknowledgement: it ran it
        (noted a result: a slot taken and never run reads as empty) and the attempt holding
        ``lease_token`` has ended in success. It ran, so the lease was live then, and that
        success can only be this request's own, never an earlier acknowledgement's."""
        return bool(noted) and self._succeeded_by(job_id, lease_token)

    def _succeeded_by(self, job_id: str, lease_token: str) -> bool:
        """Whether the attempt holding ``lease_token`` already ended in success (as a
        vanished carrier of this acknowledgement may have committed)."""
        row = self.connection.execute(
            "SELECT 1 FROM events WHERE job_id = ? AND lease_token = ? AND event_type = ?",
            (job_id, lease_token, EventType.SUCCEEDED.value),
        ).fetchone()
        return row is not None
