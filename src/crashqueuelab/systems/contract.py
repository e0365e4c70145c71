"""The system-under-test contract: what the lab needs from a queue, and nothing more.

A system is plain data (``System``): its name, version and durability setting, what it can
do (``Capabilities``), where it can be killed and what each death must leave on disk
(``CrashPoint``, in ``crashpoints``), how to open it (``open``, returning a ``QueueClient``)
and how to read its retained files without its own code (``reader``). The lab reads
capabilities instead of branching on names, and skips what a system cannot do, saying so in
its reports.

Every holder operation answers with a ``Verdict``; a refused (stale) acknowledgement is an
answer, not an exception, so a misbehaving system is reported, never crashes the lab.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from threading import Event
from typing import Any, Protocol, runtime_checkable

from crashqueuelab.core.clock import Clock
from crashqueuelab.core.errors import InvalidInput
from crashqueuelab.core.ids import IdGenerator
from crashqueuelab.core.retry import RetryPolicy
from crashqueuelab.judges.findings import KIND_NAMES, Fact
from crashqueuelab.systems.crashpoints import CrashPoint

#: A system calls its hook with the name of the crash point it has reached.
Hook = Callable[[str], None]


class JobStatus(StrEnum):
    """The lab's words for where a job stands, whatever the system calls it."""

    PENDING = "pending"  # waiting to be claimed, now or after a retry delay
    LEASED = "leased"
    SUCCEEDED = "succeeded"
    DEAD = "dead"

    @property
    def is_terminal(self) -> bool:
        return self in (JobStatus.SUCCEEDED, JobStatus.DEAD)


class Verdict(StrEnum):
    """What the system answered to a holder's acknowledgement or failure report."""

    SUCCEEDED = "succeeded"
    RETRY = "retry"
    DEAD = "dead"
    STALE = "stale"  # the claim no longer counts: nothing was changed


@dataclass(frozen=True)
class JobSpec:
    """One job to submit; ``key`` is its permanent idempotency key."""

    key: str
    job_type: str
    payload: dict[str, Any] = field(hash=False)
    max_attempts: int = 3


@dataclass(frozen=True)
class Claim:
    """A job leased to one worker; ``token`` fences the worker's later operations."""

    job_id: str
    key: str
    job_type: str
    payload: dict[str, Any] = field(hash=False, compare=False)
    attempt: int
    worker_id: str
    token: str
    #: The system's own lease object, for its adapter alone.
    handle: object = field(default=None, hash=False, compare=False, repr=False)


@dataclass(frozen=True)
class JobView:
    """One job as its system reports it: the lab's status and the system's own word."""

    key: str
    status: JobStatus
    attempts: int
    native_state: str


class QueueClient(Protocol):
    """An open queue in one process. Times come from the clock given to ``open``."""

    def submit(self, job: JobSpec) -> str:
        """Create the job, or return the id an identical earlier submission created."""
        ...

    def submit_many(self, jobs: Sequence[JobSpec]) -> list[str]:
        """Submit every job in one transaction where the system batches."""
        ...

    def claim(self, worker_id: str, lease_us: int) -> Claim | None:
        """Lease one ready job, or None when nothing is ready."""
        ...

    def claim_many(self, worker_id: str, lease_us: int, limit: int) -> list[Claim]:
        """Lease up to ``limit`` ready jobs."""
        ...

    def heartbeat(self, claim: Claim, lease_us: int) -> bool:
        """Extend a live lease; False when the claim is stale."""
        ...

    def succeed(self, claim: Claim) -> Verdict:
        """Acknowledge the job: SUCCEEDED, or STALE when the claim no longer counts."""
        ...

    def succeed_many(self, claims: Sequence[Claim]) -> list[Verdict]:
        """Acknowledge several claims, each judged on its own lease."""
        ...

    def fail(self, claim: Claim, error: str) -> Verdict:
        """Report a failed attempt: RETRY, DEAD (attempts used up) or STALE."""
        ...

    def recover(self) -> int:
        """Expire overdue leases and release due retries; how many jobs moved."""
        ...

    def checkpoint(self) -> None:
        """Compact or checkpoint the store, where the system has such a step."""
        ...

    def job(self, key: str) -> JobView | None:
        """The job submitted under ``key``, or None when there is none."""
        ...

    def active_count(self) -> int:
        """How many jobs are not finished yet (pending or leased)."""
        ...

    def close(self) -> None:
        """Release the store; safe to call twice."""
        ...


