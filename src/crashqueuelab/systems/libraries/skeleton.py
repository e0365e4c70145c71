"""What every library package is built on: its declaration (``Library``), read by the
registry without importing the library, and the reader and ``System`` assembled from it.

A library package holds ``__init__.py`` (its ``LIBRARY``), ``client.py`` (the library's own
calls, a ``LibraryClient``), ``points.py`` (its crash points), ``promises.py`` (what it
documents of itself), ``worker.py`` where the lab runs the library's own worker loop, and
``system.py``: ``build(name)``, the factory the registry calls, and the named factories a
``module:factory`` spec calls.
"""

from __future__ import annotations

import importlib
import re
import signal
from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Protocol, TypeVar

from crashqueuelab.core.errors import SystemUnavailable, install_hint
from crashqueuelab.systems.boundary import (
    OneAtATime,
    boundary_point,
    library_capabilities,
    library_reading,
)
from crashqueuelab.systems.contract import (
    Capabilities,
    Claim,
    Documented,
    JobSpec,
    JobStatus,
    LibraryWorker,
    OpenRequest,
    OwnWorker,
    QueueClient,
    Reader,
    StoreReading,
    System,
)
from crashqueuelab.systems.crashpoints import (
    CrashPoint,
)


class LibraryClient(OneAtATime):
    """What every library's client shares besides taking one job at a time: a submission
    is a batch of one, and there is no checkpoint of its own (``library_capabilities``)."""

    @abstractmethod
    def submit_many(self, jobs: Sequence[JobSpec]) -> list[str]: ...

    def submit(self, job: JobSpec) -> str:
        return self.submit_many([job])[0]

    def checkpoint(self) -> None:
        return None


def tokenless_claim(
    *,
    job_id: str,
    key: str,
    job_type: str,
    payload: dict[str, Any],
    attempt: int,
    worker_id: str,
    handle: object = None,
) -> Claim:
    """A claim on a library that has no token: the job's id and attempt name it for the
    lab's logs."""
    return Claim(
        job_id=job_id,
        key=key,
        job_type=job_type,
        payload=payload,
        attempt=attempt,
        worker_id=worker_id,
        token=f"{job_id}.{attempt}",
        handle=handle,
    )


#: The job type and payload of a job submitted through a library's scheduling call
#: (``OwnWorker.schedule``): one attempt, so a second execution is the library's.
SCHEDULED_JOB_TYPE = "scheduled"


def scheduled_job(key: str) -> JobSpec:
    """The job ``OwnWorker.schedule`` submits under ``key``."""
    return JobSpec(key, SCHEDULED_JOB_TYPE, {}, max_attempts=1)


def as_started_by_its_users() -> None:
    """Give the shutdown signals the dispositions a worker started from a shell or a
    process manager has, before its library installs its own handlers: SIGINT raises
    KeyboardInterrupt (Python's handler), SIGTERM, SIGQUIT and SIGHUP take their default
    action. The lab's worker processes are born ignoring SIGINT (``forkserver_context``);
    left so, a library that keeps Python's SIGINT handler (asyncio's runner, for one,
    installs its own only over it) would not do what its users see."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for each in (signal.SIGTERM, signal.SIGQUIT, signal.SIGHUP):
        signal.signal(each, signal.SIG_DFL)


class NativeReading(Protocol):
    """What a judges' reader of a library's store finds: each job's native state and
    attempts, by key, and what is wrong."""

    @property
    def exists(self) -> bool: ...

    @property
    def jobs(self) -> Mapping[str, tuple[str, int]]: ...

    @property
    def problems(self) -> Sequence[str]: ...


ReadingT = TypeVar("ReadingT", bound=NativeReading)


def _no_facts(reading: NativeReading) -> Mapping[str, Any]:
    return {}


def library_reader(
    read: Callable[[Path], ReadingT],
    statuses: Mapping[str, JobStatus],
    judge: str | Callable[[Path], str],
    facts: Callable[[ReadingT], Mapping[str, Any]] = _no_facts,
) -> Reader:
    """The system's reader: the judges' ``read`` (which imports nothing of the library), its
    states in the lab's words, the judge named in the reading (or what names it, from the
    store's directory), and the reading's facts beyond the jobs' states, where it has some."""

    def read_store(directory: Path) -> StoreReading:
        reading = read(directory)
        return library_reading(
            exists=reading.exists,
            jobs=reading.jobs,
            problems=reading.problems,
            statuses=statuses,
            judge=judge if isinstance(judge, str) else judge(directory),
            facts=facts(reading),
        )

    # A reading that raises is reported under the reader's module: the judges' one.
    read_store.__module__ = read.__module__
    return read_store


