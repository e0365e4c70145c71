"""Reading a retained store for reports: the system's independent reader, or its own client.

A reading never raises: a reader that fails is itself evidence, reported as a problem.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from crashqueuelab.core.clock import ManualClock
from crashqueuelab.core.ids import SeededIds
from crashqueuelab.core.retry import RetryPolicy
from crashqueuelab.systems.contract import OpenRequest, StoredJob, StoreReading, System

#: How a reading made through the system's own code is labelled in reports.
CLIENT_JUDGE = "the system's own client (not an independent reader)"


def _through_client(system: System, directory: Path, keys: Sequence[str]) -> StoreReading:
    request = OpenRequest(directory, ManualClock(0), SeededIds(0, "reader"), RetryPolicy())
    client = system.open(request)
    try:
        views = {key: client.job(key) for key in keys}
    finally:
        client.close()
    return StoreReading(
        exists=True,
        jobs={
            key: StoredJob(view.native_state, view.status, view.attempts)
            for key, view in views.items()
            if view is not None
        },
        facts={},
        ok=True,
        problems=[],
        judge=CLIENT_JUDGE,
    )


def read_store(system: System, directory: Path, keys: Sequence[str]) -> StoreReading:
    """What ``directory`` holds for ``keys`` (and all else the reader finds), and its verdict."""
    judge = "unknown" if system.reader is None else system.reader.__module__
    # A reader gets an absolute directory, as a client does (``OpenRequest``), also when
    # the run's output directory was given relative to the working directory.
    directory = directory.absolute()
    try:
        if system.reader is not None:
            return system.reader(directory)
        return _through_client(system, directory, keys)
    except Exception as error:  # a reader's failure is data, never a traceback
        return StoreReading(
            exists=directory.exists(),
            jobs={},
            facts={},
            ok=False,
            problems=[f"the reader raised {type(error).__name__}: {error}"],
            judge=judge,
        )
