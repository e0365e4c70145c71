"""The root of the exception tree, and the queue's own errors: bad input, conflicts, fenced
lease holders, and stores that cannot serve."""

from __future__ import annotations

from enum import StrEnum


class CrashQueueLabError(Exception):
    """Raised for every failure the library reports on purpose."""

    #: A stable machine-readable name used by the JSON CLI.
    kind = "CrashQueueLabError"


class InvalidInput(CrashQueueLabError):
    """Raised when an argument is malformed; nothing has been written."""

    kind = "InvalidInput"

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class IdempotencyConflict(CrashQueueLabError):
    """Raised when an idempotency key is reused for a different request."""

    kind = "IdempotencyConflict"

    def __init__(self, idempotency_key: str, job_id: str, differing: tuple[str, ...]) -> None:
        super().__init__(
            f"idempotency key {idempotency_key!r} already names job {job_id} "
            f"with a different {', '.join(differing)}"
        )
        self.idempotency_key = idempotency_key
        self.job_id = job_id
        self.differing = differing


class JobNotFound(CrashQueueLabError):
    """Raised when no job has the given id."""

    kind = "JobNotFound"

    def __init__(self, job_id: str) -> None:
        super().__init__(f"no job with id {job_id!r}")
        self.job_id = job_id


class StaleReason(StrEnum):
    """Why a lease-holder operation was fenced off."""

    NOT_LEASED = "not_leased"
    WRONG_WORKER = "wrong_worker"
    WRONG_TOKEN = "wrong_token"
    LEASE_EXPIRED = "lease_expired"


class StaleLease(CrashQueueLabError):
    """Raised when a heartbeat, success or failure does not come from the live lease holder."""

    kind = "StaleLease"

    def __init__(self, job_id: str, worker_id: str, reason: StaleReason, detail: str) -> None:
        super().__init__(f"job {job_id}: {reason.value}: {detail}")
        self.job_id = job_id
        self.worker_id = worker_id
        self.reason = reason
        self.detail = detail


class StoreError(CrashQueueLabError):
    """Raised when the database file cannot serve as a queue store."""

    kind = "StoreError"

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path


class OutcomeUnknown(StoreError):
    """Raised when a transaction's COMMIT was sent and the server could not be asked, in
    time, whether it happened: the caller must treat it as neither done nor not done."""

    kind = "OutcomeUnknown"


class StoreNotFound(StoreError):
    """Raised when a command that must not create a database finds none."""

    kind = "StoreNotFound"

    def __init__(self, path: str) -> None:
        super().__init__(path, "no database at this path (it is not created for this command)")


class NotADatabase(StoreError):
    """Raised when the file exists but is not an SQLite database."""

    kind = "NotADatabase"

    def __init__(self, path: str) -> None:
        super().__init__(path, "file is not an SQLite database")


class SchemaMismatch(StoreError):
    """Raised when the database holds another schema or another schema version."""

    kind = "SchemaMismatch"

    def __init__(
        self,
        path: str,
        found: int,
        expected: int,
        detail: str = "",
        *,
        application_ids: tuple[int, int] | None = None,
    ) -> None:
        if application_ids is not None:
            # Another program's file (or another kind of ours): its identity says so.
            found_id, expected_id = application_ids
            message = f"application_id {found_id:#010x}, expected {expected_id:#010x}"
        else:
            message = f"schema version {found}, expected {expected}"
        super().__init__(path, f"{message}: {detail}" if detail else message)
        self.found = found
        self.expected = expected


class DurabilityUnavailable(StoreError):
    """Raised when SQLite refuses a durability pragma (WAL, synchronous=FULL, foreign keys)."""

    kind = "DurabilityUnavailable"

    def __init__(self, path: str, pragma: str, wanted: str, got: str) -> None:
        super().__init__(path, f"PRAGMA {pragma} is {got!r}, wanted {wanted!r}")
        self.pragma = pragma
        self.wanted = wanted
        self.got = got


class HistoryUnprotected(StoreError):
    """Raised when the triggers that make the event history append-only are missing."""

    kind = "HistoryUnprotected"

    def __init__(self, path: str, missing: tuple[str, ...]) -> None:
        super().__init__(path, f"append-only triggers missing: {', '.join(missing)}")
        self.missing = missing


class UpgradeRefused(StoreError):
    """Raised when a store's stored attempt rows are not what its events say: upgrading it
    would drop rows that nothing else records, so it is left as it was."""

    kind = "UpgradeRefused"

    def __init__(self, path: str, mismatched_rows: int) -> None:
        super().__init__(
            path,
            f"{mismatched_rows} attempt rows differ from what the events say;"
            " `crashqueuelab replay` names them",
        )
        self.mismatched_rows = mismatched_rows
