"""A RabbitMQ queue's ready messages, read over AMQP 0-9-1 without consuming them.

RabbitMQ has no way to look at a message and leave it: the reader takes each ready message
with ``basic.get`` and never acknowledges it, then closes its connection, and RabbitMQ puts
back every message the connection's channel held, each in its place in the queue ("any
delivery (message) that was not acked is automatically requeued when the channel (or
connection) on which the delivery happened is closed", https://www.rabbitmq.com/confirms.html).
Each comes back marked redelivered. Messages a consumer holds unacknowledged are not ready
and cannot be read: the reading counts the queue's consumers, so that a reading taken while
one was attached says so. It speaks AMQP with the judges' own client (``judges.amqp``),
never with a client library a queue under test brings.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from crashqueuelab.judges.amqp import AmqpConnection, AmqpError

#: Messages read from one queue at most (a bound on the loop, far above any run's jobs).
LIMIT = 1_000_000
#: RabbitMQ's reply code for a queue that does not exist.
NOT_FOUND = 404
#: How often a settling reading asks whether the stopped workers' consumers are gone.
SETTLE_POLL_S = 0.05
#: How long the judges' readings wait for them, at the end of a run.
SETTLE_S = 10.0


class Unreadable(RuntimeError):
    """The queue could not be read (the node did not answer, refused, or a stopped worker's
    consumer was still attached): no reading to judge, never an empty one."""


@dataclass(frozen=True)
class QueueMessages:
    """What a queue holds ready: each message's headers and body, in the queue's order."""

    exists: bool
    messages: tuple[tuple[dict[str, Any], bytes], ...] = ()
    #: Consumers attached to the queue while it was read (their messages are not here).
    consumers: int = 0
    problems: tuple[str, ...] = field(default=())


def read_ready_messages(
    url: str, queue: str, settle_s: float = 0.0, sleep: Callable[[float], None] = time.sleep
) -> QueueMessages:
    """Every ready message of ``queue`` on the node at ``url``, each put back.

    ``settle_s``: where the workers were stopped just before, how long to wait for RabbitMQ
    to see their connections closed (it removes a gone consumer and puts back what it held
    as it notices, not at once); consumers still attached then are a problem said."""
    try:
        connection = AmqpConnection(url)
    except OSError as error:
        return QueueMessages(True, problems=(f"RabbitMQ did not answer: {error}",))
    except AmqpError as refused:
        # A close with a reply code is the node's refusal (a login refused: its users
        # gone, say); anything else is a node that never answered as AMQP asks.
        said = "refused the connection" if refused.code is not None else "did not answer"
        return QueueMessages(True, problems=(f"RabbitMQ {said}: {refused}",))
    with connection:
        try:
            ready, consumers = connection.declare_passive(queue)
            for _ in range(round(settle_s / SETTLE_POLL_S)):
                if not consumers:
                    break
                sleep(SETTLE_POLL_S)
                ready, consumers = connection.declare_passive(queue)
        except AmqpError as refused:
            if refused.code == NOT_FOUND:  # nothing was ever sent to it
                return QueueMessages(False)
            return QueueMessages(True, problems=(f"RabbitMQ refused the reading: {refused}",))
        except OSError as error:
            return QueueMessages(True, problems=(f"RabbitMQ did not answer: {error}",))
        if settle_s and consumers:
            return QueueMessages(
                True,
                consumers=consumers,
                problems=(
                    f"{consumers} consumer(s) still attached {settle_s:g} s after the workers"
                    " stopped: what they hold cannot be read",
                ),
            )
        found: list[tuple[dict[str, Any], bytes]] = []
        try:
            for _ in range(LIMIT):
                message = connection.get(queue)
                if message is None:
                    break
                found.append((message.headers, message.body))
            else:
                return QueueMessages(True, problems=(f"more than {LIMIT} messages: not read",))
        except (OSError, AmqpError) as error:
            return QueueMessages(True, problems=(f"RabbitMQ refused the reading: {error}",))
        # Closing the connection (leaving the block) puts back every message it took.
        if settle_s and len(found) < ready:
            # With no consumer left, none could take a message between the count and the
            # reading.
            short = f"{ready} messages ready, {len(found)} read"
            return QueueMessages(True, tuple(found), consumers, problems=(short,))
        return QueueMessages(True, tuple(found), consumers)


def read_or_raise(url: str | None, queue: str, settle_s: float = 0.0) -> QueueMessages:
    """``read_ready_messages``, raising ``Unreadable`` where it could not read (or no node is
    named): a reader that judges a store must never take a failed reading for an empty
    queue."""
    if not url:
        raise Unreadable("no RabbitMQ node named")
    reading = read_ready_messages(url, queue, settle_s)
    if reading.problems:
        raise Unreadable("; ".join(reading.problems))
    return reading
