"""A planted bug of the PostgreSQL system: a transition whose COMMIT was sent and whose
answer was lost is tried again, without asking the server whether the first try committed.

Process deaths, pauses and server restarts do not show it: the answer to a COMMIT is lost
only when the connection breaks in the instant between the server committing and the
client reading its answer. The campaign's reply-lost crash points make that instant: the
retried acknowledgement finds its own earlier commit, is answered stale, and the worker is
told "refused" of an acknowledgement the store holds; the case's child never reaches the
point after the COMMIT.

A second planted bug asks once and takes "in progress" for "did not commit"
(``in_progress_as_no_system``): the reply-lost points do not show it (by the time the
queue asks, the COMMIT has ended), the open-commit points do: the COMMIT is still waiting
for a synchronous standby when the queue asks, its retry finds the rows the first try holds,
and the first try then commits too.

A third trusts ``pg_xact_status`` across a server restart (``trusts_restarts_system``):
the id-reused points catch it, where the restarted server gave the queue's transaction id
to another session, which committed, and the queue takes that commit for its own.

Resolved by import path (``crashqueuelab.lab.mutants.pgcommit:never_asks_system``,
``...:in_progress_as_no_system``, ``...:trusts_restarts_system``); they need the
``postgres`` extra, as ``pgfencing`` does.
"""

from __future__ import annotations

import functools
from dataclasses import replace

from crashqueuelab.postgres import statements
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


class InProgressAsNo(PostgresQueue):
    """A lost COMMIT answer settled by one question, "in progress" taken as "no"."""

    def _committed(self, named: tuple[str, str]) -> bool:
        conn = self._reconnect()
        row = conn.execute(statements.XACT_STATUS, (named[0],)).fetchone()
        if row is None or row[0] != "committed":
            return False
        self._wait_for_replication(conn)
        return True


def in_progress_as_no_system() -> System:
    return replace(
        postgres_system(),
        name="postgres-in-progress-as-no",
        open=functools.partial(open_postgres, queue_class=InProgressAsNo),
    )


class TrustsRestarts(PostgresQueue):
    """A lost COMMIT answer asked about as if the server had not restarted since."""

    def _committed(self, named: tuple[str, str]) -> bool:
        conn = self._reconnect()
        row = conn.execute(statements.SERVER_STARTED).fetchone()
        return super()._committed((named[0], str(row[0]) if row else named[1]))


def trusts_restarts_system() -> System:
    return replace(
        postgres_system(),
        name="postgres-trusts-restarts",
        open=functools.partial(open_postgres, queue_class=TrustsRestarts),
    )
