"""Systems under test: the contract every queue meets for the lab, and the shipped adapters.
``Anomaly`` and ``Kind`` are the findings a ``Documented`` weakness names."""

from crashqueuelab.judges.findings import Anomaly, Kind
from crashqueuelab.systems.contract import (
    AttemptsClient,
    AttemptView,
    Capabilities,
    ChainingClient,
    Claim,
    Documented,
    Hook,
    JobSpec,
    JobStatus,
    JobView,
    LibraryWorker,
    OpenRequest,
    OwnWorker,
    QueueClient,
    Reader,
    StoredJob,
    StoreReading,
    System,
    Verdict,
)
from crashqueuelab.systems.crashpoints import (
    CrashPoint,
    ExpectedState,
)
from crashqueuelab.systems.registry import DEFAULT_SYSTEM, SHIPPED, resolve_system

__all__ = [
    "DEFAULT_SYSTEM",
    "SHIPPED",
    "Anomaly",
    "AttemptView",
    "AttemptsClient",
    "Capabilities",
    "ChainingClient",
    "Claim",
    "CrashPoint",
    "Documented",
    "ExpectedState",
    "Hook",
    "JobSpec",
    "JobStatus",
    "JobView",
    "Kind",
    "LibraryWorker",
    "OpenRequest",
    "OwnWorker",
    "QueueClient",
    "Reader",
    "StoreReading",
    "StoredJob",
    "System",
    "Verdict",
    "resolve_system",
]