@runtime_checkable
class CommitSharingClient(Protocol):
    """A client whose store lets one process's commit carry other processes' transitions
    (group commit), and counts it."""

    def shared_commits(self) -> dict[str, int]:
        """Counts since the client opened: ``carried_for_others`` (other writers'
        transitions this client's commits carried), ``carried_by_others`` (this client's
        transitions another writer's commit carried), ``carrier_vanished_applied`` and
        ``carrier_vanished_rerun`` (requests taken by a carrier that died before finishing
        them: found committed by it, or run again by this client)."""
        ...


@dataclass(frozen=True)
class AttemptView:
    """One attempt of a job as its system reports it: who held it under which lease, the
    deadline the lease has (or had when it ended), and how it ended (``succeeded``,
    ``failed``, ``expired``; None while open)."""

    attempt: int
    worker_id: str
    token: str
    lease_deadline_us: int
    outcome: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "worker": self.worker_id,
            "token": self.token,
            "deadline": self.lease_deadline_us,
            "outcome": self.outcome,
        }


@runtime_checkable
class AttemptsClient(Protocol):
    """A client that reports each job's attempts (the model workload compares the report
    with what each holder was told)."""

    def attempts(self, key: str) -> list[AttemptView] | None:
        """Every attempt of the job submitted under ``key``, first first; None: no job."""
        ...


@runtime_checkable
class ChainingClient(Protocol):
    """A client whose acknowledgement can also lease the worker's next job, in one commit
    (``Capabilities.chained``): two transitions, two events, one fsync."""

    def succeed_and_claim(self, claim: Claim, lease_us: int) -> tuple[Verdict, Claim | None]:
        """Acknowledge ``claim``; if that was accepted, lease the next ready job to the same
        worker in the same transaction (None when nothing is ready)."""
        ...

    def succeed_many_and_claim(
        self, claims: Sequence[Claim], worker_id: str, lease_us: int, limit: int
    ) -> tuple[list[Verdict], list[Claim]]:
        """Acknowledge ``claims`` (each fenced on its own, as ``succeed_many``) and lease up
        to ``limit`` ready jobs to ``worker_id`` in the same transaction."""
        ...


#: How the writer that carries a waiting call ends (``CarrierStaging``): it commits; or it
#: dies having taken the call and run nothing, having run it and noted its result but before
#: its commit, or right after its commit, before it could tell the caller.
COMMITS = "commits"
DIES_AFTER_TAKING = "dies-after-taking"
DIES_BEFORE_COMMIT = "dies-before-commit"
DIES_AFTER_COMMIT = "dies-after-commit"
CARRIER_FATES = (COMMITS, DIES_AFTER_TAKING, DIES_BEFORE_COMMIT, DIES_AFTER_COMMIT)


@runtime_checkable
class CarrierStaging(Protocol):
    """A client whose single calls (claim, succeed, succeed_and_claim) another writer's
    commit can carry, and which can stage that for the lab (``Capabilities.carried``)."""

    def behind_a_carrier(self, call: Callable[[], Any], fate: str) -> Any:
        """Run ``call`` (one single call on this client) while a second writer of the same
        store holds the line, carries the call in its transaction and meets ``fate``
        (``CARRIER_FATES``); the call's own answer."""
        ...


@dataclass(frozen=True)
class OpenRequest:
    """Everything a system is opened with: injected time, ids and hook."""

    directory: Path
    clock: Clock
    ids: IdGenerator
    retry: RetryPolicy
    #: None when nothing observes the crash points (a system may then take a faster path).
    hook: Hook | None = None

    def __post_init__(self) -> None:
        # Always absolute, whatever directory the run was given on the command line: an
        # adapter may make a URI of it (``Path.as_uri`` refuses a relative path) or hand it
        # to a library that changes directory.
        object.__setattr__(self, "directory", Path(self.directory).absolute())


