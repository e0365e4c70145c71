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

from crashqueuelab.systems.contract import Documented

_DOCS = "https://janbjorge.github.io/pgqueuer/"
_HEARTBEAT_DOCS = _DOCS + "guides/heartbeat/"
_CONCURRENCY_DOCS = _DOCS + "guides/concurrency-control/"
_RETRY_DOCS = _DOCS + "guides/retry/"
_RELIABILITY_DOCS = _DOCS + "guides/reliability/"


_NO_TOKEN = Documented(
    "no token: pgqueuer logs or heartbeats a job by its id, whoever holds it, and log_jobs"
    " and update_heartbeat answer nothing, so a stale holder's completion or heartbeat is"
    " taken as any other, and one pgqueuer ignored (the job logged already) cannot be told"
    " from one it took",
    _RELIABILITY_DOCS,
    explains=(
        "probe acknowledgement_at_the_deadline: *was accepted*",
        "probe stale_holder_after_expiry: *was accepted*",
        "probe heartbeat_after_expiry: *was accepted*",
        "probe batched_acknowledgement_fences_each_item: *was accepted*",
        "model workload: *was accepted (at *",
        "model workload: job *: an acknowledgement was accepted, but the store shows it *",
        # Chaos: a paused holder's late completion is taken, beside its successor's.
        "job *: *, stopped past its lease, had its late acknowledgement accepted",
        "job *: acknowledged * times, by *",
        # The contract's rules (the pytest plugin): nothing pgqueuer answers says a lease
        # ended, so the adapter can only say it was taken.
        "contract the_live_holder_acknowledges_once: a second acknowledgement of the same"
        " lease answered succeeded*",
        "contract an_expired_holder_is_refused_and_the_job_goes_to_another: w1's late"
        " acknowledgement answered succeeded*",
        "contract an_acknowledgement_at_the_deadline_is_refused: an acknowledgement exactly at"
        " the lease's deadline answered succeeded*",
        "contract a_heartbeat_extends_a_live_lease_only: a heartbeat of an acknowledged lease"
        " answered True*",
    ),
)
_SERVER_CLOCK = Documented(
    "the retry timer (1.x: heartbeat timeout) runs on the server's clock: a job whose holder"
    " has not sent a heartbeat for that long is handed out again, whatever lease the holder"
    " was given",
    _HEARTBEAT_DOCS,
    explains=(
        "model workload: job *: claimed by * while *'s lease * was live until *",
        # The first holder, still at work, finished it; the second runs it again.
        "model workload: job *: claimed by * after an accepted acknowledgement (at *",
        "probe heartbeat_survives_restart: *",
        "job *: two live leases from * at least: *",
        # The heartbeat experiment: a network fault held the holder's heartbeats.
        "job *: run again * while a * held *'s connection *",
    ),
)
_SERIAL = Documented(
    "concurrency_limit=1 (the adapter's, as in the stuck-job reports) lets one job of the"
    " entrypoint be picked at a time across every worker: while one is held, no worker is"
    " offered another",
    _CONCURRENCY_DOCS,
    explains=(
        "probe batched_acknowledgement_fences_each_item: *the queue offered nothing",
        "probe batched_acknowledgement_sees_the_lease_as_it_stands: *the queue offered *",
        "contract a_reopened_store_keeps_every_job_and_lease: w1 found nothing to claim while"
        " it holds job *",
    ),
)

#: Chaos: a job that kills its worker each time is handed out for ever.
_POISON_FOR_EVER = (
    "job * (poison): still * after the run, never dead-lettered*",
    "every other job was acknowledged, but the work did not end within * after: jobs are"
    " left that never reach the dead letter*",
)
_RETRIES_IN_THE_WORKER = Documented(
    "retries happen inside the worker process (RetryWithBackoffEntrypointExecutor): a failed"
    " attempt with attempts left stays picked, and the store keeps no attempt count, so a"
    " job the retry timer hands out again has no limit",
    _RELIABILITY_DOCS,
    explains=(
        "model workload: job *: handed out as attempt * of *",
        "probe expired_attempts_run_out: *",
        *_POISON_FOR_EVER,
        "contract a_failure_waits_its_delay_then_the_dead_letter_takes_it: job a after its"
        " first attempt failed: the system reports leased after 1 attempts, not pending after"
        " 1 attempts",
    ),
)
_UNCOUNTED_HAND_OUTS = Documented(
    "attempts counts the retries a handler asks for (retry_job): a job the heartbeat timeout"
    " hands out again is not counted, so a job whose every holder dies has no limit",
    _RETRY_DOCS,
    explains=(
        "model workload: job *: handed out as attempt * of *",
        "probe expired_attempts_run_out: *",
        *_POISON_FOR_EVER,
    ),
)
_RETRY_DELAY_ON_THE_SERVER = Documented(
    "a retry's delay runs on the server's clock (execute_after), which the lab's clock does"
    " not move: the adapter asks for none, so a failed job is queued again at once",
    _RETRY_DOCS,
    explains=(
        "contract a_failure_waits_its_delay_then_the_dead_letter_takes_it: * claimed job * as"
        " attempt 2; nothing may be claimable: the retry's delay has not passed",
    ),
)

_CONNECTION = Documented(
    "a queue manager whose connection to the server breaks (a server restart, a reset, an"
    " answer lost on the way) raises and stops; pgqueuer starts it again only when asked"
    " (pgq run --restart-on-failure, off by default), as the lab's chaos respawns workers",
    _DOCS,
    explains=(
        "* exited with status 3: *before or while processing the request.*",
        "* exited with status 3: *server closed the connection*",
        "* exited with status 3: *the connection is lost*",
        "* exited with status 3: *the connection is closed*",
        "* exited with status 3: *terminating connection due to administrator command*",
    ),
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
    return (_NO_TOKEN, _SERVER_CLOCK, _SERIAL, *retries, _CONNECTION)
