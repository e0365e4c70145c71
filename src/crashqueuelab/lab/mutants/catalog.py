"""The catalog of planted bugs in the shipped systems: each ``Mutant`` names its factory, what
it changes and the evidence that must catch it. The broken code lives beside it, in the lab
(``sqlite.py``, ``walqueue.py``); the production code carries no switch for any of them.

Each factory returns a ``System`` that the lab resolves by import path
(``crashqueuelab.lab.mutants.catalog:<factory>``), so crash children and chaos workers run the
same broken code as the parent.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass, replace

from crashqueuelab.core.queue import DurableQueue
from crashqueuelab.lab.mutants import fsyncretry
from crashqueuelab.lab.mutants.sqlite import (
    AttemptsLatestDeadlineIsLargest,
    BatchFencesFirstOnly,
    CarrierRecoveryTrustsAnyEvent,
    ChainedStaleAsDone,
    ClaimTakesLeasedJobs,
    ExpiryDropsJob,
    ExpiryWithoutAttempt,
    FenceOffByOne,
    GrantTimeFencing,
    HeartbeatInMemory,
    HeartbeatWithoutEvent,
    NeverDead,
    NoFencing,
    NoRetries,
    ResubmissionCreatesJob,
    SynchronousNormal,
    UncappedBackoff,
)
from crashqueuelab.lab.mutants.walqueue import (
    CurrentWithoutDirectorySync,
    UnsyncedAppends,
    newest_snapshot_trusted,
    store_class,
    torn_tail_refused,
)
from crashqueuelab.systems.contract import OpenRequest, System
from crashqueuelab.systems.sqlite import open_sqlite, sqlite_system
from crashqueuelab.systems.walqueue import WalqueueClient, walqueue_system


def _sqlite_mutant(name: str, queue_class: type[DurableQueue], durability: str = "") -> System:
    shipped = sqlite_system()
    return replace(
        shipped,
        name=f"sqlite-mutant-{name}",
        durability=durability or shipped.durability,
        open=functools.partial(open_sqlite, queue_class=queue_class),
    )


def _walqueue_mutant(
    name: str, patch: Callable[[], contextlib.AbstractContextManager[None]]
) -> System:
    class MutantClient(WalqueueClient):
        def __init__(self, request: OpenRequest) -> None:
            with patch():
                super().__init__(request)

    return replace(walqueue_system(), name=f"walqueue-mutant-{name}", open=MutantClient)


def no_fencing() -> System:
    return _sqlite_mutant("no-fencing", NoFencing)


def fence_off_by_one() -> System:
    return _sqlite_mutant("fence-off-by-one", FenceOffByOne)


def no_retries() -> System:
    return _sqlite_mutant("no-retries", NoRetries)


def never_dead() -> System:
    return _sqlite_mutant("never-dead", NeverDead)


def heartbeat_without_event() -> System:
    return _sqlite_mutant("heartbeat-without-event", HeartbeatWithoutEvent)


def heartbeat_in_memory() -> System:
    return _sqlite_mutant("heartbeat-in-memory", HeartbeatInMemory)


def chained_stale_as_done() -> System:
    return _sqlite_mutant("chained-stale-as-done", ChainedStaleAsDone)


def carrier_recovery_trusts_any_event() -> System:
    return _sqlite_mutant("carrier-recovery-trusts-any-event", CarrierRecoveryTrustsAnyEvent)


def attempts_latest_deadline_is_largest() -> System:
    return _sqlite_mutant("attempts-latest-deadline-is-largest", AttemptsLatestDeadlineIsLargest)


def claim_takes_leased_jobs() -> System:
    return _sqlite_mutant("claim-takes-leased-jobs", ClaimTakesLeasedJobs)


def expiry_without_attempt() -> System:
    return _sqlite_mutant("expiry-without-attempt", ExpiryWithoutAttempt)


def expiry_drops_job() -> System:
    return _sqlite_mutant("expiry-drops-job", ExpiryDropsJob)


def uncapped_backoff() -> System:
    return _sqlite_mutant("uncapped-backoff", UncappedBackoff)


def batch_fences_first_only() -> System:
    return _sqlite_mutant("batch-fences-first-only", BatchFencesFirstOnly)


def grant_time_fencing() -> System:
    return _sqlite_mutant("grant-time-fencing", GrantTimeFencing)


def resubmission_creates_job() -> System:
    return _sqlite_mutant("resubmission-creates-job", ResubmissionCreatesJob)


def synchronous_normal() -> System:
    return _sqlite_mutant(
        "synchronous-normal", SynchronousNormal, "WAL, synchronous=NORMAL (the mutant's change)"
    )


def torn_tail_is_corruption() -> System:
    return _walqueue_mutant("torn-tail-is-corruption", torn_tail_refused)


def newest_snapshot_wins() -> System:
    return _walqueue_mutant("newest-snapshot-wins", newest_snapshot_trusted)


def wal_without_fsync() -> System:
    return _walqueue_mutant("wal-without-fsync", store_class(UnsyncedAppends))


def current_without_directory_sync() -> System:
    return _walqueue_mutant(
        "current-without-directory-sync", store_class(CurrentWithoutDirectorySync)
    )


def fsync_retried() -> System:
    return fsyncretry.fsync_retried()


@dataclass(frozen=True)
class Mutant:
    """One planted bug: its factory's name, what it changes, and the evidence that must
    catch it (docs/mutants.md says why; the full run may find more)."""

    name: str
    changes: str
    evidence: str

    @property
    def spec(self) -> str:
        return f"{__name__}:{self.name}"

    @property
    def original(self) -> str:
        """The shipped system the mutant changes (its change says which): where the lab
        shows each exported reproducer passing."""
        return self.changes.split(":", 1)[0]

    @property
    def needs_power_loss(self) -> bool:
        """Its evidence needs the power-loss disk (Linux FUSE)."""
        return self.evidence in (POWER_LOSS_CAMPAIGN, DISK_FAULT_RUNS)


#: The names of the lab's kinds of evidence, as mutants.json reports them.
CRASH_CAMPAIGN = "crash campaign"
POWER_LOSS_CAMPAIGN = "power-loss campaign"
#: Each step of a small workload under a failed fsync of one operation per call, then a
#: power cut (``lab.campaign.diskfaults``; the mutants runner says which fault and steps).
DISK_FAULT_RUNS = "disk-fault runs"
PROBES = "fencing probes"
MODEL = "model workload"
CHAOS = "chaos"

MUTANTS = (
    Mutant(
        "no_fencing", "sqlite: an acknowledgement of a leased job counts whoever sends it", PROBES
    ),
    Mutant("fence_off_by_one", "sqlite: an acknowledgement at now == deadline is accepted", PROBES),
    Mutant(
        "no_retries",
        "sqlite: the first failed or expired attempt dead-letters the job",
        CRASH_CAMPAIGN,
    ),
    Mutant(
        "never_dead", "sqlite: attempts never run out; a poison job is retried for ever", PROBES
    ),
    Mutant(
        "heartbeat_without_event",
        "sqlite: a heartbeat extends the lease and writes no event",
        CRASH_CAMPAIGN,
    ),
    Mutant(
        "heartbeat_in_memory",
        "sqlite: a heartbeat moves the deadline only in its holder's process memory",
        PROBES,
    ),
    Mutant(
        "chained_stale_as_done",
        "sqlite: a stale chained acknowledgement is told it succeeded, as if already applied",
        PROBES,
    ),
    Mutant(
        "carrier_recovery_trusts_any_event",
        "sqlite: an acknowledgement whose carrier died counts as committed on any event under"
        " its lease token",
        PROBES,
    ),
    Mutant(
        "attempts_latest_deadline_is_largest",
        "sqlite: the attempts view reports the largest deadline a lease ever had, not its last",
        PROBES,
    ),
    Mutant(
        "claim_takes_leased_jobs",
        "sqlite: the single-job claim also takes a job whose lease is still live",
        PROBES,
    ),
    Mutant(
        "expiry_without_attempt",
        "sqlite: an expired lease uses up no attempt; a job whose holders keep dying never dies",
        PROBES,
    ),
    Mutant(
        "expiry_drops_job",
        "sqlite: recovery of an expired lease dead-letters the job instead of retrying it",
        CRASH_CAMPAIGN,
    ),
    Mutant(
        "uncapped_backoff",
        "sqlite: the retry delay doubles for ever, past the policy's cap",
        PROBES,
    ),
    Mutant(
        "batch_fences_first_only",
        "sqlite: a batched acknowledgement checks the lease of its first item only",
        PROBES,
    ),
    Mutant(
        "grant_time_fencing",
        "sqlite: a batched acknowledgement fences each job as of the moment its lease was granted",
        PROBES,
    ),
    Mutant(
        "resubmission_creates_job",
        "sqlite: submitting a finished job's key creates a new job",
        PROBES,
    ),
    Mutant(
        "synchronous_normal",
        "sqlite: PRAGMA synchronous=NORMAL after opening",
        POWER_LOSS_CAMPAIGN,
    ),
    Mutant(
        "torn_tail_is_corruption",
        "walqueue: a torn final frame is refused as corruption",
        CRASH_CAMPAIGN,
    ),
    Mutant(
        "newest_snapshot_wins",
        "walqueue: the newest snapshot file is trusted, whether CURRENT names it or not",
        POWER_LOSS_CAMPAIGN,
    ),
    Mutant(
        "wal_without_fsync",
        "walqueue: WAL frames are written and never fsynced",
        POWER_LOSS_CAMPAIGN,
    ),
    Mutant(
        "current_without_directory_sync",
        "walqueue: compaction renames CURRENT without fsyncing the directory",
        POWER_LOSS_CAMPAIGN,
    ),
    Mutant(
        "fsync_retried",
        "walqueue: a failed fsync of the WAL is tried again and the retry's success believed"
        " (fsyncgate: the failed one dropped the frame)",
        DISK_FAULT_RUNS,
    ),
)
