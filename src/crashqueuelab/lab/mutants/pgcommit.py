"""A planted bug of the PostgreSQL system: a transition whose COMMIT was sent and whose
answer was lost is tried again, without asking the server whether the first try committed.

Process deaths, pauses and server restarts do not show it: the answer to a COMMIT is lost
only when the connection breaks in the instant between the server committing and the
client reading its answer. The campaign's reply-lost crash points make that instant: the
retried acknowledgement finds its own earlier commit, is answered stale, and the worker is
told "refused" of an acknowledgement the store holds; the case's child never reaches the
point after the COMMIT.

Resolved by import path (``crashqueuelab.lab.mutants.pgcommit:never_asks_system``); it
needs the ``postgres`` extra, as ``pgfencing`` does.
"""

from __future__ import annotations

import functools
from dataclasses import replace

from crashqueuelab.postgres.queue import PostgresQueue
from crashqueuelab.systems.contract import System
from crashqueuelab.systems.postgres import open_postgres, postgres_system


class NeverAsks(PostgresQueue):
    """Every lost COMMIT answer taken as "did not commit"."""

    def _committed(self, named: tuple[str, str]) -> bool:
        return False


def never_asks_system() -> System:
    return replace(
        postgres_system(),
        name="postgres-never-asks",
        open=functools.partial(open_postgres, queue_class=NeverAsks),
    )
