"""What dramatiq documents of itself: where it is weaker than the lab's contract.

dramatiq promises at-least-once delivery, in its guide's words, and no more: no token (a
late outcome of a delivery is accepted), no lease per message and no heartbeat per message,
only a worker's heartbeat on Redis: a worker silent for ``heartbeat_timeout`` is dead to the
maintenance that one command in a thousand runs, which puts its fetched messages back, on
the wall clock, which the lab's clock does not move. A message that kills its worker is
delivered again without counting against ``max_retries`` (issue #213, closed as intended).
"""

from __future__ import annotations

from crashqueuelab.judges.findings import Kind
from crashqueuelab.systems.contract import Documented
from crashqueuelab.systems.libraries.dramatiq.client import HEARTBEAT_TIMEOUT_MS
from crashqueuelab.systems.libraries.redisstore import CONNECTION_RAISES, persistence_losses

_GUIDE = "https://dramatiq.io/guide.html"
_REDIS = "https://dramatiq.io/reference.html#dramatiq.brokers.redis.RedisBroker"
_POISON = "https://github.com/Bogdanp/dramatiq/issues/213"

#: dramatiq's guide, on what a message may do.
AT_LEAST_ONCE = (
    '"Dramatiq actors may receive the same message multiple times in the event of a worker'
    " failure (hardware, network or power failure).  This means that, for any given message,"
    ' running your actor multiple times must be safe." (' + _GUIDE + "#message-delivery)"
)

_AT_LEAST_ONCE = Documented(
    "at least once: " + AT_LEAST_ONCE,
    _GUIDE,
    kinds=(
        Kind.LATE_ACKNOWLEDGEMENT_ACCEPTED,
        Kind.ACKNOWLEDGEMENT_AT_DEADLINE_ACCEPTED,
        Kind.LATE_FAILURE_REPORT_ACCEPTED,
        Kind.FAILURE_REPORT_AT_DEADLINE_ACCEPTED,
        Kind.DEAD_HEARTBEAT_ACCEPTED,
        Kind.CLAIMED_WHILE_LEASED,
    ),
)
_SILENT_WORKER = Documented(
    "a worker that sends no heartbeat for heartbeat_timeout (frozen, cut off) is a failed"
    " worker to the others, whose maintenance puts its messages back: " + AT_LEAST_ONCE,
    _GUIDE,
    when={Kind.RUN_AGAIN: {"connection_held": True}},
)
_HEARTBEAT_TIMEOUT = Documented(
    '"heartbeat_timeout(int): The amount of time (in ms) that has to pass without a heartbeat'
    " for a broker process to be considered offline\": a killed worker's fetched messages stay"
    f" in its acks set until its heartbeat is {HEARTBEAT_TIMEOUT_MS} ms old on the wall clock"
    " (the adapter's setting; dramatiq's default is 60 s) and a maintenance runs, which the"
    " lab's clock does not move",
    _REDIS,
    points=(
        "fetch:after",
        "BEFORE_EFFECT_COMMIT",
        "AFTER_EFFECT_COMMIT",
        "finish:before",
        "fail:before",
        # The due delayed message fetched from its delay queue, not yet moved: it waits in
        # the dead worker's acks set of that queue, read as delayed.
        "move:before",
    ),
    kinds=(Kind.WORK_STALLED, Kind.WORK_NEVER_ENDED),
    when={
        Kind.CLAIM_NOT_OFFERED: {"offered": "nothing"},
        # One job's message stuck in the dead worker's acks set, the other job done once.
        Kind.RECOVERY_UNFINISHED: (
            {"effect_state": "fetched", "flaky_state": "acked"},
            {"effect_state": "acked", "flaky_state": "fetched"},
            {"effect_state": "acked", "flaky_state": "delayed", "point": "move:before"},
        ),
        Kind.EFFECTS_NOT_ONCE: (
            {"effect_effects": 0, "flaky_effects": 1},
            {"effect_effects": 1, "flaky_effects": 0},
        ),
        Kind.UNFINISHED: {"state": "fetched"},
    },
)
_POISON_MESSAGE = Documented(
    "a message that kills its worker is delivered again without counting against"
    " max_retries: dramatiq's retries count failures its middleware saw, and a killed"
    " worker's message comes back as it was (issue #213, closed as intended)",
    _POISON,
    # A job that kills every worker that takes it is never dead-lettered, so the work
    # never ends.
    kinds=(Kind.EXPIRED_LAST_ATTEMPT_NOT_DEAD, Kind.WORK_NEVER_ENDED),
    when={Kind.UNFINISHED: {"poison": True}},
)


