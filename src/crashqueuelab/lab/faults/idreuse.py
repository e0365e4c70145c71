"""A crash child whose server crashes as its COMMIT is on the way, and hands the
transaction's id to another session before the queue asks.

For an id-reused crash point (``systems.contract.id_reused_phases``) the run's server is one
the child may crash (``CRASHABLE_VARIABLE`` names its directory; the campaign starts it for
these points alone and runs them one at a time). At the transition's BEFORE phase (inside
the transaction, after the queue named it, every statement answered) the child reads its
own transaction's id from ``pg_stat_activity``, crashes the server (``pg_ctl stop -m
immediate``: nothing of the transaction is durable, its COMMIT not yet sent), starts it
again, and takes transaction ids on a session of its own, each committed at once, up to
that id. After a crash the server hands out again the ids whose WAL it never flushed, so
the queue's id is then another transaction's, committed. The hook returns, the queue's
COMMIT meets a closed connection, and the queue, which cannot tell whether the COMMIT
arrived, asks; ``pg_xact_status`` answers for the other transaction.

The child dies at the AFTER phase (with other last words, so that the case fails, if the
server did not hand the id out again). What it saw goes into ``EVIDENCE_FILE`` beside the
last words.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from crashqueuelab.lab.faults.children import die_with_last_words
from crashqueuelab.servers.postgres import CRASHABLE_VARIABLE, DSN_VARIABLE, ThrowawayServer
from crashqueuelab.systems.crashpoints import (
    id_reused_phases,
)

EVIDENCE_FILE = "id-reuse.json"
#: The most ids taken after the restart before giving up (the gap is a handful).
MAX_IDS = 10_000

OWN_XID = (
    "SELECT backend_xid::text FROM pg_stat_activity"
    " WHERE application_name = %s AND backend_xid IS NOT NULL"
)


def crash_and_hand_out(dsn: str, root: Path, name: str) -> dict[str, Any]:
    """Crash the server in ``root`` under the open transaction of the session ``name``,
    start it again, and commit transactions until one has that transaction's id (the
    server's first epoch: ids are 32 bits there). What happened, as evidence."""
    import psycopg  # the postgres extra: a child of another system never gets here

    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        row = conn.execute(OWN_XID, (name,)).fetchone()
    if row is None:
        return {"error": f"no open transaction of {name} on the server"}
    wanted = int(row[0])
    ThrowawayServer.running_at(root).restart_after_crash()
    taken: list[int] = []
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        while len(taken) < MAX_IDS and (not taken or taken[-1] < wanted):
            got = conn.execute("SELECT pg_current_xact_id()::text").fetchone()
            assert got is not None
            taken.append(int(got[0]))
    return {
        "queue_xid": wanted,
        "first_xid_after_restart": taken[0] if taken else None,
        "xids_taken": len(taken),
        "reused": wanted in taken,
    }


@contextmanager
def id_reused_at(point: str, last_words: str | None) -> Iterator[Callable[[str], None]]:
    """The hook of a child at id-reused ``point``."""
    phases = id_reused_phases(point)
    if phases is None:
        raise ValueError(f"{point} is not an id-reused crash point")
    before, after = phases
    dsn = os.environ.get(DSN_VARIABLE)
    root = os.environ.get(CRASHABLE_VARIABLE)
    if not dsn or not root:
        raise RuntimeError(
            f"{point}: an id-reused point needs a server it may crash"
            f" ({DSN_VARIABLE}, {CRASHABLE_VARIABLE})"
        )
    seen: dict[str, Any] = {}

    def hook(phase: str) -> None:
        if phase == before and not seen:
            from crashqueuelab.systems.postgres import session_name

            seen.update(crash_and_hand_out(dsn, Path(root), session_name(os.getpid())))
        elif phase == after and seen:
            if last_words is not None:
                evidence = Path(last_words).parent / EVIDENCE_FILE
                evidence.write_text(json.dumps(seen, sort_keys=True))
            if seen.get("reused"):
                words = point
            else:
                words = f"{point}: the restarted server did not hand the id out again ({seen})"
            die_with_last_words(words, last_words)

    yield hook
