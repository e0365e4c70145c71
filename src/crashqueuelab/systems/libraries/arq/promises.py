"""What arq documents of itself: where it is weaker than the lab's contract.

What arq does not have, the adapter does not pretend (``documented``): no token, so a late
completion by the worker that runs the job is accepted; no lease per claim and no
heartbeat, only arq's "pessimistic execution": a job whose worker died keeps its
in-progress key until Redis expires it, ``job_timeout`` + 10 s after it was taken on the
wall clock, and only then runs again (``max_tries`` ends a job that keeps killing its
worker); a retry's delay would be wall-clock time too, so the adapter's ``Retry`` has none.
"""

from __future__ import annotations

from crashqueuelab.judges.findings import Kind
from crashqueuelab.systems.contract import Documented
from crashqueuelab.systems.libraries.arq.client import IN_PROGRESS_MARGIN_S, JOB_TIMEOUT_S
from crashqueuelab.systems.libraries.redisstore import CONNECTION_RAISES, persistence_losses

_DOCS = "https://arq-docs.helpmanual.io/"
_USAGE = _DOCS + "#usage"
_RETRYING = _DOCS + "#retrying-jobs-and-cancellation"

_NO_TOKEN = Documented(
    "no token: arq records whatever outcome the worker running a job reports, so a late"
    " completion is accepted (arq's Job has no claim of its own to fence)",
    _DOCS + "#arq.worker.Worker",
    kinds=(
        Kind.LATE_ACKNOWLEDGEMENT_ACCEPTED,
        Kind.ACKNOWLEDGEMENT_AT_DEADLINE_ACCEPTED,
        Kind.LATE_FAILURE_REPORT_ACCEPTED,
        Kind.FAILURE_REPORT_AT_DEADLINE_ACCEPTED,
        Kind.DEAD_HEARTBEAT_ACCEPTED,
    ),
    when={
        Kind.CONTRACT_RULE_FAILED: {
            "point": "an_acknowledgement_at_the_deadline_is_refused",
            "assertion": "an acknowledgement exactly at the lease's deadline answered succeeded*",
        },
    },
)
_PESSIMISTIC = Documented(
    '"pessimistic execution": "jobs aren\'t removed from the queue until they\'ve either'
    ' succeeded or failed", so a job whose worker died keeps its in-progress key until'
    f" Redis expires it, job_timeout + {IN_PROGRESS_MARGIN_S} s after it was taken"
    f" ({JOB_TIMEOUT_S + IN_PROGRESS_MARGIN_S} s here, on the wall clock, which the lab's"
    ' clock does not move), and then runs again ("Jobs may be called more than once!")',
    _USAGE,
    points=(
        "start_job:after",
        "BEFORE_EFFECT_COMMIT",
        "AFTER_EFFECT_COMMIT",
        "finish:before",
        "retry:before",
    ),
    kinds=(Kind.WORK_STALLED, Kind.WORK_NEVER_ENDED),
    when={
        Kind.CLAIM_NOT_OFFERED: {
            "point": ("stale_holder_after_expiry", "batched_acknowledgement_fences_each_item"),
            "offered": "nothing",
        },
        Kind.EXPIRED_LAST_ATTEMPT_NOT_DEAD: {"state": "in_progress"},
        Kind.RECOVERY_UNFINISHED: ({"effect_state": "in_progress"}, {"flaky_state": "in_progress"}),
        # A job left in progress at the crash never finished within the recovery.
        Kind.EFFECTS_NOT_ONCE: ({"effect_effects": 0}, {"flaky_effects": 0}),
        Kind.UNFINISHED: {"state": "in_progress"},
        Kind.CONTRACT_RULE_FAILED: {
            "point": "an_expired_holder_is_refused_and_the_job_goes_to_another",
            "assertion": "w2 found nothing to claim",
        },
    },
)
_SHUTDOWN_REQUEUES = Documented(
    'a worker that shuts down cancels the jobs it runs and puts them back: "If the worker'
    " shuts down, the job will be cancelled immediately and will remain in the queue to be"
    " run again when the worker starts up again (or run by another worker which is still"
    " running)\"; the adapter's close is arq's own (Worker.close), so a client closed"
    " while its worker held a job hands that job to the next claimer",
    _USAGE,
    when={
        # The model workload's restarts close the client while its workers hold jobs. No
        # field of the finding says "after a restart", so the condition is the kind alone:
        # arq hands out a job another worker holds in no other way than this and the
        # in-progress key's expiry (start_jobs sets the key under WATCH), and that expiry
        # takes 30 s of the wall clock, longer than any model workload runs.
        Kind.CLAIMED_WHILE_LEASED: {},
    },
)
_RETRY_AT_ONCE = Documented(
    "Retry without a defer puts the job back to run at once; a defer is a time on the wall"
    " clock of the worker (arq's job score), which the lab's clock does not move: the"
    " adapter sets none",
    _RETRYING,
    when={
        Kind.CONTRACT_RULE_FAILED: {
            "point": "a_failure_waits_its_delay_then_the_dead_letter_takes_it",
            "assertion": "* claimed job * as attempt 2; nothing may be claimable: the retry's"
            " delay has not passed",
        }
    },
)


def documented_for(persistence: str) -> tuple[Documented, ...]:
    """What an arq system documents, on a server with that persistence: Redis's RDB
    snapshots take back what came after the last one; its append-only file synced on every
    write promises to lose nothing answered, so there a loss at a cut is no one's
    documented weakness."""
    losses = persistence_losses(persistence)
    return (_NO_TOKEN, _PESSIMISTIC, _SHUTDOWN_REQUEUES, _RETRY_AT_ONCE, *losses, CONNECTION_RAISES)
