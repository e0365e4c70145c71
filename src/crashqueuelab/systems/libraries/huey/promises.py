"""What huey documents of itself: where it is weaker than the lab's contract.

What huey does not have, the adapter does not pretend: no leases, no tokens, no
acknowledgement. A dequeued task exists only in the memory of the process that took it (as
in huey's consumer), so a death there loses it; an idempotent producer that submits again
finds nothing of it and enqueues it anew. huey documents both (``DOCUMENTED``).
"""

from __future__ import annotations

from crashqueuelab.judges.findings import Kind
from crashqueuelab.systems.contract import Documented

_API_DOCS = "https://huey.readthedocs.io/en/latest/api.html"
_SQLITE_DOCS = _API_DOCS + "#SqliteHuey"
_CONSUMER_DOCS = "https://huey.readthedocs.io/en/latest/signals.html"

_NO_ACKNOWLEDGEMENT = Documented(
    "no acknowledgement: a task leaves huey's store when a consumer dequeues it, so a"
    " consumer that dies while the task runs loses it (SIGNAL_INTERRUPTED is sent only on"
    " a clean shutdown)",
    _CONSUMER_DOCS,
    points=(
        "dequeue:after",
        "BEFORE_EFFECT_COMMIT",
        "AFTER_EFFECT_COMMIT",
        "execute:before",
        "execute-error:before",
    ),
    when={
        # A dequeued task never comes back: an expired holder's job is offered to nobody.
        Kind.CLAIM_NOT_OFFERED: {
            "point": ("stale_holder_after_expiry", "batched_acknowledgement_fences_each_item"),
            "offered": "nothing",
        },
        Kind.EXPIRED_LAST_ATTEMPT_NOT_DEAD: {"state": "dequeued"},
        # Chaos: a consumer killed holding a task took it with it.
        Kind.LOST: ({"last_seen": ("held", "claiming")}, {"poison": True}),
        # The contract's rules (the pytest plugin): a dequeued task never comes back, and a
        # reopened store knows nothing of it.
        Kind.CONTRACT_RULE_FAILED: (
            {
                "point": "an_expired_holder_is_refused_and_the_job_goes_to_another",
                "assertion": "* found nothing to claim",
            },
            {
                "point": "a_reopened_store_keeps_every_job_and_lease",
                "assertion": "job * under a live lease, once the store reopened: the system"
                " reports nothing*",
            },
        ),
    },
)
_NO_LEASES = Documented(
    "no leases: huey has no deadline, visibility timeout or token, so a late or repeated"
    " completion is accepted like any other, and a repeated failure runs huey's retry"
    " again, which enqueues the task once more",
    _API_DOCS,
    kinds=(
        Kind.LATE_ACKNOWLEDGEMENT_ACCEPTED,
        Kind.ACKNOWLEDGEMENT_AT_DEADLINE_ACCEPTED,
        Kind.LATE_FAILURE_REPORT_ACCEPTED,
        Kind.FAILURE_REPORT_AT_DEADLINE_ACCEPTED,
        Kind.DEAD_HEARTBEAT_ACCEPTED,
        # The second copy a stale holder's repeated failure enqueued, claimed in its turn.
        Kind.CLAIMED_AFTER_ACKNOWLEDGEMENT,
        Kind.CLAIMED_WHILE_LEASED,
    ),
    when={
        Kind.CONTRACT_RULE_FAILED: (
            {
                "point": "the_live_holder_acknowledges_once",
                "assertion": "a second acknowledgement of the same lease answered succeeded*",
            },
            {
                "point": "an_acknowledgement_at_the_deadline_is_refused",
                "assertion": "* answered succeeded*",
            },
        ),
    },
)
_RETRY_AT_ONCE = Documented(
    "a retry waits only with a retry_delay, which the lab's tasks do not set: huey enqueues"
    " a failed task's retry at once",
    _API_DOCS + "#Huey.task",
    when={
        Kind.CONTRACT_RULE_FAILED: {
            "point": "a_failure_waits_its_delay_then_the_dead_letter_takes_it",
            "assertion": "* claimed job * as attempt 2; nothing may be claimable: the retry's"
            " delay has not passed",
        }
    },
)

#: What every huey system documents.
_SHUTDOWN_DOCS = "https://huey.readthedocs.io/en/latest/consumer.html#consumer-shutdown"

_STOPPED_AT_ONCE = Documented(
    'SIGTERM stops the consumer at once (SIGINT is the graceful stop): "you can shutdown'
    ' the consumer using SIGTERM and any running tasks will be interrupted", and "if you'
    " terminate the consumer without letting it finish any currently-executing tasks, those"
    ' tasks will be lost"; so is a task in hand when the consumer is killed',
    _SHUTDOWN_DOCS,
    when={
        # A deploy: the task in hand left the store when it was dequeued, and the consumer
        # went without finishing it (stopped at once, or killed at the end of the grace).
        Kind.LOST_IN_DEPLOY: {"stored": "nowhere", "last_end": ("abandoned", "killed")},
    },
)
_SCHEDULED_BY_THE_SCHEDULER = Documented(
    'a scheduled task runs once "the scheduler will pick-up the message and place it back into'
    ' the queue for execution" ("Will block for ~10 seconds" for a 10 s delay): no bound on'
    " how late; the consumer's scheduler ticks once a second, and a due task waits for a free"
    " worker",
    "https://huey.readthedocs.io/en/latest/guide.html#scheduling-tasks",
    when={Kind.SCHEDULED_LATE: {}},
)

DOCUMENTED = (
    _NO_ACKNOWLEDGEMENT,
    _NO_LEASES,
    _RETRY_AT_ONCE,
    _STOPPED_AT_ONCE,
    _SCHEDULED_BY_THE_SCHEDULER,
)


def unsynced_default(installed: str) -> Documented:
    """What a release that syncs nothing by default documents of it."""
    return Documented(
        f"huey {installed}'s default is fsync=False (synchronous=OFF): nothing is"
        " synced, so a power cut may take back what huey had answered;"
        " 3.3.0 changed the default to SQLite's own (FULL)",
        _SQLITE_DOCS,
        crash_modes=("power-loss",),
    )
