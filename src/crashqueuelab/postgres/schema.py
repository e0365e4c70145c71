"""The PostgreSQL queue's tables, one schema per store, and the trigger that freezes history.

``jobs`` is the current state and ``events`` the append-only explanation of how every row
got there: each transition writes both in one statement. The trigger refuses UPDATE,
DELETE and TRUNCATE on ``events``; the queue checks at open that it is in place.
"""

from __future__ import annotations

import re

#: A schema name the queue creates and accepts: never quoted, never user text.
SCHEMA_NAME = re.compile(r"^cql_[0-9a-f]{16}$")
SCHEMA_VERSION = 1
#: The comment on the schema that marks it as ours, with its version.
SCHEMA_MARK = f"crashqueuelab postgres queue v{SCHEMA_VERSION}"
APPEND_ONLY_TRIGGERS = ("events_append_only", "events_no_truncate")

_STATES = "'QUEUED', 'LEASED', 'RETRY_SCHEDULED', 'SUCCEEDED', 'DEAD'"


def create_statements(schema: str) -> tuple[str, ...]:
    """The DDL of one store, in order (``schema`` is checked against SCHEMA_NAME first)."""
    if not SCHEMA_NAME.match(schema):
        raise ValueError(f"not a queue schema name: {schema!r}")
    return (
        f"CREATE SCHEMA {schema}",
        f"COMMENT ON SCHEMA {schema} IS '{SCHEMA_MARK}'",
        f"""
        CREATE TABLE {schema}.jobs (
            submit_seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            job_id text NOT NULL UNIQUE,
            idempotency_key text NOT NULL UNIQUE,
            job_type text NOT NULL,
            payload_json text NOT NULL,
            payload_sha256 text NOT NULL,
            state text NOT NULL CHECK (state IN ({_STATES})),
            attempts integer NOT NULL CHECK (attempts >= 0),
            max_attempts integer NOT NULL CHECK (max_attempts >= 1),
            available_at_us bigint NOT NULL,
            lease_worker_id text,
            lease_token text,
            lease_deadline_us bigint,
            last_error text,
            created_at_us bigint NOT NULL,
            updated_at_us bigint NOT NULL
        )
        """,
        # Claims take the oldest ready job; recovery the overdue leases; promotion the due
        # retries. Each partial index holds only the live jobs of its state.
        f"""CREATE INDEX jobs_ready ON {schema}.jobs (available_at_us, submit_seq)
            WHERE state = 'QUEUED'""",
        f"""CREATE INDEX jobs_leased ON {schema}.jobs (lease_deadline_us)
            WHERE state = 'LEASED'""",
        f"""CREATE INDEX jobs_retrying ON {schema}.jobs (available_at_us)
            WHERE state = 'RETRY_SCHEDULED'""",
        f"""
        CREATE TABLE {schema}.events (
            seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            job_id text NOT NULL REFERENCES {schema}.jobs (job_id),
            event_type text NOT NULL,
            from_state text CHECK (from_state IS NULL OR from_state IN ({_STATES})),
            to_state text NOT NULL CHECK (to_state IN ({_STATES})),
            at_us bigint NOT NULL,
            attempt integer NOT NULL,
            worker_id text,
            lease_token text,
            lease_deadline_us bigint,
            available_at_us bigint,
            error text
        )
        """,
        f"CREATE INDEX events_by_job ON {schema}.events (job_id, seq)",
        f"""
        CREATE FUNCTION {schema}.refuse_history_change() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'events are append-only';
        END
        $$
        """,
        f"""CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON {schema}.events
            FOR EACH ROW EXECUTE FUNCTION {schema}.refuse_history_change()""",
        f"""CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON {schema}.events
            FOR EACH STATEMENT EXECUTE FUNCTION {schema}.refuse_history_change()""",
    )
