"""procrastinate's system, on the shared skeleton."""

from __future__ import annotations

from crashqueuelab.judges.readers.procrastinate import read_procrastinate_store
from crashqueuelab.systems.contract import System
from crashqueuelab.systems.libraries.procrastinate import LIBRARY
from crashqueuelab.systems.libraries.procrastinate.client import (
    STALLED_S,
    STATUS,
    ProcrastinateClient,
)
from crashqueuelab.systems.libraries.procrastinate.points import CRASH_POINTS
from crashqueuelab.systems.libraries.procrastinate.promises import DOCUMENTED
from crashqueuelab.systems.libraries.procrastinate.worker import OWN_WORKER
from crashqueuelab.systems.libraries.skeleton import library_reader

read_store = library_reader(
    read_procrastinate_store,
    STATUS,
    "crashqueuelab.judges.readers.procrastinate (reads procrastinate's tables with its own SQL)",
)


def procrastinate_system() -> System:
    """procrastinate, as installed, on the run's PostgreSQL server."""
    # Imported here, once: the lab opens systems from several threads at a time.
    import procrastinate.exceptions
    import procrastinate.jobs  # noqa: F401

    return LIBRARY.system(
        "procrastinate",
        durability="the server's (synchronous_commit=on); stalled after"
        f" {STALLED_S:g} s without a heartbeat",
        open=ProcrastinateClient,
        reader=read_store,
        crash_points=CRASH_POINTS,
        documented=DOCUMENTED,
        own_worker=OWN_WORKER,
    )


def build(name: str) -> System:
    """The system of that name (the registry's call): procrastinate has one."""
    return procrastinate_system()
