"""A planted bug of the PostgreSQL system: its sessions commit with ``synchronous_commit =
off``, so COMMIT returns before the commit's WAL is flushed, and the queue no longer refuses
such a session at open. A worker is told its acknowledgement was accepted while the record
of it may still sit in the server's WAL buffers; a server crash (``pg_ctl stop -m
immediate``) throws them away.

Resolved by import path, like every mutant (``crashqueuelab.lab.mutants.asynccommit:
async_commit_system``), so chaos workers run the same broken code; it needs the ``postgres``
extra, which is why it is not in the catalog every ``mutants`` run goes through.
"""

from __future__ import annotations

import functools
from dataclasses import replace

from crashqueuelab.systems.contract import System
from crashqueuelab.systems.postgres import open_postgres, postgres_system

SETTINGS = {"synchronous_commit": "off"}


def async_commit_system() -> System:
    return replace(
        postgres_system(),
        durability="synchronous_commit=off (mutant: COMMIT returns before its WAL is flushed)",
        open=functools.partial(
            open_postgres, session_settings=SETTINGS, required_settings={"fsync": "on"}
        ),
    )