@dataclass(frozen=True)
class Capabilities:
    """What a system can do; the lab skips the rest and says so."""

    fencing_tokens: bool  # every holder operation checks a per-claim token
    heartbeats: bool
    several_processes: bool  # several worker processes may open one store at once
    batching: bool  # claim_many and succeed_many are set-oriented
    single_owner: bool  # one process owns the store; workers live inside it
    checkpoint: bool  # checkpoint() does durable work with crash points of its own
    chained: bool = False  # the client is a ChainingClient
    carried: bool = False  # the client is a CarrierStaging: another writer carries its calls
    #: Two clients of different stores may be open in one process and called from two
    #: threads at once (the campaign judges two cases at a time in its own process); False
    #: for a library with process-wide configuration: the lab then takes one case at a time.
    concurrent_stores: bool = True
    #: The adapter claims jobs itself (every experiment's workers); False where only the
    #: library's own worker consumes (Celery on RabbitMQ): the lab runs it under deploys
    #: alone and the other commands refuse it.
    claims: bool = True

    def to_json(self) -> dict[str, bool]:
        return {
            "chained": self.chained,
            "carried": self.carried,
            "concurrent_stores": self.concurrent_stores,
            "claims": self.claims,
            "fencing_tokens": self.fencing_tokens,
            "heartbeats": self.heartbeats,
            "several_processes": self.several_processes,
            "batching": self.batching,
            "single_owner": self.single_owner,
            "checkpoint": self.checkpoint,
        }


@dataclass(frozen=True)
class StoredJob:
    """One job as an independent reader found it in the retained files; a leased job's
    deadline where the store keeps one (microseconds on the system's clock)."""

    native_state: str
    status: JobStatus
    attempts: int
    lease_deadline_us: int | None = None


@dataclass(frozen=True)
class StoreReading:
    """What an independent reader found in a store directory, and its judgement of it."""

    exists: bool
    jobs: Mapping[str, StoredJob]
    facts: Mapping[str, Any]
    ok: bool
    problems: Sequence[str]
    judge: str
    #: The store's own history (events, WAL transactions) as JSON rows, where it keeps one.
    history: Sequence[Mapping[str, Any]] = ()
    #: The verdict of each named check the reader ran (for SQLite: replay, invariants).
    checks: Mapping[str, bool] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "exists": self.exists,
            "jobs": {
                key: {
                    "state": job.native_state,
                    "status": job.status.value,
                    "attempts": job.attempts,
                    **(
                        {}
                        if job.lease_deadline_us is None
                        else {"lease_deadline_us": job.lease_deadline_us}
                    ),
                }
                for key, job in self.jobs.items()
            },
            "facts": dict(self.facts),
            "ok": self.ok,
            "problems": list(self.problems),
            "checks": dict(self.checks),
            "judge": self.judge,
        }


Reader = Callable[[Path], StoreReading]


@dataclass(frozen=True)
class LibraryWorker:
    """The library's own worker loop, as its users run it: its fetch, its heartbeat, its
    completion, none of them the lab's. The heartbeat experiment (``lab.heartbeats``) runs
    one per worker process to see whether a live worker keeps the job it is running."""

    #: How long the library lets a job go without a heartbeat before it hands the job out
    #: again, unless the run says otherwise.
    retry_after_s: float
    #: ``run(directory, worker_id, work, stop, retry_after_s)``: run the loop on the store
    #: in ``directory`` with that retry timer, calling ``work(key)`` (blocking, in a thread
    #: of the loop's choosing) for each job the library hands this worker, until ``stop``
    #: is set; then return.
    run: Callable[[Path, str, Callable[[str], None], Event, float], None]
    #: What the loop is, in a line for the report ("QueueManager.run, batch_size 10").
    describe: str


