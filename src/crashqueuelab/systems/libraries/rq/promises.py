"""What RQ and Redis document of themselves: where they are weaker than the lab's contract.

What RQ does not have, the adapter does not pretend (``documented``): no token, so a late
completion is accepted; a job whose worker died is handed back only once its heartbeat TTL
(job timeout + 60 s) has passed, or, when it died between taking the job and starting it,
once the worker's maintenance has seen it twice a minute apart on the wall clock; a retry's
interval would be a time on the wall clock too, so the adapter sets none and RQ requeues a
failed job at once.
"""

from __future__ import annotations

from crashqueuelab.judges.findings import Kind
from crashqueuelab.systems.contract import Documented
from crashqueuelab.systems.libraries.redisstore import CONNECTION_RAISES
from crashqueuelab.systems.libraries.rq.client import JOB_TIMEOUT_S

_DOCS = "https://python-rq.org/docs/"
_WORKERS_DOCS = "https://python-rq.org/docs/workers/"
_RESULTS_DOCS = "https://python-rq.org/docs/results/"

_NO_TOKEN = Documented(
    "no token: RQ records whatever outcome the worker running a job reports, so a late or"
    " repeated completion is accepted",
    _WORKERS_DOCS,
    kinds=(
        Kind.LATE_ACKNOWLEDGEMENT_ACCEPTED,
        Kind.ACKNOWLEDGEMENT_AT_DEADLINE_ACCEPTED,
        Kind.LATE_FAILURE_REPORT_ACCEPTED,
        Kind.FAILURE_REPORT_AT_DEADLINE_ACCEPTED,
        Kind.DEAD_HEARTBEAT_ACCEPTED,
    ),
    when={
        # A stale holder's failure report, accepted after another holder's acknowledgement.
        Kind.STORE_DIFFERS: {"told": "succeeded", "stored": "dead"},
        # The contract's rules (the pytest plugin): the running job takes the first report.
        Kind.CONTRACT_RULE_FAILED: {
            "point": "an_acknowledgement_at_the_deadline_is_refused",
            "assertion": "an acknowledgement exactly at the lease's deadline answered succeeded*",
        },
    },
)
_ABANDONED_AFTER_TTL = Documented(
    "a job whose worker died is handed back only once its heartbeat TTL (the job timeout"
    f" plus 60 s; {JOB_TIMEOUT_S + 60} s here) has passed on the wall clock, and one taken"
    " by a worker that died before starting it waits in the intermediate queue until the"
    " maintenance has seen it twice, a minute apart",
    _WORKERS_DOCS,
    points=("dequeue:after", "start:before"),
    # Chaos runs on the wall clock, shorter than the TTL: the work stalls waiting for a
    # killed worker's job (also when the held jobs' acknowledgements had been sent).
    kinds=(Kind.WORK_STALLED, Kind.WORK_NEVER_ENDED),
    when={
        Kind.CLAIM_NOT_OFFERED: {
            "point": ("stale_holder_after_expiry", "batched_acknowledgement_fences_each_item"),
            "offered": "nothing",
        },
        Kind.EXPIRED_LAST_ATTEMPT_NOT_DEAD: {"state": "started"},
        # Killed between taking the effect job and starting it: the job stays taken, so its
        # effect is never made.
        Kind.RECOVERY_UNFINISHED: {"effect_state": "dequeued"},
        Kind.EFFECTS_NOT_ONCE: {
            "point": ("dequeue:after", "start:before"),
            "effect_effects": 0,
            "flaky_effects": 1,
        },
        # Chaos: a killed worker's job is still held when the run ends.
        Kind.UNFINISHED: {"state": ("started", "dequeued")},
        # The contract's rules (the pytest plugin): the lab's clock passed the lease, the
        # wall clock not the TTL, and the first holder's job is still started.
        Kind.CONTRACT_RULE_FAILED: {
            "point": "an_expired_holder_is_refused_and_the_job_goes_to_another",
            "assertion": "w2 found nothing to claim",
        },
    },
)
_KILLED_NOT_RUN_AGAIN = Documented(
    'a job whose worker was killed while running it is not run again: "workers can be'
    " killed forcefully by kill -9 [...] If the worker gets killed while a job is running,"
    " it will eventually end up in FailedJobRegistry because a cleanup task will raise an"
    ' AbandonedJobError"',
    _RESULTS_DOCS,
    when={
        # A deploy: the SIGKILL at the end of the grace cut the work horse's job, which stays
        # started until a maintenance run fails it.
        Kind.LOST_IN_DEPLOY: {"stored": ("started", "failed"), "last_end": "killed"},
    },
)
_RETRY_AT_ONCE = Documented(
    "Retry(max=...) without an interval requeues a failed job immediately; an interval is a"
    " time on the wall clock of the worker that failed it, for a scheduler to enqueue, which"
    " the lab's clock does not move: the adapter sets none",
    _DOCS + "exceptions/#retrying-failed-jobs",
    when={
        Kind.CONTRACT_RULE_FAILED: {
            "point": "a_failure_waits_its_delay_then_the_dead_letter_takes_it",
            "assertion": "* claimed job * as attempt 2; nothing may be claimable: the retry's"
            " delay has not passed",
        }
    },
)


_PERSISTENCE_DOCS = "https://redis.io/docs/latest/operate/oss_and_stack/management/persistence/"
#: What Redis's documentation says each persistence setting may lose in a power cut (the
#: append-only file synced on every write promises to lose nothing).
_PERSISTENCE_LOSSES = {
    "none": ("Redis without persistence keeps nothing across a restart", True),
    "rdb": (
        "RDB snapshots keep only the last snapshot: a crash of the server or a power cut"
        " takes back every write since it",
        True,
    ),
    "aof-everysec": (
        "AOF with appendfsync everysec may lose up to a second of writes to a power cut",
        False,
    ),
}

_SCHEDULING_DOCS = _DOCS + "scheduling/"
_ONE_ACTIVE_SCHEDULER = Documented(
    "one scheduler at a time enqueues a queue's scheduled jobs, and another takes over only"
    ' at its periodic check: "Only a single scheduler can run for a specific queue at any one'
    ' time", "Active schedulers will check for scheduled jobs once every second", "Idle'
    " schedulers will periodically (every 15 minutes) check whether the queues they're"
    " responsible for have active schedulers. If they don't, one of the idle schedulers will"
    ' start working": a job due after the worker whose scheduler was active was stopped'
    " waits in the scheduled registry for up to 15 minutes (late, or never within the run)",
    _SCHEDULING_DOCS,
    when={
        Kind.SCHEDULED_LATE: {},
        Kind.LOST_IN_DEPLOY: {"stored": "scheduled", "last_end": "never ran", "scheduled": True},
    },
)


def documented_for(persistence: str) -> tuple[Documented, ...]:
    """What an RQ system documents, on a server with that persistence."""
    documented = [
        _NO_TOKEN,
        _ABANDONED_AFTER_TTL,
        _RETRY_AT_ONCE,
        _KILLED_NOT_RUN_AGAIN,
        _ONE_ACTIVE_SCHEDULER,
        CONNECTION_RAISES,
    ]
    if persistence in _PERSISTENCE_LOSSES:
        what, on_restart = _PERSISTENCE_LOSSES[persistence]
        documented.append(
            Documented(
                what,
                _PERSISTENCE_DOCS,
                crash_modes=("power-loss",),
                faults=("server restart",) if on_restart else (),
            )
        )
    return tuple(documented)
