"""What procrastinate documents of itself: where it is weaker than the lab's contract.

What procrastinate does not have, the adapter does not pretend (``documented``): no
token, so a stale holder's completion is accepted while the job is ``todo`` or ``doing``;
the stalled timeout runs on the server's clock, whatever lease the lab gave, and so would a
retry's wait, so the adapter's retry strategy sets none.
"""

from __future__ import annotations

from crashqueuelab.systems.contract import Documented
from crashqueuelab.systems.libraries.procrastinate.client import STALLED_S

_DOCS = "https://procrastinate.readthedocs.io/en/stable/"
_STALLED_DOCS = _DOCS + "howto/production/retry_stalled_jobs.html"

_NO_TOKEN = Documented(
    "no token: finish_job and retry_job name a job by its id, whoever holds it, and finish"
    " it while it is todo or doing, so a stale holder's completion is taken as any other",
    _DOCS + "reference.html#procrastinate.manager.JobManager.finish_job",
    explains=(
        "probe acknowledgement_at_the_deadline: *was accepted*",
        "probe stale_holder_after_expiry: *was accepted*",
        "probe heartbeat_after_expiry: *was accepted*",
        "probe batched_acknowledgement_fences_each_item: *was accepted*",
        "model workload: *was accepted (at *",
        "model workload: job *: an acknowledgement was accepted, but the store shows it *",
        "job *: *, stopped past its lease, had its late acknowledgement accepted",
        # The contract's rules (the pytest plugin): a job still doing is finished by
        # whoever names it.
        "contract an_acknowledgement_at_the_deadline_is_refused: an acknowledgement exactly at"
        " the lease's deadline answered succeeded*",
    ),
)
_SERVER_CLOCK = Documented(
    "stalled jobs are found by their worker's heartbeat on the server's clock"
    f" ({STALLED_S:g} s here): a job is handed out again when its worker has sent none for"
    " that long, whatever lease the holder was given; a heartbeat (update_heartbeat) names"
    " a worker, not a job, and answers nothing",
    _STALLED_DOCS,
    explains=(
        # The contract's rules (the pytest plugin): the live worker's heartbeats keep its
        # job, whatever the lab's clock says of its lease, and say nothing of the job.
        "contract an_expired_holder_is_refused_and_the_job_goes_to_another: w2 found nothing"
        " to claim",
        "contract a_heartbeat_extends_a_live_lease_only: a heartbeat of an acknowledged lease"
        " answered True*",
        "model workload: job *: claimed by * while *'s lease * was live until *",
        "model workload: job *: claimed by * after an accepted acknowledgement (at *",
        "probe heartbeat_survives_restart: *",
        "probe batched_acknowledgement_fences_each_item: *the queue offered nothing",
        "probe batched_acknowledgement_sees_the_lease_as_it_stands: *the queue offered *",
        "probe stale_holder_after_expiry: *the queue offered nothing",
        "probe heartbeat_after_expiry: *the queue offered nothing",
        "probe expired_attempts_run_out: *yet it is doing (leased)*",
        # Chaos: a killed worker's job is retried once its heartbeat is stale, which may
        # come before the lease the lab gave ends.
        "job *: two live leases from * at least: *",
    ),
)
_STALLED_RETRY_UNCOUNTED = Documented(
    "a stalled job is retried with retry_job, which counts the attempt, but the retry"
    " strategy is asked only when a task raises: a job whose workers keep dying is retried"
    " past its limit",
    _STALLED_DOCS,
    explains=(
        "model workload: job *: handed out as attempt * of *",
        "probe expired_attempts_run_out: *",
        # Chaos: a job that kills its worker each time is retried for ever.
        "job * (poison): still * after the run, never dead-lettered*",
        "every other job was acknowledged, but the work did not end within * after: jobs are"
        " left that never reach the dead letter*",
    ),
)

_RETRY_AT_ONCE = Documented(
    "a retry waits only with a RetryStrategy wait (linear_wait, exponential_wait), a time on"
    " the server's clock (the job's scheduled_at), which the lab's clock does not move: the"
    " adapter's strategy sets none, and procrastinate then retries the job immediately",
    _DOCS + "howto/advanced/retry.html",
    explains=(
        "contract a_failure_waits_its_delay_then_the_dead_letter_takes_it: * claimed job * as"
        " attempt 2; nothing may be claimable: the retry's delay has not passed",
    ),
)

#: What the procrastinate system documents.
DOCUMENTED = (_NO_TOKEN, _SERVER_CLOCK, _STALLED_RETRY_UNCOUNTED, _RETRY_AT_ONCE)
