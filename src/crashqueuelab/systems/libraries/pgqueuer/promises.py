"""What pgqueuer documents of itself: where it is weaker than the lab's contract.

What pgqueuer does not have, the adapter does not pretend (the system's ``documented``
weaknesses): no token, so a stale holder's completion is accepted; a concurrency limit of 1
serialises the entrypoint across every worker; pgqueuer's time is the server's, so
``recover`` waits ``RETRY_TIMER`` out and a retry's delay is never the lab's. How a failed
attempt is retried depends on the release (``documented_for``): from 1.0 in the database
(``retry_job``), which counts it, but not the hand-outs of the heartbeat timeout; before
1.0 inside the worker process (``RetryWithBackoffEntrypointExecutor``), so a failed attempt
with attempts left stays ``picked`` and the same worker's next claim runs it again (the
retry timer hands it to another worker if this one dies first).
"""

from __future__ import annotations

from crashqueuelab.judges.findings import Kind
from crashqueuelab.systems.contract import Documented

_DOCS = "https://janbjorge.github.io/pgqueuer/"
_HEARTBEAT_DOCS = _DOCS + "guides/heartbeat/"
_CONCURRENCY_DOCS = _DOCS + "guides/concurrency-control/"
_RETRY_DOCS = _DOCS + "guides/retry/"
_RELIABILITY_DOCS = _DOCS + "guides/reliability/"


#: The reports the lab accepts only from a live lease, each accepted from anyone.
_ACCEPTED_FROM_ANYONE = (
    Kind.LATE_ACKNOWLEDGEMENT_ACCEPTED,
    Kind.ACKNOWLEDGEMENT_AT_DEADLINE_ACCEPTED,
    Kind.LATE_FAILURE_REPORT_ACCEPTED,
    Kind.FAILURE_REPORT_AT_DEADLINE_ACCEPTED,
    Kind.DEAD_HEARTBEAT_ACCEPTED,
)

_NO_TOKEN = Documented(
    "no token: pgqueuer logs or heartbeats a job by its id, whoever holds it, and log_jobs"
    " and update_heartbeat answer nothing, so a stale holder's completion or heartbeat is"
    " taken as any other, and one pgqueuer ignored (the job logged already) cannot be told"
    " from one it took",
    _RELIABILITY_DOCS,
    # Chaos: a paused holder's late completion is taken, beside its successor's.
    kinds=(*_ACCEPTED_FROM_ANYONE, Kind.ACKNOWLEDGED_TWICE),
    when={
        # A completion pgqueuer ignored was answered as taken.
        Kind.STORE_DIFFERS: {"told": "succeeded"},
        # The contract's rules (the pytest plugin): nothing pgqueuer answers says a lease
        # ended, so the adapter can only say it was taken.
        Kind.CONTRACT_RULE_FAILED: (
            {
                "point": "the_live_holder_acknowledges_once",
                "assertion": "a second acknowledgement of the same lease answered succeeded*",
            },
            {
                "point": "an_expired_holder_is_refused_and_the_job_goes_to_another",
                "assertion": "w1's late acknowledgement answered succeeded*",
            },
            {
                "point": "an_acknowledgement_at_the_deadline_is_refused",
                "assertion": "an acknowledgement exactly at the lease's deadline answered"
                " succeeded*",
            },
            {
                "point": "a_heartbeat_extends_a_live_lease_only",
                "assertion": "a heartbeat of an acknowledged lease answered True*",
            },
        ),
    },
)
_SERVER_CLOCK = Documented(
    "the retry timer (1.x: heartbeat timeout) runs on the server's clock: a job whose holder"
    " has not sent a heartbeat for that long is handed out again, whatever lease the holder"
    " was given",
    _HEARTBEAT_DOCS,
    # The first holder, still at work, finished it; the second runs it again. In chaos, two
    # live leases at once.
    kinds=(
        Kind.CLAIMED_WHILE_LEASED,
        Kind.CLAIMED_AFTER_ACKNOWLEDGEMENT,
        Kind.OVERLAPPING_LEASES,
    ),
    when={
        Kind.LEASE_LOST_ON_RESTART: {"point": "heartbeat_survives_restart"},
        # The heartbeat experiment: a network fault held the holder's heartbeats.
        Kind.RUN_AGAIN: {"connection_held": True},
    },
)
_SERIAL = Documented(
    "concurrency_limit=1 (the adapter's, as in the stuck-job reports) lets one job of the"
    " entrypoint be picked at a time across every worker: while one is held, no worker is"
    " offered another",
    _CONCURRENCY_DOCS,
    when={
        Kind.CLAIM_NOT_OFFERED: (
            {"point": "batched_acknowledgement_fences_each_item", "offered": "nothing"},
            {"point": "batched_acknowledgement_sees_the_lease_as_it_stands"},
        ),
        Kind.CONTRACT_RULE_FAILED: {
            "point": "a_reopened_store_keeps_every_job_and_lease",
            "assertion": "w1 found nothing to claim while it holds job *",
        },
    },
)

