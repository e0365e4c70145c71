"""crashqueuelab: what a durable job queue does when processes die at the worst moment."""

from crashqueuelab.core.clock import Clock, ManualClock, SystemClock
from crashqueuelab.core.errors import (
    CrashQueueLabError,
    DurabilityUnavailable,
    HistoryUnprotected,
    IdempotencyConflict,
    InvalidInput,
    JobNotFound,
    NotADatabase,
    SchemaMismatch,
    StaleLease,
    StaleReason,
    StoreError,
    StoreNotFound,
    UpgradeRefused,
)
from crashqueuelab.core.hooks import Hook, Phase
from crashqueuelab.core.ids import IdGenerator, RandomIds, SeededIds
from crashqueuelab.core.models import (
    Attempt,
    AttemptOutcome,
    ClaimedJob,
    Event,
    EventType,
    Job,
    JobState,
    SubmitResult,
)
from crashqueuelab.core.queue import DurableQueue
from crashqueuelab.core.retry import RetryPolicy
from crashqueuelab.core.upgrade import UpgradeResult, upgrade_store
from crashqueuelab.judges.invariants import InvariantReport, check_database
from crashqueuelab.judges.replay import ReplayReport, replay_database

__version__ = "0.1.0"

__all__ = [
    "Attempt",
    "AttemptOutcome",
    "ClaimedJob",
    "Clock",
    "CrashQueueLabError",
    "DurabilityUnavailable",
    "DurableQueue",
    "Event",
    "EventType",
    "HistoryUnprotected",
    "Hook",
    "IdGenerator",
    "IdempotencyConflict",
    "InvalidInput",
    "InvariantReport",
    "Job",
    "JobNotFound",
    "JobState",
    "ManualClock",
    "NotADatabase",
    "Phase",
    "RandomIds",
    "ReplayReport",
    "RetryPolicy",
    "SchemaMismatch",
    "SeededIds",
    "StaleLease",
    "StaleReason",
    "StoreError",
    "StoreNotFound",
    "SubmitResult",
    "SystemClock",
    "UpgradeRefused",
    "UpgradeResult",
    "check_database",
    "replay_database",
    "upgrade_store",
]