_MOVED_TWICE_ON_REDIS = Documented(
    "on Redis, a worker that died while it moved a due delayed message to its queue:"
    " dramatiq's worker enqueues the message on its queue, then acknowledges the delayed one"
    " (handle_delayed_messages); the delayed one stays in the dead worker's acks set, a second"
    " live copy beside the moved one or beside its result, until a maintenance finds the"
    " worker's heartbeat older than heartbeat_timeout and puts it back, to be moved and run"
    " again: " + AT_LEAST_ONCE,
    "https://github.com/Bogdanp/dramatiq/blob/master/dramatiq/worker.py",
    # Only a worker that died inside a claim call after an attempt of the job failed with a
    # retry (``claim_cut``, lab/chaos/record.py) can have left the delayed copy behind. As
    # on RabbitMQ, the log does not say which message a claim moved: any such death will
    # do. A result beside a live copy is taken as this only then (an acknowledgement lost
    # after a mere process death would look the same, and no such death excuses it). A
    # campaign's case at ``move:after`` is that death by construction; its recovery runs the
    # moved copy, and the delayed one is still live when the case ends.
    points=("move:after",),
    when={
        Kind.STORE_INCONSISTENT: (
            {"problem": "*: more than one live message", "claim_cut": True},
            {"problem": "*: a result, yet a message still live", "claim_cut": True},
            # The case's move is the flaky job's retry: only that job's copies.
            {"problem": "job */flaky: more than one live message", "point": "move:after"},
            {"problem": "job */flaky: a result, yet a message still live", "point": "move:after"},
        ),
        Kind.RECOVERY_UNFINISHED: {
            "effect_state": "acked",
            "flaky_state": "acked",
            "point": "move:after",
        },
    },
)


def documented_for(persistence: str) -> tuple[Documented, ...]:
    """What dramatiq on its Redis broker documents, on a server with that persistence
    (``redisstore.persistence_losses``: Redis's RDB snapshots take back what came after the
    last one, its always-synced append-only file nothing answered)."""
    return (
        _AT_LEAST_ONCE,
        _SILENT_WORKER,
        _MOVED_TWICE_ON_REDIS,
        _POISON_MESSAGE,
        _HEARTBEAT_TIMEOUT,
        *persistence_losses(persistence),
        CONNECTION_RAISES,
    )


