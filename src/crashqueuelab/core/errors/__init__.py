"""The exception tree: one root, shallow subtrees, each class carrying the data a caller needs.

``queue``: the root and the queue's own errors; ``lab``: what a run needs and cannot have
here. Both are importable from here, where every caller names them.

The crash-simulation signal of the fault lab deliberately does not derive from
``CrashQueueLabError`` (nor from ``Exception``), so no ``except`` clause written for
queue errors can swallow a simulated process death.
"""

from crashqueuelab.core.errors.lab import (
    CrashModeUnavailable,
    OperationUnsupported,
    ServerUnavailable,
    SystemUnavailable,
    install_hint,
)
from crashqueuelab.core.errors.queue import (
    CrashQueueLabError,
    DurabilityUnavailable,
    HistoryUnprotected,
    IdempotencyConflict,
    InvalidInput,
    JobNotFound,
    NotADatabase,
    OutcomeUnknown,
    SchemaMismatch,
    StaleLease,
    StaleReason,
    StoreError,
    StoreNotFound,
    UpgradeRefused,
)

__all__ = [
    "CrashModeUnavailable",
    "CrashQueueLabError",
    "DurabilityUnavailable",
    "HistoryUnprotected",
    "IdempotencyConflict",
    "InvalidInput",
    "JobNotFound",
    "NotADatabase",
    "OperationUnsupported",
    "OutcomeUnknown",
    "SchemaMismatch",
    "ServerUnavailable",
    "StaleLease",
    "StaleReason",
    "StoreError",
    "StoreNotFound",
    "SystemUnavailable",
    "UpgradeRefused",
    "install_hint",
]
