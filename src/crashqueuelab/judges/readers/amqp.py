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

from dataclasses import dataclass, field
from typing import Any

from crashqueuelab.judges.amqp import AmqpConnection, AmqpError

#: Messages read from one queue at most (a bound on the loop, far above any run's jobs).
LIMIT = 1_000_000
#: RabbitMQ's reply code for a queue that does not exist.
NOT_FOUND = 404


@dataclass(frozen=True)
class QueueMessages:
    """What a queue holds ready: each message's headers and body, in the queue's order."""

    exists: bool
    messages: tuple[tuple[dict[str, Any], bytes], ...] = ()
    #: Consumers attached to the queue while it was read (their messages are not here).
    consumers: int = 0
    problems: tuple[str, ...] = field(default=())


def read_ready_messages(url: str, queue: str) -> QueueMessages:
    """Every ready message of ``queue`` on the node at ``url``, each put back."""
    try:
        connection = AmqpConnection(url)
    except (OSError, AmqpError) as error:
        return QueueMessages(True, problems=(f"RabbitMQ did not answer: {error}",))
    with connection:
        try:
            _, consumers = connection.declare_passive(queue)
        except AmqpError as refused:
            if refused.code == NOT_FOUND:  # nothing was ever sent to it
                return QueueMessages(False)
            return QueueMessages(True, problems=(f"RabbitMQ refused the reading: {refused}",))
        except OSError as error:
            return QueueMessages(True, problems=(f"RabbitMQ did not answer: {error}",))
        found: list[tuple[dict[str, Any], bytes]] = []
        try:
            for _ in range(LIMIT):
                message = connection.get(queue)
                if message is None:
                    break
                found.append((message.headers, message.body))
        except (OSError, AmqpError) as error:
            return QueueMessages(True, problems=(f"RabbitMQ refused the reading: {error}",))
        # Closing the connection (leaving the block) puts back every message it took.
        return QueueMessages(True, tuple(found), consumers)