_REQUEUED_ON_CLOSE = Documented(
    "on RabbitMQ, a worker killed after it ran a message and before RabbitMQ had its"
    " acknowledgement: RabbitMQ puts the message back as the worker's connection closes (\"any"
    " delivery (message) that was not acked is automatically requeued when the channel (or"
    ' connection) on which the delivery happened is closed"), and it runs again: ' + AT_LEAST_ONCE,
    "https://www.rabbitmq.com/confirms.html#automatic-requeueing",
    # No lease to wait out: a killed holder's message goes to the next consumer at once,
    # while the lab still counts the dead holder's lease (the lab cannot tell a dead holder
    # from a live one in its workers' logs, so any overlap is taken as this one).
    kinds=(Kind.OVERLAPPING_LEASES,),
    when={
        Kind.RAN_TWICE: {"acknowledged": ("no", "unknown"), "worker_then": "sigkilled"},
        # Killed inside its failure report, after dramatiq enqueued the retry and before
        # RabbitMQ had the acknowledgement: the message back beside its retry.
        Kind.STORE_INCONSISTENT: {"problem": "*: more than one live message", "report_cut": True},
    },
)
_MOVED_TWICE = Documented(
    "on RabbitMQ, a worker that died while it moved a due delayed message to its queue:"
    " dramatiq's worker enqueues the message on its queue, then acknowledges the delayed"
    " one (handle_delayed_messages), and RabbitMQ puts back a delayed one not yet"
    ' acknowledged as the connection closes ("any delivery (message) that was not acked is'
    " automatically requeued when the channel (or connection) on which the delivery happened"
    ' is closed"): it is moved again, two copies of one message are live, and it runs'
    " twice: " + AT_LEAST_ONCE,
    "https://github.com/Bogdanp/dramatiq/blob/master/dramatiq/worker.py",
    # The lab's worker moves due delayed messages inside its claim call: only a worker that
    # died inside one after an attempt of the job failed with a retry (``claim_cut``,
    # lab/chaos/record.py) can have left two copies.
    when={Kind.STORE_INCONSISTENT: {"problem": "*: more than one live message", "claim_cut": True}},
)
_HELD_UNTIL_CLOSED = Documented(
    "on RabbitMQ, no lease: a message delivered to a consumer, in its worker's hands or"
    " prefetched (dramatiq's consumer prefetches, and RabbitMQ delivers it the next message as"
    " it acknowledges one), is offered to no other consumer until that one acknowledges it or"
    ' its connection closes ("any delivery (message) that was not acked is automatically'
    ' requeued when the channel (or connection) on which the delivery happened is closed";'
    " RabbitMQ's delivery acknowledgement timeout, 30 minutes by default, closes a channel"
    " holding one longer): a lapsed holder keeps its message, and a prefetched message reads"
    " as held while its consumer is open and as waiting once it closed",
    "https://www.rabbitmq.com/docs/consumer-prefetch",
    when={
        Kind.CLAIM_NOT_OFFERED: {"offered": "nothing"},
        Kind.EXPIRED_LAST_ATTEMPT_NOT_DEAD: {"state": "fetched"},
        Kind.REPORT_DIFFERS: {"about": "status", "reported": "leased", "stored": "pending"},
    },
)
_AMQP_CONNECTION_CLOSES = Documented(
    "on RabbitMQ, a call whose connection breaks (reset, or its answers lost) raises dramatiq's"
    ' ConnectionClosed ("Raised when a broker connection is suddenly closed"), and RabbitMQ'
    " puts back what the connection held: the caller is told failure, and the lab's chaos"
    " worker that made the call exits and is respawned (dramatiq's own worker restarts its"
    " consumer)",
    "https://github.com/Bogdanp/dramatiq/blob/master/dramatiq/errors.py",
    when={
        Kind.WORKER_EXITED: {
            "status": 3,
            "error": ("dramatiq.errors.ConnectionClosed*", "dramatiq.errors.ConnectionFailed*"),
        }
    },
)
_ACK_LOST_AT_POWER_CUT = Documented(
    "on RabbitMQ, an acknowledgement the node had not yet written to its disk when it lost"
    " power is lost with it: the message is back in its queue beside its result, or beside"
    ' the retry dramatiq enqueued for its failed attempt, and runs again (RabbitMQ: "Use of'
    ' acknowledgements guarantees at-least-once delivery"): ' + AT_LEAST_ONCE,
    "https://www.rabbitmq.com/docs/reliability#acknowledgements-and-confirms",
    # Only a crash state's finding names its choice: after a process's death alone, a live
    # message beside its result or its retry would be an acknowledgement RabbitMQ had and
    # dropped (two copies of one message after a death inside a claim: _MOVED_TWICE).
    when={
        Kind.STORE_INCONSISTENT: (
            {"problem": "*: a result, yet a message still live", "choice": "*"},
            {"problem": "*: more than one live message", "choice": "*"},
        )
    },
)
#: On its RabbitMQ broker: no heartbeat timeout (a dead worker's messages come back as its
#: connection closes). The results are in Redis, but no run cuts or restarts that server (a
#: power-loss case cuts the node's disk; chaos's server restarts restart the node), so
#: Redis's persistence explains nothing here.
DOCUMENTED_ON_RABBITMQ = (
    _AT_LEAST_ONCE,
    _REQUEUED_ON_CLOSE,
    _MOVED_TWICE,
    _HELD_UNTIL_CLOSED,
    _AMQP_CONNECTION_CLOSES,
    _ACK_LOST_AT_POWER_CUT,
    _POISON_MESSAGE,
    CONNECTION_RAISES,
)
