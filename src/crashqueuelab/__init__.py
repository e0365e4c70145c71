"""crashqueuelab: what a durable job queue does when processes die at the worst moment.

The names below are imported when first used: a process that needs one module of the lab
(a crash child, the power-loss disk's file system) does not pay for the whole queue.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

#: Where each public name lives.
_HOMES: dict[str, tuple[str, ...]] = {
    "crashqueuelab.core.clock": ("Clock", "ManualClock", "SystemClock"),
    "crashqueuelab.core.errors": (
        "CrashQueueLabError",
        "DurabilityUnavailable",
        "HistoryUnprotected",
        "IdempotencyConflict",
        "InvalidInput",
        "JobNotFound",
        "NotADatabase",
        "SchemaMismatch",
        "StaleLease",
        "StaleReason",
        "StoreError",
        "StoreNotFound",
        "UpgradeRefused",
    ),
    "crashqueuelab.core.hooks": ("Hook", "Phase"),
    "crashqueuelab.core.ids": ("IdGenerator", "RandomIds", "SeededIds"),
    "crashqueuelab.core.models": (
        "Attempt",
        "AttemptOutcome",
        "ClaimedJob",
        "Event",
        "EventType",
        "Job",
        "JobState",
        "SubmitResult",
    ),
    "crashqueuelab.core.queue": ("DurableQueue",),
    "crashqueuelab.core.retry": ("RetryPolicy",),
    "crashqueuelab.core.upgrade": ("UpgradeResult", "upgrade_store"),
    "crashqueuelab.judges.invariants": ("InvariantReport", "check_database"),
    "crashqueuelab.judges.replay": ("ReplayReport", "replay_database"),
}
_MODULE_OF = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'crashqueuelab' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_MODULE_OF])


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
