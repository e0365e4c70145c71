"""What procrastinate documents of itself: where it is weaker than the lab's contract.

What procrastinate does not have, the adapter does not pretend (``documented``): no
token, so a stale holder's completion is accepted while the job is ``todo`` or ``doing``;
the stalled timeout runs on the server's clock, whatever lease the lab gave, and so would a
retry's wait, so the adapter's retry strategy sets none.
"""

from __future__ import annotations

from crashqueuelab.judges.findings import Kind
from crashqueuelab.systems.contract import Documented
from crashqueuelab.systems.libraries.procrastinate.client import STALLED_S

_DOCS = "https://procrastinate.readthedocs.io/en/stable/"
_STALLED_DOCS = _DOCS + "howto/production/retry_stalled_jobs.html"

_NO_TOKEN = Documented(
    "no token: finish_job and retry_job name a job by its id, whoever holds it, and finish"
    " it while it is todo or doing, so a stale holder's completion is taken as any other",
    _DOCS + "reference.html#procrastinate.manager.JobManager.finish_job",
    kinds=(
        Kind.LATE_ACKNOWLEDGEMENT_ACCEPTED,
        Kind.ACKNOWLEDGEMENT_AT_DEADLINE_ACCEPTED,
        Kind.LATE_FAILURE_REPORT_ACCEPTED,
        Kind.FAILURE_REPORT_AT_DEADLINE_ACCEPTED,
        Kind.DEAD_HEARTBEAT_ACCEPTED,
    ),
    when={
        Kind.STORE_DIFFERS: {"told": "succeeded"},
        # The contract's rules (the pytest plugin): a job still doing is finished by
        # whoever names it.
        Kind.CONTRACT_RULE_FAILED: {
            "point": "an_acknowledgement_at_the_deadline_is_refused",
            "assertion": "an acknowledgement exactly at the lease's deadline answered succeeded*",
        },
    },
)
_SERVER_CLOCK = Documented(
    "stalled jobs are found by their worker's heartbeat on the server's clock"
    f" ({STALLED_S:g} s here): a job is handed out again when its worker has sent none for"
    " that long, whatever lease the holder was given; a heartbeat (update_heartbeat) names"
    " a worker, not a job, and answers nothing",
    _STALLED_DOCS,
    # Chaos: a killed worker's job is retried once its heartbeat is stale, which may come
    # before the lease the lab gave ends.
    kinds=(
        Kind.CLAIMED_WHILE_LEASED,
        Kind.CLAIMED_AFTER_ACKNOWLEDGEMENT,
        Kind.OVERLAPPING_LEASES,
    ),
    when={
        Kind.LEASE_LOST_ON_RESTART: {"point": "heartbeat_survives_restart"},
        # The live worker's heartbeats keep its job, whatever the lab's clock says of its
        # lease: an expired holder's job is offered to nobody.
        Kind.CLAIM_NOT_OFFERED: (
            {
                "point": (
                    "batched_acknowledgement_fences_each_item",
                    "stale_holder_after_expiry",
                    "heartbeat_after_expiry",
                ),
                "offered": "nothing",
            },
            {"point": "batched_acknowledgement_sees_the_lease_as_it_stands"},
        ),
        Kind.EXPIRED_LAST_ATTEMPT_NOT_DEAD: {"state": "doing"},
        # The contract's rules (the pytest plugin): the live worker's heartbeats keep its
        # job, whatever the lab's clock says of its lease, and say nothing of the job.
        Kind.CONTRACT_RULE_FAILED: (
            {
                "point": "an_expired_holder_is_refused_and_the_job_goes_to_another",
                "assertion": "w2 found nothing to claim",
            },
            {
                "point": "a_heartbeat_extends_a_live_lease_only",
                "assertion": "a heartbeat of an acknowledged lease answered True*",
            },
        ),
    },
)
_STALLED_RETRY_UNCOUNTED = Documented(
    "a stalled job is retried with retry_job, which counts the attempt, but the retry"
    " strategy is asked only when a task raises: a job whose workers keep dying is retried"
    " past its limit",
    _STALLED_DOCS,
    kinds=(Kind.EXPIRED_LAST_ATTEMPT_NOT_DEAD, Kind.WORK_NEVER_ENDED),
    when={
        # Past the limit only by attempts no holder reported; one past it by failures is not.
        Kind.ATTEMPT_BEYOND_LIMIT: {"past_the_limit_by_unreported_attempts": True},
        # Chaos: a job that kills its worker each time is retried for ever, and the poison
        # jobs whose turn never came are left with attempts to spare.
        Kind.UNFINISHED: (
            {"poison": True, "behaviour": "die"},
            {"poison": True, "attempts_left": True},
        ),
    },
)

_RETRY_AT_ONCE = Documented(
    "a retry waits only with a RetryStrategy wait (linear_wait, exponential_wait), a time on"
    " the server's clock (the job's scheduled_at), which the lab's clock does not move: the"
    " adapter's strategy sets none, and procrastinate then retries the job immediately",
    _DOCS + "howto/advanced/retry.html",
    when={
        Kind.CONTRACT_RULE_FAILED: {
            "point": "a_failure_waits_its_delay_then_the_dead_letter_takes_it",
            "assertion": "* claimed job * as attempt 2; nothing may be claimable: the retry's"
            " delay has not passed",
        }
    },
)

#: What the procrastinate system documents.
_KILLED_LEFT_DOING = Documented(
    'a worker killed (SIGKILL, a second SIGTERM) "will terminate immediately, possibly'
    " leaving jobs with the doing status in the queue. And, if no specific action is taken,"
    ' these stalled jobs will remain in the queue forever": the action is a periodic task'
    " the user writes (retry_stalled_jobs), which procrastinate's worker does not run",
    _STALLED_DOCS,
    when={
        # A deploy: the job in hand was cut by the kill at the end of the grace, or by a
        # worker that went without it, and stays doing.
        Kind.LOST_IN_DEPLOY: {"stored": "doing", "last_end": ("killed", "abandoned")},
    },
)
_SCHEDULE_DOCS = (
    "https://github.com/procrastinate-org/procrastinate/blob/"
    "032269465304e3e18927b0fe2b606a3a68877580/docs/howto/schedule.md"
)
_SCHEDULED_AT_FIRST_OPPORTUNITY = Documented(
    'a scheduled job runs "at the first opportunity after that date" ("If a job is configured'
    ' with a date in the future, it will run at the first opportunity after that date"): no'
    " bound on how late; a worker polls for jobs every 5 s by default"
    " (fetch_job_polling_interval), and a due job waits for a free worker",
    _SCHEDULE_DOCS,
    when={Kind.SCHEDULED_LATE: {}},
)

DOCUMENTED = (
    _NO_TOKEN,
    _SERVER_CLOCK,
    _STALLED_RETRY_UNCOUNTED,
    _RETRY_AT_ONCE,
    _KILLED_LEFT_DOING,
    _SCHEDULED_AT_FIRST_OPPORTUNITY,
)