@runtime_checkable
class JobWork(Protocol):
    """The work the deploy experiment hands a library's own worker (``OwnWorker.serve``):
    called with a job's key, it runs the job's work; ``received(key)`` records that the
    worker received the job from its broker, for a library that can tell (Celery's
    ``task_received`` signal), called in the worker's process before the work runs. A job
    held since its receipt is one a broker's crash may take back while it waits.
    ``ready()`` records that the worker takes jobs now, for a library that can tell (Celery's
    ``worker_ready`` signal, sent as its consumer starts consuming)."""

    def __call__(self, key: str) -> None: ...

    def received(self, key: str) -> None: ...

    def ready(self) -> None: ...


@dataclass(frozen=True)
class OwnWorker:
    """The library's own worker process, started as its users start it (the code path of
    its command line, its signal handlers included). The deploy experiment
    (``lab.deploys``) runs one per worker process and only sends it signals: what SIGTERM,
    a second SIGTERM, SIGINT or SIGQUIT do to the job in hand and to the jobs it fetched
    ahead is the library's to decide."""

    #: ``serve(directory, worker_id, work)``: run the library's worker on the store in
    #: ``directory`` in this process's main thread, with the signal handlers the library
    #: installs, calling ``work(key)`` (blocking, in whatever thread or process the library
    #: runs a job in) for each job it hands this worker; return when the worker exits.
    #: Where ``work`` is a ``JobWork`` and the library tells when its worker received a
    #: job, it calls ``work.received(key)`` then.
    serve: Callable[[Path, str, Callable[[str], None]], None]
    #: What the worker is, in a line for the report ("rq's Worker.work, its work horse
    #: forked per job").
    describe: str
    #: What the library documents each shutdown signal to do, by the signal's name
    #: ("SIGTERM"), in its own words, quoted.
    shutdown: Mapping[str, str] = field(default_factory=dict)
    #: Where the library documents it (a link).
    source: str = ""
    #: ``schedule(directory, key, due)``: submit the job ``key`` through the library's own
    #: scheduling call, due at ``due`` (seconds since the epoch); None where the library
    #: schedules nothing.
    schedule: Callable[[Path, str, float], None] | None = None
    #: Whether ``serve`` calls ``work.ready()`` once the library's worker takes jobs: a
    #: deploy then stops it only from there (or once it had the run's start-up bound), as a
    #: rolling deploy waits for a readiness probe, not while it still boots.
    tells_ready: bool = False


#: A condition on one field or fact of a finding: a value, or a tuple of the values it may
#: have. A string matches as an ``fnmatch`` pattern (case-sensitive): an exact string is
#: itself, ``"*"`` is any string.
Condition = Fact | tuple[Fact, ...]
#: The conditions a finding meets, all of them; a field or fact it lacks meets none.
Conditions = Mapping[str, Condition]


