"""huey's systems, on the shared skeleton.

Two systems: ``huey`` at the installed release's defaults, and ``huey-fsync`` with
``fsync=True``. Up to 3.2.x huey's default sets ``synchronous=OFF``; from 3.3.0 it leaves
SQLite's default (FULL), so which of the two a default run is depends on the release.
"""

from __future__ import annotations

from functools import partial

from crashqueuelab.judges.readers.huey import DATABASE_FILE, read_huey_file
from crashqueuelab.systems.contract import System
from crashqueuelab.systems.libraries.huey import LIBRARY
from crashqueuelab.systems.libraries.huey.client import STATUS, HueyClient
from crashqueuelab.systems.libraries.huey.points import CRASH_POINTS
from crashqueuelab.systems.libraries.huey.promises import DOCUMENTED, unsynced_default
from crashqueuelab.systems.libraries.huey.worker import own_worker
from crashqueuelab.systems.libraries.skeleton import library_reader

#: The first release whose default leaves SQLite's own ``synchronous`` setting alone.
SYNCED_BY_DEFAULT_FROM = (3, 3, 0)

read_store = library_reader(
    read_huey_file,
    STATUS,
    f"crashqueuelab.judges.readers.huey (reads {DATABASE_FILE} directly)",
)


def _release(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:3] if part.isdigit())


def _system(name: str, fsync: bool | None) -> System:
    # Imported here, once: the lab opens systems from several threads at a time.
    import huey  # noqa: F401

    installed = LIBRARY.installed()
    documented = list(DOCUMENTED)
    if fsync is True:
        durability = "fsync=True: synchronous=FULL, WAL (set by huey)"
    elif _release(installed) >= SYNCED_BY_DEFAULT_FROM:
        durability = "huey's default: SQLite's own synchronous (FULL), WAL (set by huey)"
    else:
        durability = "huey's default: fsync=False, synchronous=OFF, WAL (set by huey)"
        documented.append(unsynced_default(installed))
    return LIBRARY.system(
        name,
        durability=durability,
        open=partial(HueyClient, fsync=fsync),
        reader=read_store,
        crash_points=CRASH_POINTS,
        documented=documented,
        own_worker=own_worker(fsync),
    )


def huey_system() -> System:
    """huey's SqliteHuey at the installed release's defaults."""
    return _system("huey", None)


def huey_fsync_system() -> System:
    """huey's SqliteHuey with ``fsync=True``."""
    return _system("huey-fsync", True)


def build(name: str) -> System:
    """The system of that name (the registry's call)."""
    return huey_fsync_system() if name == "huey-fsync" else huey_system()
