"""Every transition of the PostgreSQL queue as one guarded statement.

Each statement changes the job rows and appends their events together (data-modifying
CTEs), so a transition is never half written, whatever kills the client. The guards sit in
the UPDATE's WHERE: under READ COMMITTED, PostgreSQL re-evaluates them on the newest row
version once it holds the row lock, so a stale holder matches nothing. Claims and the
maintenance scans take rows with ``FOR UPDATE SKIP LOCKED``: workers never queue behind
each other's claims. Names are unqualified: each connection's search_path is its store's
schema.
"""

from __future__ import annotations


def _sql(text: str) -> bytes:
    # psycopg takes composed text as bytes (its str queries must be literals for the type
    # checker); every constant here is fixed text with placeholders, never user input.
    return text.encode()


JOB_COLUMNS = (
    "job_id, idempotency_key, job_type, payload_json, state, attempts, max_attempts,"
    " available_at_us, lease_worker_id, lease_token, lease_deadline_us, last_error"
)

#: The error an expired lease leaves on its job.
LEASE_EXPIRED_ERROR = "lease expired"

#: ``min(base * 2 ** (attempts - 1), max)`` as RetryPolicy computes it, in numeric (a job
#: retried a thousand times must not overflow bigint).
_RETRY_AT = (
    "%(now)s + least(%(base)s::numeric * power(2::numeric, least(jobs.attempts - 1, 64)),"
    " %(max)s)::bigint"
)
_AFTER_ATTEMPT_STATE = (
    "CASE WHEN jobs.attempts >= jobs.max_attempts THEN 'DEAD' ELSE 'RETRY_SCHEDULED' END"
)
_AFTER_ATTEMPT_AVAILABLE = (
    f"CASE WHEN jobs.attempts >= jobs.max_attempts THEN jobs.available_at_us ELSE {_RETRY_AT} END"
)
_END_LEASE = "lease_worker_id = NULL, lease_token = NULL, lease_deadline_us = NULL"
_LIVE_LEASE = (
    "jobs.state = 'LEASED' AND jobs.lease_worker_id = %(worker)s"
    " AND jobs.lease_token = %(token)s AND jobs.lease_deadline_us > %(now)s"
)

SUBMIT = _sql("""
WITH created AS (
    INSERT INTO jobs (job_id, idempotency_key, job_type, payload_json, payload_sha256, state,
                      attempts, max_attempts, available_at_us, created_at_us, updated_at_us)
    VALUES (%(job_id)s, %(key)s, %(job_type)s, %(payload)s, %(sha256)s, 'QUEUED',
            0, %(max_attempts)s, %(now)s, %(now)s, %(now)s)
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING job_id
), logged AS (
    INSERT INTO events (job_id, event_type, from_state, to_state, at_us, attempt,
                        available_at_us)
    SELECT job_id, 'SUBMITTED', NULL, 'QUEUED', %(now)s, 0, %(now)s FROM created
)
SELECT job_id FROM created
""")

#: What an earlier submission under the same key recorded, to refuse a different job (a
#: statement of its own: it must see a row that a concurrent submitter committed).
SUBMITTED_AS = _sql(
    "SELECT job_id, job_type, payload_sha256, max_attempts FROM jobs WHERE idempotency_key = %s"
)

CLAIM = _sql(f"""
WITH picked AS (
    SELECT submit_seq FROM jobs
    WHERE state = 'QUEUED' AND available_at_us <= %(now)s
    ORDER BY available_at_us, submit_seq
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), numbered AS (
    SELECT submit_seq, row_number() OVER (ORDER BY submit_seq) AS n FROM picked
), leased AS (
    UPDATE jobs SET state = 'LEASED', attempts = jobs.attempts + 1,
        lease_worker_id = %(worker)s, lease_token = (%(tokens)s::text[])[numbered.n],
        lease_deadline_us = %(deadline)s, last_error = NULL, updated_at_us = %(now)s
    FROM numbered
    WHERE jobs.submit_seq = numbered.submit_seq AND jobs.state = 'QUEUED'
    RETURNING jobs.*
), logged AS (
    INSERT INTO events (job_id, event_type, from_state, to_state, at_us, attempt, worker_id,
                        lease_token, lease_deadline_us)
    SELECT job_id, 'CLAIMED', 'QUEUED', 'LEASED', %(now)s, attempts, lease_worker_id,
           lease_token, lease_deadline_us
    FROM leased
)
SELECT {JOB_COLUMNS} FROM leased ORDER BY available_at_us, submit_seq
""")

HEARTBEAT = _sql(f"""
WITH extended AS (
    UPDATE jobs SET lease_deadline_us = %(deadline)s, updated_at_us = %(now)s
    WHERE jobs.job_id = %(job_id)s AND {_LIVE_LEASE}
    RETURNING job_id, attempts
)
INSERT INTO events (job_id, event_type, from_state, to_state, at_us, attempt, worker_id,
                    lease_token, lease_deadline_us)
SELECT job_id, 'HEARTBEAT', 'LEASED', 'LEASED', %(now)s, attempts, %(worker)s, %(token)s,
       %(deadline)s
FROM extended
RETURNING job_id
""")

