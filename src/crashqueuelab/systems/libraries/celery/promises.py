"""What Celery documents of itself: where it is weaker than the lab's contract.

Celery has no lease per claim, no token and no heartbeat: a message is "acknowledged" or
not, and on Redis a message received and never acknowledged is redelivered only after the
``visibility_timeout`` (one hour by default), measured on the wall clock by kombu's
``restore_visible``. At its default a task is acknowledged as it starts (early
acknowledgement), so a worker killed during it loses it, as the glossary says; with
``task_acks_late`` it is acknowledged after it ran, so it may run again.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from crashqueuelab.judges.findings import Kind
from crashqueuelab.systems.contract import Documented
from crashqueuelab.systems.libraries.celery.client import RABBITMQ, Settings
from crashqueuelab.systems.libraries.redisstore import CONNECTION_RAISES

_DOCS = "https://docs.celeryq.dev/en/stable/"
GLOSSARY = _DOCS + "glossary.html"
VISIBILITY = _DOCS + "getting-started/backends-and-brokers/redis.html#visibility-timeout"
_REDIS_PERSISTENCE = "https://redis.io/docs/latest/operate/oss_and_stack/management/persistence/"
CONNECTION_LOSS = (
    _DOCS + "userguide/configuration.html#worker-cancel-long-running-tasks-on-connection-loss"
)

#: The points after which a task has been acknowledged at its start (early ack) and not
#: finished: a death there loses it.
_ACKNOWLEDGED_RUNNING = (
    "execute:after",
    "BEFORE_EFFECT_COMMIT",
    "AFTER_EFFECT_COMMIT",
    "finish:before",
    "retry:before",
)
#: The points after which a message was received and not yet acknowledged.
_RECEIVED = ("receive:after", "execute:before")

_NO_TOKEN = Documented(
    "no lease and no token: a task's outcome is whatever the worker running it reports,"
    ' whenever it reports it ("Workers acknowledge messages to signify that a message has'
    ' been handled"), so a late acknowledgement is accepted',
    GLOSSARY,
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
            "assertion": "an acknowledgement exactly at the deadline answered succeeded*",
        },
    },
)


def _visibility(
    timeout_s: int | None, points: tuple[str, ...], held: tuple[str, ...], late: bool = False
) -> Documented:
    """The visibility timeout's weakness, for tasks the reader finds ``held`` (unacknowledged);
    with late acknowledgement (``late``), a task that ran to its end past the timeout, its
    worker still running, runs again."""
    stated = "one hour, kombu's default" if timeout_s is None else f"{timeout_s} s here"
    again: dict[str, Any] = {Kind.RAN_TWICE: {"worker_then": "alive"}} if late else {}
    return Documented(
        "\"If a task isn't acknowledged within the Visibility Timeout the task will be"
        ' redelivered to another worker and executed" ("The default visibility timeout for'
        f" Redis is 1 hour\"; {stated}, on the wall clock, which the lab's clock does not"
        " move): a message received and not acknowledged when its worker died waits that"
        " long in the unacked hash",
        VISIBILITY,
        points=points,
        kinds=(Kind.WORK_STALLED, Kind.WORK_NEVER_ENDED),
        when={
            Kind.CLAIM_NOT_OFFERED: {
                "point": ("stale_holder_after_expiry", "batched_acknowledgement_fences_each_item"),
                "offered": "nothing",
            },
            Kind.EXPIRED_LAST_ATTEMPT_NOT_DEAD: {"state": held},
            Kind.RECOVERY_UNFINISHED: ({"effect_state": held}, {"flaky_state": held}),
            Kind.EFFECTS_NOT_ONCE: ({"effect_effects": 0}, {"flaky_effects": 0}),
            Kind.UNFINISHED: {"state": held},
            Kind.LOST_IN_DEPLOY: {"stored": held},
            **again,
        },
    )


_EARLY_ACK = Documented(
    '"early acknowledgment": "Task is acknowledged just-in-time before being executed,'
    " meaning the task won't be redelivered to another worker if the machine loses power,"
    " or the worker instance is abruptly killed, mid-execution\" (Celery's default: a task"
    " whose worker died while it ran stays started, and never runs again)",
    GLOSSARY,
    points=_ACKNOWLEDGED_RUNNING,
    when={
        Kind.CLAIM_NOT_OFFERED: {
            "point": ("stale_holder_after_expiry", "batched_acknowledgement_fences_each_item"),
            "offered": "nothing",
        },
        Kind.EXPIRED_LAST_ATTEMPT_NOT_DEAD: {"state": "started"},
        Kind.RECOVERY_UNFINISHED: ({"effect_state": "started"}, {"flaky_state": "started"}),
        Kind.EFFECTS_NOT_ONCE: ({"effect_effects": 0}, {"flaky_effects": 0}),
        Kind.UNFINISHED: {"state": "started"},
        Kind.LOST: {"last_seen": "held"},
        Kind.LOST_IN_DEPLOY: {"last_end": "killed", "stored": "started"},
    },
)
_LATE_ACK = Documented(
    '"late acknowledgment": "Task is acknowledged after execution (both if successful, or'
    " if the task is raising an error), which means the task will be redelivered to another"
    " worker in the event of the machine losing power, or the worker instance being killed"
    ' mid-execution": a task may run again after it ran when its worker was killed before'
    " it acknowledged, and a message its worker held when it closed its connection goes"
    " back to the queue while the task still runs",
    GLOSSARY,
    when={
        Kind.CLAIMED_AFTER_ACKNOWLEDGEMENT: {},
        Kind.CLAIMED_WHILE_LEASED: {},
        # Only a worker killed (a live one's is the visibility timeout's): one that exited by
        # itself after a warm shutdown "will finish all currently executing tasks" and
        # acknowledges each after it ran, so a finished task run again after it is no
        # redelivery Celery documents (Celery #5663).
        Kind.RAN_TWICE: {"acknowledged": ("no", "unknown"), "worker_then": "sigkilled"},
    },
)
#: With late acknowledgement a broker that goes away (a RabbitMQ node's crash) takes the
#: workers' channels, and the tasks they ran and had not acknowledged go back to the queue
#: (``worker_cancel_long_running_tasks_on_connection_loss``, off by default through 5.x).
_CONNECTION_LOSS = Documented(
    '"Tasks which have not been acknowledged before the connection loss cannot do so anymore'
    " since their channel is gone and the task is redelivered back to the queue [...] the"
    " task is being executed twice per connection loss (and sometimes in parallel in other"
    ' workers)" (worker_cancel_long_running_tasks_on_connection_loss, off by default): a'
    " task under way when its broker restarted runs again",
    CONNECTION_LOSS,
    when={
        Kind.RAN_TWICE: {"across_server_restart": True},
        Kind.RAN_BESIDE_LIVE_HOLDER: {"across_server_restart": True},
    },
)
#: RabbitMQ's words on what becomes of a delivery no one acknowledged.
REQUEUED = "https://www.rabbitmq.com/confirms.html#automatic-requeueing"
_REQUEUED_WORDS = (
    '"any delivery (message) that was not acked is automatically requeued when the channel'
    ' (or connection) on which the delivery happened is closed"'
)
#: On RabbitMQ no visibility timeout and no lease: a message received and not acknowledged
#: is offered to no one else until the channel that received it closes.
_HELD_UNTIL_CLOSED = Documented(
    "on RabbitMQ, no lease: a message a worker received and has not acknowledged (with"
    " task_acks_late, until its task ended) is offered to no other worker until that one"
    f" acknowledges it or its channel closes ({_REQUEUED_WORDS}; RabbitMQ's delivery"
    " acknowledgement timeout, 30 minutes by default, closes a channel holding one longer):"
    " a lapsed holder keeps its task, which reads as started while it holds it",
    REQUEUED,
    when={
        # Only the probes that claim again after the holder's lease lapsed: a job never
        # offered at all would be another matter.
        Kind.CLAIM_NOT_OFFERED: {
            "point": ("stale_holder_after_expiry", "batched_acknowledgement_fences_each_item"),
            "offered": "nothing",
        },
        Kind.EXPIRED_LAST_ATTEMPT_NOT_DEAD: {"state": ("started", "reserved"), "handed_out": False},
    },
)
#: A killed worker's message goes to the next worker at once on RabbitMQ, while the lab
#: still counts the dead holder's lease; the workers' logs cannot tell a dead holder from a
#: live one, so every overlap on RabbitMQ is taken as this (docs/real-queues.md).
_REQUEUED_ON_CLOSE = Documented(
    "on RabbitMQ, a worker killed holding a message it had not acknowledged: RabbitMQ puts"
    f" it back as the worker's connection closes ({_REQUEUED_WORDS}), and the next worker"
    " takes it at once",
    REQUEUED,
    kinds=(Kind.OVERLAPPING_LEASES,),
)
#: With late acknowledgement a task that kills the worker running it is never acknowledged:
#: it goes back to the queue and kills the next one, and never reaches its retry limit.
_MESSAGE_LOOP = Documented(
    'task_reject_on_worker_lost: a task whose worker died under it is requeued "so that the'
    ' task will execute again by the same worker, or another worker", and "Enabling this can'
    ' cause message loops": on RabbitMQ a task that kills every worker that takes it comes'
    " back at once, never counted against its retries, and the work never ends",
    _DOCS + "userguide/configuration.html#task-reject-on-worker-lost",
    kinds=(Kind.WORK_NEVER_ENDED,),
    # The poison tasks that kill their worker loop; those that fail are never reached
    # behind them (still queued, their retries uncounted).
    when={
        Kind.UNFINISHED: ({"poison": True, "behaviour": "die"}, {"poison": True, "state": "queued"})
    },
)
#: What a call on a broken AMQP connection raises through kombu's py-amqp transport.
_AMQP_ERRORS = (
    "ConnectionResetError*",
    "BrokenPipeError*",
    "ConnectionAbortedError*",
    "TimeoutError*",
    "socket.timeout*",
    "OSError: *closed*",
    "amqp.exceptions.RecoverableConnectionError*",
    "amqp.exceptions.ConnectionForced*",
    "kombu.exceptions.OperationalError*",
)
_AMQP_CONNECTION_BREAKS = Documented(
    "on RabbitMQ, a call whose connection breaks (reset, or its answers lost) raises one of"
    " the transport's connection errors (kombu: \"connection_errors: List of exceptions that"
    ' may be raised by the connection"), and RabbitMQ puts back what the connection held:'
    " the caller is told failure, and the lab's chaos worker that made the call exits and is"
    " respawned (Celery's own worker reconnects: broker_connection_retry)",
    "https://docs.celeryq.dev/projects/kombu/en/stable/reference/kombu.html#kombu.Connection.connection_errors",
    when={Kind.WORKER_EXITED: {"status": 3, "error": _AMQP_ERRORS}},
)
_RDB = Documented(
    "RDB snapshots (Redis's default persistence) keep only the last snapshot: a crash of the"
    " server or a power cut takes back every write since it",
    _REDIS_PERSISTENCE,
    crash_modes=("power-loss",),
    faults=("server restart",),
)


def documented_for(settings: Settings) -> tuple[Documented, ...]:
    """What Celery documents of itself at ``settings``. On RabbitMQ no visibility timeout
    holds a message back: one received and not acknowledged goes back to the queue as the
    channel that received it closes ("In AMQP the transaction fails when the
    connection/channel is closed (or lost)", the glossary), which breaks no promise; the
    results are still in Redis, but no run cuts or restarts that server (a server restart
    restarts the node), so Redis's persistence explains nothing there."""
    if settings.broker == RABBITMQ:
        if settings.acks_late:
            # The connection loss first: a task under way at the crash whose worker was later
            # SIGKILLed too ran again for the crash before the kill could matter.
            return (
                _NO_TOKEN,
                _CONNECTION_LOSS,
                _LATE_ACK,
                _HELD_UNTIL_CLOSED,
                _REQUEUED_ON_CLOSE,
                *((_MESSAGE_LOOP,) if settings.reject_on_worker_lost else ()),
                _AMQP_CONNECTION_BREAKS,
                CONNECTION_RAISES,
            )
        # No visibility timeout to wait out: the work stalls only on the tasks a killed worker
        # had acknowledged, each named by a finding of its own that must be explained too; a
        # worker killed inside its claim after the acknowledgement and before Celery stored
        # STARTED leaves its task nowhere (a death before the acknowledgement requeues it).
        stalls = dataclasses.replace(
            _EARLY_ACK,
            kinds=(Kind.WORK_STALLED,),
            when={**_EARLY_ACK.when, Kind.LOST: {"last_seen": ("held", "claiming")}},
        )
        # A holder whose claim returned had acknowledged already: nothing of it is requeued,
        # so an overlap here is no such requeue.
        return (_NO_TOKEN, stalls, _HELD_UNTIL_CLOSED, _AMQP_CONNECTION_BREAKS, CONNECTION_RAISES)
    if settings.acks_late:
        # Unacknowledged until it ends: a death anywhere after the receipt is redelivered.
        running = _RECEIVED + _ACKNOWLEDGED_RUNNING
        held = _visibility(
            settings.visibility_timeout_s, running, ("reserved", "started"), late=True
        )
        return (_NO_TOKEN, held, _LATE_ACK, _RDB, CONNECTION_RAISES)
    # Early acknowledgement first: a case that lost a started task is its.
    return (
        _NO_TOKEN,
        _EARLY_ACK,
        _visibility(None, _RECEIVED, ("reserved",)),
        _RDB,
        CONNECTION_RAISES,
    )
