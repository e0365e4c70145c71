"""pgqueuer's system, on the shared skeleton."""

from __future__ import annotations

from crashqueuelab.judges.readers.pgqueuer import read_pgqueuer_store
from crashqueuelab.systems.contract import System
from crashqueuelab.systems.libraries.pgqueuer import LIBRARY
from crashqueuelab.systems.libraries.pgqueuer.client import RETRY_TIMER, STATUS, PgQueuerClient
from crashqueuelab.systems.libraries.pgqueuer.points import CRASH_POINTS
from crashqueuelab.systems.libraries.pgqueuer.promises import documented_for
from crashqueuelab.systems.libraries.pgqueuer.worker import LIBRARY_WORKER, OWN_WORKER
from crashqueuelab.systems.libraries.skeleton import library_reader

read_store = library_reader(
    read_pgqueuer_store,
    STATUS,
    "crashqueuelab.judges.readers.pgqueuer (reads pgqueuer's tables with its own SQL)",
)


def pgqueuer_system() -> System:
    """pgqueuer, as installed, on the run's PostgreSQL server."""
    # Imported here, once: the lab opens systems from several threads at a time, and two
    # threads importing pgqueuer at once meet its modules half initialised.
    import pgqueuer.db
    import pgqueuer.errors
    import pgqueuer.queries

    return LIBRARY.system(
        "pgqueuer",
        durability="the server's (synchronous_commit=on); concurrency_limit=1, retry timer"
        f" {RETRY_TIMER.total_seconds():g} s",
        open=PgQueuerClient,
        reader=read_store,
        crash_points=CRASH_POINTS,
        documented=documented_for(hasattr(pgqueuer.queries.Queries, "retry_job")),
        library_worker=LIBRARY_WORKER,
        own_worker=OWN_WORKER,
    )


def build(name: str) -> System:
    """The system of that name (the registry's call): pgqueuer has one."""
    return pgqueuer_system()
