"""Systems under test: the contract every queue meets for the lab, and the shipped adapters."""

from crashqueuelab.systems.contract import (
    Capabilities,
    Claim,
    CrashPoint,
    ExpectedState,
    Hook,
    JobSpec,
    JobStatus,
    JobView,
    OpenRequest,
    QueueClient,
    Reader,
    StoredJob,
    StoreReading,
    System,
    Verdict,
)
from crashqueuelab.systems.registry import DEFAULT_SYSTEM, SHIPPED, resolve_system

__all__ = [
    "DEFAULT_SYSTEM",
    "SHIPPED",
    "Capabilities",
    "Claim",
    "CrashPoint",
    "ExpectedState",
    "Hook",
    "JobSpec",
    "JobStatus",
    "JobView",
    "OpenRequest",
    "QueueClient",
    "Reader",
    "StoreReading",
    "StoredJob",
    "System",
    "Verdict",
    "resolve_system",
]
