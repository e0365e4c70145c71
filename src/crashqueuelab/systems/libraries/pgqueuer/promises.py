"""What pgqueuer documents of itself: where it is weaker than the lab's contract.

What pgqueuer does not have, the adapter does not pretend (the system's ``documented``
weaknesses): no token, so a stale holder's completion is accepted; retries happen inside
the worker process (``RetryWithBackoffEntrypointExecutor``), so a failed attempt with
attempts left stays ``picked`` and the same worker's next claim runs it again (the retry
timer hands it to another worker if this one dies first), and the last one is logged as
``exception``; pgqueuer's time is the server's, so ``recover`` waits ``RETRY_TIMER`` out.
"""

from __future__ import annotations

from crashqueuelab.systems.contract import Documented

_DOCS = "https://pgqueuer.readthedocs.io/en/latest/"


_NO_TOKEN = Documented(
    "no token: pgqueuer logs or heartbeats a job by its id, whoever holds it, and log_jobs"
    " answers nothing, so a stale holder's completion or heartbeat is taken as any other",
    _DOCS,
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
    ),
)
_SERVER_CLOCK = Documented(
    "the retry timer runs on the server's clock: a job whose holder has not sent a"
    " heartbeat for that long is handed out again, whatever lease the holder was given,"
    " and a worker takes at most concurrency_limit jobs",
    _DOCS,
    explains=(
        "model workload: job *: claimed by * while *'s lease * was live until *",
        # The first holder, still at work, finished it; the second runs it again.
        "model workload: job *: claimed by * after an accepted acknowledgement (at *",
        "probe heartbeat_survives_restart: *",
        "probe batched_acknowledgement_fences_each_item: *the queue offered nothing",
        "probe batched_acknowledgement_sees_the_lease_as_it_stands: *the queue offered *",
        "job *: two live leases from * at least: *",
        # The heartbeat experiment: a network fault held the holder's heartbeats.
        "job *: run again * while a * held *'s connection *",
    ),
)
_WORKER_RETRIES = Documented(
    "retries happen inside the worker process (RetryWithBackoffEntrypointExecutor): the"
    " store keeps no attempt count, so a job the retry timer hands out again has no limit",
    _DOCS,
    explains=(
        "model workload: job *: handed out as attempt * of *",
        "probe expired_attempts_run_out: *",
        # Chaos: a job that kills its worker each time is handed out for ever.
        "job * (poison): still * after the run, never dead-lettered*",
        "every other job was acknowledged, but the work did not end within * after: jobs are"
        " left that never reach the dead letter*",
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

#: What the pgqueuer system documents.
DOCUMENTED = (_NO_TOKEN, _SERVER_CLOCK, _WORKER_RETRIES, _CONNECTION)
