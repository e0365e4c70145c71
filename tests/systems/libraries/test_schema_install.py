"""A library on PostgreSQL installs its tables in a schema of the store's own the first time
the store is opened; the workers of a run open one new store at once, and each must find it
installed once, never fail on another's half-made schema.

A run of the whole suite saw one procrastinate worker fail so (``CREATE SCHEMA IF NOT
EXISTS`` raced with the test's own submission: ``UniqueViolation`` on
``pg_namespace_nspname_index``): the schema is now made under the same advisory lock as the
tables.
"""

from __future__ import annotations

import threading
import traceback
from pathlib import Path

import pytest

from crashqueuelab.core.clock import ManualClock
from crashqueuelab.core.ids import SeededIds
from crashqueuelab.core.retry import RetryPolicy
from crashqueuelab.systems import JobSpec, OpenRequest, resolve_system

#: How many clients open the new store at once: enough that, racing, some met another's
#: uncommitted schema in every run of this test against the code before the lock.
OPENERS = 8
#: A bound on each opener (it waits on the others' installs under the lock).
OPEN_S = 60.0


@pytest.mark.parametrize("system", ["procrastinate", "pgqueuer"])
def test_clients_opening_one_new_store_at_once_install_it_once(
    system: str, tmp_path: Path, postgres_dsn: str
) -> None:
    directory = tmp_path / "store"
    directory.mkdir()
    start = threading.Barrier(OPENERS)
    errors: list[str] = []
    lock = threading.Lock()

    def open_one(number: int) -> None:
        request = OpenRequest(
            directory,
            clock=ManualClock(10**9),
            ids=SeededIds(number, f"o{number}"),
            retry=RetryPolicy(),
        )
        try:
            start.wait(OPEN_S)
            client = resolve_system(system).open(request)
            try:
                client.submit(JobSpec(f"job-{number}", "effect", {"n": number}))
            finally:
                client.close()
        except BaseException as error:  # every opener's failure is the finding
            with lock:
                errors.append("".join(traceback.format_exception(error)[-3:]))

    threads = [threading.Thread(target=open_one, args=(n,)) for n in range(OPENERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(OPEN_S * 2)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []
    # One store, every job in it.
    request = OpenRequest(
        directory, clock=ManualClock(10**9), ids=SeededIds(99, "r"), retry=RetryPolicy()
    )
    client = resolve_system(system).open(request)
    try:
        found = {key for key in (f"job-{n}" for n in range(OPENERS)) if client.job(key)}
    finally:
        client.close()
    assert found == {f"job-{n}" for n in range(OPENERS)}
