"""The SQL of every queue transition, each one a guarded statement.

Guards (``WHERE state = ...``, the live-lease rule from fencing.py) repeat under the write
lock what the caller expects, so a statement either applies to exactly the rows it means
or to none.
"""

from __future__ import annotations

from crashqueuelab.core.fencing import LIVE_LEASE_GUARD
from crashqueuelab.core.rows import JOB_COLUMNS
from crashqueuelab.core.schema import ACTIVE_JOBS

#: The error text recorded when recovery ends an attempt whose lease ran out.
LEASE_EXPIRED_ERROR = "lease expired before the worker acknowledged"

SELECT_JOB = f"SELECT {JOB_COLUMNS} FROM jobs WHERE job_id = ?"
# One statement picks and leases the oldest ready job, so a claim costs no extra round trip.
CLAIM_NEXT = (
    "UPDATE jobs SET state = 'LEASED', attempts = attempts + 1, lease_worker_id = ?,"
    " lease_token = ?, lease_deadline_us = ?, updated_at_us = ?"
    f" WHERE submit_seq = (SELECT submit_seq FROM jobs WHERE {ACTIVE_JOBS} AND state = 'QUEUED'"
    " AND available_at_us <= ? ORDER BY available_at_us, submit_seq LIMIT 1)"
    f" RETURNING {JOB_COLUMNS}"
)
SELECT_EXPIRED = (
    f"SELECT {JOB_COLUMNS} FROM jobs WHERE {ACTIVE_JOBS} AND state = 'LEASED'"
    " AND lease_deadline_us <= ?"
    " ORDER BY lease_deadline_us, submit_seq"
)
SELECT_DUE_RETRIES = (
    f"SELECT {JOB_COLUMNS} FROM jobs WHERE {ACTIVE_JOBS} AND state = 'RETRY_SCHEDULED'"
    " AND available_at_us <= ?"
    " ORDER BY available_at_us, submit_seq"
)
EXTEND_LEASE = (
    "UPDATE jobs SET lease_deadline_us = ?, updated_at_us = ?"
    f" WHERE job_id = ? AND {LIVE_LEASE_GUARD} RETURNING {JOB_COLUMNS}"
)
# Ending a lease clears its fields in the same statement that leaves LEASED. The holder's
# own operations are guarded by the live-lease rule; recovery by the expired deadline.
END_LEASE_SET = (
    "UPDATE jobs SET state = ?, available_at_us = coalesce(?, available_at_us),"
    " last_error = coalesce(?, last_error), lease_worker_id = NULL, lease_token = NULL,"
    " lease_deadline_us = NULL, updated_at_us = ?"
)
END_LIVE_LEASE = f"{END_LEASE_SET} WHERE job_id = ? AND {LIVE_LEASE_GUARD} RETURNING {JOB_COLUMNS}"
END_EXPIRED_LEASE = (
    f"{END_LEASE_SET} WHERE submit_seq = ? AND state = 'LEASED' AND lease_token = ?"
    " AND lease_deadline_us <= ?"
    f" RETURNING {JOB_COLUMNS}"
)
PROMOTE = (
    "UPDATE jobs SET state = 'QUEUED', updated_at_us = ?"
    " WHERE submit_seq = ? AND state = 'RETRY_SCHEDULED'"
)