#: Each acknowledgement of a batch is fenced on its own lease: a stale one matches no row.
SUCCEED = _sql(f"""
WITH acks AS (
    SELECT * FROM unnest(%(job_ids)s::text[], %(workers)s::text[], %(tokens)s::text[])
        AS a(job_id, worker_id, lease_token)
), done AS (
    UPDATE jobs SET state = 'SUCCEEDED', {_END_LEASE}, updated_at_us = %(now)s
    FROM acks
    WHERE jobs.job_id = acks.job_id AND jobs.state = 'LEASED'
      AND jobs.lease_worker_id = acks.worker_id AND jobs.lease_token = acks.lease_token
      AND jobs.lease_deadline_us > %(now)s
    RETURNING jobs.job_id, jobs.attempts, acks.worker_id, acks.lease_token
), logged AS (
    INSERT INTO events (job_id, event_type, from_state, to_state, at_us, attempt, worker_id,
                        lease_token)
    SELECT job_id, 'SUCCEEDED', 'LEASED', 'SUCCEEDED', %(now)s, attempts, worker_id,
           lease_token
    FROM done
)
SELECT job_id, worker_id, lease_token FROM done
""")

FAIL = _sql(f"""
WITH failed AS (
    UPDATE jobs SET state = {_AFTER_ATTEMPT_STATE},
        available_at_us = {_AFTER_ATTEMPT_AVAILABLE},
        {_END_LEASE}, last_error = %(error)s, updated_at_us = %(now)s
    WHERE jobs.job_id = %(job_id)s AND {_LIVE_LEASE}
    RETURNING jobs.job_id, jobs.state, jobs.attempts, jobs.available_at_us
)
INSERT INTO events (job_id, event_type, from_state, to_state, at_us, attempt, worker_id,
                    lease_token, available_at_us, error)
SELECT job_id, 'FAILED', 'LEASED', state, %(now)s, attempts, %(worker)s, %(token)s,
       CASE WHEN state = 'DEAD' THEN NULL ELSE available_at_us END, %(error)s
FROM failed
RETURNING to_state
""")

RECOVER_EXPIRED = _sql(f"""
WITH overdue AS (
    SELECT submit_seq, lease_worker_id, lease_token FROM jobs
    WHERE state = 'LEASED' AND lease_deadline_us <= %(now)s
    FOR UPDATE SKIP LOCKED
), expired AS (
    UPDATE jobs SET state = {_AFTER_ATTEMPT_STATE},
        available_at_us = {_AFTER_ATTEMPT_AVAILABLE},
        {_END_LEASE}, last_error = '{LEASE_EXPIRED_ERROR}', updated_at_us = %(now)s
    FROM overdue
    WHERE jobs.submit_seq = overdue.submit_seq AND jobs.state = 'LEASED'
      AND jobs.lease_token = overdue.lease_token
    RETURNING jobs.job_id, jobs.state, jobs.attempts, jobs.available_at_us,
              overdue.lease_worker_id, overdue.lease_token
)
INSERT INTO events (job_id, event_type, from_state, to_state, at_us, attempt, worker_id,
                    lease_token, available_at_us, error)
SELECT job_id, 'LEASE_EXPIRED', 'LEASED', state, %(now)s, attempts, lease_worker_id,
       lease_token, CASE WHEN state = 'DEAD' THEN NULL ELSE available_at_us END,
       '{LEASE_EXPIRED_ERROR}'
FROM expired
RETURNING job_id
""")

PROMOTE = _sql("""
WITH due AS (
    SELECT submit_seq FROM jobs
    WHERE state = 'RETRY_SCHEDULED' AND available_at_us <= %(now)s
    FOR UPDATE SKIP LOCKED
), promoted AS (
    UPDATE jobs SET state = 'QUEUED', updated_at_us = %(now)s
    FROM due
    WHERE jobs.submit_seq = due.submit_seq AND jobs.state = 'RETRY_SCHEDULED'
    RETURNING jobs.job_id, jobs.attempts, jobs.available_at_us
)
INSERT INTO events (job_id, event_type, from_state, to_state, at_us, attempt,
                    available_at_us)
SELECT job_id, 'PROMOTED', 'RETRY_SCHEDULED', 'QUEUED', %(now)s, attempts, available_at_us
FROM promoted
RETURNING job_id
""")

JOB_BY_KEY = _sql(f"SELECT {JOB_COLUMNS} FROM jobs WHERE idempotency_key = %s")
ACTIVE_COUNT = _sql(
    "SELECT count(*) FROM jobs WHERE state IN ('QUEUED', 'LEASED', 'RETRY_SCHEDULED')"
)

#: The running transaction's id, and later whether it committed: the answer to a COMMIT
#: whose reply was lost (PostgreSQL 13 and later).
CURRENT_XID = _sql("SELECT pg_current_xact_id()::text, pg_postmaster_start_time()::text")
SERVER_STARTED = _sql("SELECT pg_postmaster_start_time()::text")
XACT_STATUS = _sql("SELECT pg_xact_status(%s::xid8)")
#: A write of nothing but WAL (a transactional logical message): the transaction gets an id
#: and a commit record, so its COMMIT waits for the synchronous standbys as a job's does. A
#: transaction that only took an id writes no WAL, and PostgreSQL lets it commit at once.
REPLICATION_BARRIER = _sql("SELECT pg_logical_emit_message(true, 'crashqueuelab', 'barrier')")
