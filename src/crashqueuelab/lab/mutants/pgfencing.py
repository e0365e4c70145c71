"""A planted bug of the PostgreSQL system: an acknowledgement is fenced by its lease token
alone, not by the lease's deadline, so a holder whose lease has run out is still accepted
as long as nobody has recovered or taken the job yet.

Process deaths and pauses rarely show it: the maintenance process recovers an expired lease
within milliseconds of its deadline, clearing the token, long before a paused worker is
continued. It takes a fault that delays the holder and the recovery together (a network
partition between the server and every process) to put an acknowledgement past its deadline
while the token still stands; the PostgreSQL store's independent reader then finds a
SUCCEEDED event at or after its lease's deadline.

Resolved by import path (``crashqueuelab.lab.mutants.pgfencing:token_only_ack_system``), so
chaos workers run the same broken code; it needs the ``postgres`` extra, which is why it is
not in the catalog every ``mutants`` run goes through.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import psycopg

from crashqueuelab.postgres import statements
from crashqueuelab.postgres.queue import PgAck, PostgresQueue
from crashqueuelab.systems.contract import System
from crashqueuelab.systems.postgres import open_postgres, postgres_system

#: The shipped acknowledgement without its deadline check (should the shipped text move,
#: the replacement changes nothing and tests/postgres/test_queue.py sees the mutant refuse).
TOKEN_ONLY_SUCCEED = statements.SUCCEED.replace(b"AND jobs.lease_deadline_us > %(now)s", b"")


class TokenOnlyAck(PostgresQueue):
    """Acknowledgements fenced by worker and token, never by the deadline."""

    def _acknowledged(
        self, conn: psycopg.Connection[Any], arguments: Mapping[str, Any]
    ) -> set[PgAck]:
        return {PgAck(*row) for row in conn.execute(TOKEN_ONLY_SUCCEED, arguments)}


def token_only_ack_system() -> System:
    return replace(
        postgres_system(),
        name="postgres-token-only-ack",
        open=functools.partial(open_postgres, queue_class=TokenOnlyAck),
    )
