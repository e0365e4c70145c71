"""The database schema: two tables, their indexes, a view, and the triggers that freeze history.

``jobs`` is the materialised current state; ``events`` is the append-only explanation of
how every row got where it is; ``attempts`` is a view with one row per claim, derived from
the events (each attempt is a CLAIMED event, its deadline moved by HEARTBEAT events and
ended by a SUCCEEDED, FAILED or LEASE_EXPIRED event of the same attempt number). The
judges read these tables with their own SQL and do not import this module.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SchemaSpec:
    """What identifies one kind of database, and how to create it."""

    name: str
    application_id: int
    version: int
    statements: tuple[str, ...]
    required_triggers: tuple[str, ...] = ()
    #: The older version that can be upgraded in place (upgrade.py), if any.
    upgrade_from: int | None = None


#: Stored in PRAGMA user_version; a database with another value is refused. Version 2 has
#: version 1's tables and columns; only how its constraints are written changed (below).
#: Version 3 derives the attempts from the events instead of storing them a second time:
#: the attempt rows were a copy of what the events already say (replay rebuilt every one
#: of them from the events and compared), and writing them cost a sixth of the batched
#: path's time (docs/performance.md).
SCHEMA_VERSION = 3
#: Stored in PRAGMA application_id ("CQL1"), so a foreign database is never mistaken for ours.
APPLICATION_ID = 0x43514C31

#: Triggers whose absence means history could be rewritten.
APPEND_ONLY_TRIGGERS = ("events_no_update", "events_no_delete")


def one_of(column: str, values: tuple[str, ...]) -> str:
    """``column`` equal to one of ``values``, written as comparisons joined by OR.

    Not ``column IN (...)``: SQLite builds a temporary b-tree for a list of more than two
    constants each time a statement runs, and ``executemany`` runs it once per row. Measured
    here, that tripled the cost of every insert and update that checks a state.
    """
    return "(" + " OR ".join(f"{column} = '{value}'" for value in values) + ")"


_STATES = ("QUEUED", "LEASED", "RETRY_SCHEDULED", "SUCCEEDED", "DEAD")
#: Events that set an attempt's lease deadline, and those that end an attempt.
_LEASE_SETTERS = ("CLAIMED", "HEARTBEAT")
_LEASE_ENDINGS = ("SUCCEEDED", "FAILED", "LEASE_EXPIRED")

#: The partial index's condition. A query whose WHERE clause says ``state = 'QUEUED'`` (or
#: either other live state) implies one side of this OR, which lets SQLite use the index;
#: queries over every live job repeat the term verbatim.
ACTIVE_JOBS = one_of("state", ("QUEUED", "LEASED", "RETRY_SCHEDULED"))

#: The attempts, derived from the events: each CLAIMED event opens one, a HEARTBEAT of the
#: same attempt number moves its deadline, and a SUCCEEDED, FAILED or LEASE_EXPIRED event of
#: that number ends it. Read through events_by_job, one job's attempts cost one look at its
#: own events.
ATTEMPTS_DERIVATION = f"""
    SELECT claim.job_id, claim.attempt, claim.worker_id, claim.lease_token, claim.at_us,
        (
            SELECT lease.lease_deadline_us FROM events AS lease
            WHERE lease.job_id = claim.job_id AND lease.attempt = claim.attempt
            AND {one_of("lease.event_type", _LEASE_SETTERS)}
            ORDER BY lease.seq DESC LIMIT 1
        ),
        ending.at_us,
        CASE ending.event_type WHEN 'LEASE_EXPIRED' THEN 'EXPIRED' ELSE ending.event_type END,
        ending.error
    FROM events AS claim
    LEFT JOIN events AS ending ON ending.job_id = claim.job_id
        AND ending.attempt = claim.attempt AND {one_of("ending.event_type", _LEASE_ENDINGS)}
    WHERE claim.event_type = 'CLAIMED'
"""
#: The columns of an attempt, as versions 1 and 2 stored them and the view names them.
ATTEMPT_FIELDS = (
    "job_id, attempt, worker_id, lease_token, claimed_at_us, lease_deadline_us,"
    " ended_at_us, outcome, error"
)
ATTEMPTS_VIEW = f"CREATE VIEW attempts ({ATTEMPT_FIELDS}) AS {ATTEMPTS_DERIVATION}"


STATEMENTS: tuple[str, ...] = (
    f"""
    CREATE TABLE jobs (
        submit_seq INTEGER PRIMARY KEY,
        job_id TEXT NOT NULL UNIQUE,
        idempotency_key TEXT NOT NULL UNIQUE,
        job_type TEXT NOT NULL,
        payload_json TEXT NOT NULL,
        payload_sha256 TEXT NOT NULL,
        state TEXT NOT NULL CHECK {one_of("state", _STATES)},
        attempts INTEGER NOT NULL CHECK (attempts >= 0),
        max_attempts INTEGER NOT NULL CHECK (max_attempts >= 1),
        available_at_us INTEGER NOT NULL,
        lease_worker_id TEXT,
        lease_token TEXT,
        lease_deadline_us INTEGER,
        last_error TEXT,
        created_at_us INTEGER NOT NULL,
        updated_at_us INTEGER NOT NULL
    )
    """,
    # Serves claim (QUEUED by ready time, then submit order), promotion (RETRY_SCHEDULED) and
    # recovery (LEASED). Finished jobs leave the index, so it stays as small as the live work
    # and a transition rewrites as few index pages as possible.
    f"CREATE INDEX jobs_active ON jobs (state, available_at_us, submit_seq) WHERE {ACTIVE_JOBS}",
    f"""
    CREATE TABLE events (
        seq INTEGER PRIMARY KEY,
        job_id TEXT NOT NULL REFERENCES jobs (job_id),
        event_type TEXT NOT NULL,
        from_state TEXT CHECK (from_state IS NULL OR {one_of("from_state", _STATES)}),
        to_state TEXT NOT NULL CHECK {one_of("to_state", _STATES)},
        at_us INTEGER NOT NULL,
        attempt INTEGER NOT NULL,
        worker_id TEXT,
        lease_token TEXT,
        lease_deadline_us INTEGER,
        available_at_us INTEGER,
        error TEXT,
        detail TEXT
    )
    """,
    "CREATE INDEX events_by_job ON events (job_id, seq)",
    ATTEMPTS_VIEW,
    """
    CREATE TRIGGER events_no_update BEFORE UPDATE ON events
    BEGIN SELECT RAISE(ABORT, 'events are append-only'); END
    """,
    """
    CREATE TRIGGER events_no_delete BEFORE DELETE ON events
    BEGIN SELECT RAISE(ABORT, 'events are append-only'); END
    """,
)

QUEUE_SCHEMA = SchemaSpec(
    name="crashqueuelab queue",
    application_id=APPLICATION_ID,
    version=SCHEMA_VERSION,
    statements=STATEMENTS,
    required_triggers=APPEND_ONLY_TRIGGERS,
    upgrade_from=2,
)