#: The contract's rule of a failed attempt's retry, where a retry is claimable at once.
_RETRY_CLAIMABLE_AT_ONCE = {
    "point": "a_failure_waits_its_delay_then_the_dead_letter_takes_it",
    "assertion": "* claimed job * as attempt 2; nothing may be claimable: the retry's delay"
    " has not passed",
}
_RETRIES_IN_THE_WORKER = Documented(
    "retries happen inside the worker process (RetryWithBackoffEntrypointExecutor): a failed"
    " attempt with attempts left stays picked, and the store keeps no attempt count, so a"
    " job the retry timer hands out again has no limit",
    _RELIABILITY_DOCS,
    # Chaos: a job that kills its worker each time is handed out for ever.
    kinds=(
        Kind.ATTEMPT_BEYOND_LIMIT,
        Kind.EXPIRED_LAST_ATTEMPT_NOT_DEAD,
        Kind.WORK_NEVER_ENDED,
    ),
    when={
        Kind.UNFINISHED: {"poison": True},
        Kind.CONTRACT_RULE_FAILED: {
            "point": "a_failure_waits_its_delay_then_the_dead_letter_takes_it",
            "assertion": "job a after its first attempt failed: the system reports leased"
            " after 1 attempts, not pending after 1 attempts",
        },
    },
)
_UNCOUNTED_HAND_OUTS = Documented(
    "attempts counts the retries a handler asks for (retry_job): a job the heartbeat timeout"
    " hands out again is not counted, so a job whose every holder dies has no limit",
    _RETRY_DOCS,
    kinds=(Kind.EXPIRED_LAST_ATTEMPT_NOT_DEAD, Kind.WORK_NEVER_ENDED),
    when={
        # Past the limit only by attempts no holder reported; one past it by failures is not.
        Kind.ATTEMPT_BEYOND_LIMIT: {"past_the_limit_by_unreported_attempts": True},
        # Chaos: a job that kills its worker each time is handed out for ever, and the
        # poison jobs whose turn never came are left with attempts to spare.
        Kind.UNFINISHED: (
            {"poison": True, "behaviour": "die"},
            {"poison": True, "attempts_left": True},
        ),
    },
)
_RETRY_DELAY_ON_THE_SERVER = Documented(
    "a retry's delay runs on the server's clock (execute_after), which the lab's clock does"
    " not move: the adapter asks for none, so a failed job is queued again at once",
    _RETRY_DOCS,
    when={Kind.CONTRACT_RULE_FAILED: _RETRY_CLAIMABLE_AT_ONCE},
)

_CONNECTION = Documented(
    "a queue manager whose connection to the server breaks (a server restart, a reset, an"
    " answer lost on the way) raises and stops; pgqueuer starts it again only when asked"
    " (pgq run --restart-on-failure, off by default), as the lab's chaos respawns workers",
    _DOCS,
    when={
        Kind.WORKER_EXITED: {
            "status": 3,
            "error": (
                "*before or while processing the request.*",
                "*server closed the connection*",
                "*the connection is lost*",
                "*the connection is closed*",
                "*terminating connection due to administrator command*",
            ),
        }
    },
)

_KILLED_MID_JOB = Documented(
    "a worker killed mid-job leaves its job picked with a stale heartbeat, and a recovered"
    ' job runs again from the start (reliability guide: "If a worker process crashes'
    ' mid-job, the job remains in `picked` state with a stale heartbeat"; "A recovered job'
    ' will run again from the start"): one whose handler returned but whose completion was'
    " not yet logged (pgqueuer buffers completions) when the deploy's SIGKILL came, or when"
    " the worker crashed on its lost connection, runs twice",
    _RELIABILITY_DOCS,
    when={
        Kind.RAN_TWICE: (
            {"worker_then": "sigkilled", "acknowledged": "unknown"},
            {"worker_then": "crashed", "acknowledged": "unknown"},
        )
    },
)

_EARLIEST = Documented(
    '`execute_after` is the earliest time, no latest ("`execute_after` specifies the'
    ' **earliest** time a job can be picked for execution"; "deferred jobs are never picked'
    " early\"): a due job waits for a worker's next dequeue and for a free slot",
    _DOCS + "guides/deferred-execution/",
    when={Kind.SCHEDULED_LATE: {}},
)


def documented_for(retries_in_store: bool) -> tuple[Documented, ...]:
    """What a pgqueuer system documents: a release that retries in the database (1.0 on)
    counts its retries and delays them on the server's clock; one before retries in the
    worker's process."""
    retries = (
        (_UNCOUNTED_HAND_OUTS, _RETRY_DELAY_ON_THE_SERVER)
        if retries_in_store
        else (_RETRIES_IN_THE_WORKER,)
    )
    return (
        _NO_TOKEN,
        _SERVER_CLOCK,
        _SERIAL,
        *retries,
        _CONNECTION,
        _KILLED_MID_JOB,
        _EARLIEST,
    )
