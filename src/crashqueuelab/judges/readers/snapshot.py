"""What the readers of stores on a PostgreSQL server share: one read-only REPEATABLE READ
snapshot of the server, and the schema a store's descriptor names."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import psycopg

T = TypeVar("T")
#: What a reading reports when the store's descriptor is there and no server is named.
NO_SERVER = "no server named to read the store on"


def read_snapshot(dsn: str, read: Callable[[psycopg.Connection[Any]], T]) -> T | None:
    """What ``read`` finds in one read-only REPEATABLE READ transaction on the server;
    None when the server does not answer."""
    import psycopg

    try:
        conn = psycopg.connect(dsn, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError:
        return None
    with conn, conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        return read(conn)


def read_schema(
    descriptor: Path,
    dsn: str | None,
    read: Callable[[psycopg.Connection[Any], str], T | None],
) -> T | str | None:
    """What ``read(connection, schema)`` finds of the schema ``descriptor`` names, in one
    snapshot: None where there is no store (no descriptor, no answer, or none that ``read``
    finds), ``NO_SERVER`` where no server is named."""
    if not descriptor.is_file():
        return None
    if not dsn:
        return NO_SERVER
    schema = str(json.loads(descriptor.read_text())["schema"])
    return read_snapshot(dsn, lambda conn: read(conn, schema))
