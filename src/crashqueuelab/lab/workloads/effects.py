"""The effect ledger: a synthetic external destination in its own SQLite database.

It stands for whatever a job changes outside the queue (a payment, an e-mail, a row in
another service). Because it is a separate database, committing an effect and acknowledging
the job are two transactions, and a crash between them is the window the lab exposes.

Two destinations:
- ``IDEMPOTENT``: the effect key is unique; applying a key again records no new effect and
  reports the duplicate (it is counted in ``absorbed``, so executions stay visible);
- ``NON_IDEMPOTENT``: every application appends an effect.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from crashqueuelab.core.clock import Clock, SystemClock
from crashqueuelab.core.errors import StoreError
from crashqueuelab.core.handle import DatabaseHandle
from crashqueuelab.core.hooks import Hook, Phase, no_hook
from crashqueuelab.core.schema import SchemaSpec
from crashqueuelab.core.storage import DEFAULT_BUSY_TIMEOUT_MS
from crashqueuelab.core.validation import require_int, require_name


class Destination(StrEnum):
    """How the destination treats a repeated effect key."""

    IDEMPOTENT = "idempotent"
    NON_IDEMPOTENT = "non_idempotent"


LEDGER_SCHEMA = SchemaSpec(
    name="crashqueuelab effect ledger",
    application_id=0x43514C45,  # "CQLE"
    version=1,
    statements=(
        "CREATE TABLE ledger (singleton INTEGER PRIMARY KEY CHECK (singleton = 1),"
        " destination TEXT NOT NULL CHECK (destination IN ('idempotent', 'non_idempotent')))",
        """
        CREATE TABLE effects (
            seq INTEGER PRIMARY KEY,
            effect_key TEXT NOT NULL,
            value INTEGER NOT NULL,
            job_id TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            worker_id TEXT NOT NULL,
            applied_at_us INTEGER NOT NULL
        )
        """,
        "CREATE INDEX effects_by_key ON effects (effect_key)",
        # Applications of an idempotent destination that found their key already applied.
        """
        CREATE TABLE absorbed (
            seq INTEGER PRIMARY KEY,
            effect_key TEXT NOT NULL,
            job_id TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            worker_id TEXT NOT NULL,
            applied_at_us INTEGER NOT NULL
        )
        """,
    ),
)


@dataclass(frozen=True)
class EffectResult:
    """What one application did: ``applied`` is False when an idempotent key was a duplicate."""

    effect_key: str
    applied: bool
    effect_count: int


class EffectLedger(DatabaseHandle):
    """One destination's ledger of durable effects."""

    def __init__(
        self,
        path: str | Path,
        *,
        destination: Destination,
        clock: Clock | None = None,
        hook: Hook | None = None,
        create: bool = True,
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
    ) -> None:
        super().__init__(
            path,
            spec=LEDGER_SCHEMA,
            create=create,
            busy_timeout_ms=busy_timeout_ms,
            what="ledger",
        )
        self.destination = Destination(destination)
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._hook: Hook = hook if hook is not None else no_hook
        try:
            self._bind_destination()
        except BaseException:
            self.close()
            raise

    def _bind_destination(self) -> None:
        conn = self.connection
        with self._transaction():
            row = conn.execute("SELECT destination FROM ledger").fetchone()
            if row is None:
                conn.execute(
                    "INSERT INTO ledger (singleton, destination) VALUES (1, ?)",
                    (self.destination.value,),
                )
                if self.destination is Destination.IDEMPOTENT:
                    conn.execute("CREATE UNIQUE INDEX effects_unique_key ON effects (effect_key)")
            elif row[0] != self.destination.value:
                raise StoreError(self.path, f"this ledger is {row[0]}, not {self.destination}")

    def apply(
        self, *, effect_key: str, value: int, job_id: str, attempt: int, worker_id: str
    ) -> EffectResult:
        """Commit one effect (or, for an idempotent destination, recognise a duplicate)."""
        require_name("effect_key", effect_key)
        require_int("value", value, minimum=-(2**63), maximum=2**63 - 1)
        require_name("job_id", job_id)
        require_int("attempt", attempt, minimum=1)
        require_name("worker_id", worker_id)
        conn = self.connection
        now = self._clock.now_us()
        with self._transaction():
            existing = self._count(effect_key)
            if self.destination is Destination.IDEMPOTENT and existing:
                conn.execute(
                    "INSERT INTO absorbed (effect_key, job_id, attempt, worker_id, applied_at_us)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (effect_key, job_id, attempt, worker_id, now),
                )
                applied = False
            else:
                conn.execute(
                    "INSERT INTO effects (effect_key, value, job_id, attempt, worker_id,"
                    " applied_at_us) VALUES (?, ?, ?, ?, ?, ?)",
                    (effect_key, value, job_id, attempt, worker_id, now),
                )
                applied = True
            self._hook(Phase.BEFORE_EFFECT_COMMIT)
        self._hook(Phase.AFTER_EFFECT_COMMIT)
        return EffectResult(effect_key, applied, existing + int(applied))

    def _count(self, effect_key: str) -> int:
        rows = self._read("SELECT count(*) FROM effects WHERE effect_key = ?", (effect_key,))
        return int(rows[0][0])

    def effect_count(self, effect_key: str) -> int:
        """Durable effects recorded for one key."""
        return self._count(effect_key)

    def counts_by_key(self) -> dict[str, int]:
        """Durable effects per key."""
        rows = self._read(
            "SELECT effect_key, count(*) FROM effects GROUP BY effect_key ORDER BY effect_key"
        )
        return {key: int(count) for key, count in rows}

    def absorbed_count(self) -> int:
        """Applications an idempotent destination recognised as duplicates."""
        return int(self._read("SELECT count(*) FROM absorbed")[0][0])