@dataclass(frozen=True)
class Documented:
    """A way a system is weaker than the lab's contract that its own documentation states.

    ``kinds`` are the kinds of finding it explains whatever their fields
    (``crashqueuelab.judges.findings.Kind``, by name); ``when`` maps a kind to the
    conditions on its fields and facts under which it explains one (a ``Conditions``
    mapping, or a tuple of them, any of which will do), such as ``{"attempt_beyond_limit":
    {"previous_attempt": "expired"}}``. A finding of a kind it names in neither is never
    its. ``explains`` are patterns (``fnmatch``, case-sensitive) over the anomaly lines:
    the fallback for a line without a finding (a record kept before findings existed),
    and, in a weakness that names no kind, for every line. ``points`` are crash points
    whose expected state shows it (they pass, and the report names the weakness);
    ``crash_modes`` are crash modes in which the system promises nothing, so that a case
    failing there is this weakness, not a broken promise. ``faults`` are chaos's faults
    (``"server restart"``) the system promises nothing against: in a chaos run where one
    was delivered, a line no earlier weakness explains is this one; in a deploy run, only
    the lines of jobs that were in the store when a restart began
    (``before_server_restart``).
    """

    what: str
    source: str
    points: tuple[str, ...] = ()
    crash_modes: tuple[str, ...] = ()
    explains: tuple[str, ...] = ()
    faults: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()
    when: Mapping[str, Conditions | tuple[Conditions, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = sorted((set(self.kinds) | set(self.when)) - KIND_NAMES)
        if unknown:
            raise InvalidInput(
                "documented",
                f"{', '.join(unknown)}: no such kind of finding (docs/systems.md lists them)",
            )
        # A kind's name is its value, however the declaration spelled it (Kind or str).
        object.__setattr__(self, "kinds", tuple(str(kind) for kind in self.kinds))
        object.__setattr__(
            self, "when", {str(kind): conditions for kind, conditions in self.when.items()}
        )

    @property
    def names_kinds(self) -> bool:
        """Whether it names kinds: then its patterns are only the fallback for lines
        without a finding."""
        return bool(self.kinds or self.when)

    def alternatives(self, kind: str) -> tuple[Conditions, ...] | None:
        """The conditions under which it explains a finding of ``kind``, any of them
        (``({},)``: always); None when it names no such kind."""
        if kind in self.kinds:
            return ({},)
        conditions = self.when.get(kind)
        if conditions is None:
            return None
        return conditions if isinstance(conditions, tuple) else (conditions,)

    def to_json(self) -> dict[str, Any]:
        return {
            "what": self.what,
            "source": self.source,
            "points": list(self.points),
            "crash_modes": list(self.crash_modes),
            "explains": list(self.explains),
            "faults": list(self.faults),
            "kinds": list(self.kinds),
            "when": {
                kind: [_conditions_json(one) for one in conditions]
                if isinstance(conditions, tuple)
                else _conditions_json(conditions)
                for kind, conditions in self.when.items()
            },
        }


def _conditions_json(conditions: Conditions) -> dict[str, Any]:
    return {
        name: list(value) if isinstance(value, tuple) else value
        for name, value in conditions.items()
    }


@dataclass(frozen=True)
class System:
    """A system under test, as the lab sees it."""

    name: str
    version: str
    durability: str
    capabilities: Capabilities
    crash_points: tuple[CrashPoint, ...]
    open: Callable[[OpenRequest], QueueClient]
    #: An independent reader of the store's files; None means the lab can only ask the
    #: system itself, and its reports say the reading is not independent.
    reader: Reader | None = None
    #: Ends the database sessions of the process with this pid, as an administrator would
    #: (how many ended); None for a system without server sessions.
    terminate_sessions: Callable[[int], int] | None = None
    #: The kind of server the command line must provide for a run ("postgres", "redis"),
    #: or None.
    server: str | None = None
    #: The persistence the run's server is started with, where the server has a choice
    #: (Redis: a name in ``servers.redis.PERSISTENCE``).
    persistence: str | None = None
    #: A message broker the run starts beside that server ("rabbitmq": a throwaway node,
    #: named to every process by ``servers.rabbitmq.URL_VARIABLE``), or None.
    broker: str | None = None
    #: What the system declares on its broker for the store ``directory`` (its durable
    #: queues), on the node at the AMQP URL given, as its application does before its first
    #: job: a power-loss case runs it on a node that then stops cleanly, before the power
    #: comes on (a node that has been running for a while). None: nothing to declare.
    declare_broker: Callable[[Path, str], None] | None = None
    #: Where the system is a library's: what its documentation says it does not promise.
    documented: tuple[Documented, ...] = ()
    #: The library's distribution on the package index (what ``--system name==version``
    #: installs), or None for a system that is not a released library.
    distribution: str | None = None
    #: The library's own worker loop, where the lab can run it (the heartbeat experiment).
    library_worker: LibraryWorker | None = None
    #: The library's own worker process as its users start it (the deploy experiment);
    #: None where the lab runs its own worker instead.
    own_worker: OwnWorker | None = None
    #: How long, on the wall clock, the system may take to hand out again the jobs a dead
    #: or stopped worker held, once its lease has run out (a sweeper's period, say): chaos
    #: waits this much longer for progress, per recovery a poison job needs, before it says
    #: the work stalled. 0: recovery follows the lease alone.
    recovery_s: float = 0.0

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "durability": self.durability,
            "recovery_s": self.recovery_s,
            "capabilities": self.capabilities.to_json(),
            "crash_points": len(self.crash_points),
            "independent_reader": self.reader is not None,
            "documented": [weakness.to_json() for weakness in self.documented],
        }