def _release_key(release: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"[0-9]+", release))


@dataclass(frozen=True)
class Library:
    """A third-party queue under the lab, as its package declares it: data only, so that
    listing the systems imports nothing of the library."""

    #: The package, whose ``system`` module has ``build(name)``.
    package: str
    #: The library's name in its crash points' descriptions ("around RQ's dequeue").
    name: str
    #: Its distribution on the package index: the version shown, and what
    #: ``--system name==version`` installs.
    distribution: str
    #: The crashqueuelab extra that installs it.
    extra: str
    #: The systems it is run as, by the name ``--system`` takes.
    systems: tuple[str, ...]
    #: Whether its client sends heartbeats (the rest of its capabilities every library
    #: shares: ``library_capabilities``).
    heartbeats: bool
    #: The kind of server the command line provides for its systems, or None.
    server: str | None = None
    #: What of the library the systems drive, after the release in their version.
    drives: str = ""
    #: The distribution's extras a pinned release installs with it (``celery[redis]``,
    #: ``dramatiq[redis,rabbitmq]``).
    pin_extras: tuple[str, ...] = ()
    #: Dependencies a pinned release needs and its own metadata does not say: each
    #: ``(release, requirement)`` is installed beside every release before ``release``
    #: (taskiq-redis before 1.2.4 allows taskiq 0.13 and imports what taskiq 0.13 removed).
    companions: tuple[tuple[str, str], ...] = ()
    #: What one of its systems needs beside every release: each ``(system, requirement)``
    #: (``celery-gevent-acks-late`` runs Celery's gevent pool, which needs gevent).
    system_companions: tuple[tuple[str, str], ...] = ()

    def companions_for(self, release: str, system: str | None = None) -> tuple[str, ...]:
        """The requirements installed beside ``release`` of the distribution (for
        ``system``, with what that system needs)."""
        wanted = _release_key(release)
        before = tuple(need for until, need in self.companions if wanted < _release_key(until))
        return before + tuple(need for name, need in self.system_companions if name == system)

    @property
    def capabilities(self) -> Capabilities:
        return library_capabilities(heartbeats=self.heartbeats)

    def point(
        self,
        name: str,
        effect: tuple[str, int] | None,
        flaky: tuple[str, int] | None,
        effects: int,
        facts: Mapping[str, Any] | None = None,
    ) -> CrashPoint:
        """A crash point around one of the library's calls (``boundary_point``)."""
        return boundary_point(self.name, name, effect, flaky, effects, facts)

    def installed(self) -> str:
        """The installed release (PackageNotFoundError without one)."""
        return version(self.distribution)

    def build(self, system: str) -> System:
        """The system of that name; its adapter, and the library, imported only now."""
        try:
            module = importlib.import_module(f"{self.package}.system")
            factory: Callable[[str], System] = module.build
            return factory(system)
        except (ImportError, PackageNotFoundError) as error:
            missing = getattr(error, "name", None) or self.distribution
            raise SystemUnavailable(
                system,
                f"{missing} is not installed: {install_hint(self.extra)}",
            ) from None

    def system(
        self,
        name: str,
        *,
        durability: str,
        open: Callable[[OpenRequest], QueueClient],
        reader: Reader,
        crash_points: tuple[CrashPoint, ...],
        documented: Sequence[Documented] = (),
        persistence: str | None = None,
        library_worker: LibraryWorker | None = None,
        own_worker: OwnWorker | None = None,
    ) -> System:
        """One of its systems, at the installed release."""
        drives = f" ({self.drives})" if self.drives else ""
        return System(
            name=name,
            version=f"{self.distribution} {self.installed()}{drives}",
            durability=durability,
            capabilities=self.capabilities,
            crash_points=crash_points,
            open=open,
            reader=reader,
            server=self.server,
            persistence=persistence,
            documented=tuple(documented),
            distribution=self.distribution,
            library_worker=library_worker,
            own_worker=own_worker,
        )
