"""A RabbitMQ queue's ready messages, read over AMQP 0-9-1 without consuming them.

RabbitMQ has no way to look at a message and leave it: the reader takes each ready message
with ``basic.get`` and never acknowledges it, then closes its channel, and RabbitMQ puts
back every message the channel held, each in its place in the queue ("any delivery
(message) that was not acked is automatically requeued when the channel (or connection) on
which the delivery happened is closed", https://www.rabbitmq.com/confirms.html). Each comes
back marked redelivered. Messages a consumer holds unacknowledged are not ready and cannot
be read: the reading counts the queue's consumers, so that a reading taken while one was
attached says so. The client is pika, which no library the lab judges on RabbitMQ through
this reader (Celery's kombu speaks through py-amqp) is built on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: How long the reader waits on the node for each step.
SOCKET_TIMEOUT_S = 10.0
#: Messages read from one queue at most (a bound on the loop, far above any run's jobs).
LIMIT = 1_000_000


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
    import pika
    from pika.exceptions import AMQPError, ChannelClosedByBroker

    parameters = pika.URLParameters(url)
    parameters.connection_attempts = 1
    parameters.socket_timeout = SOCKET_TIMEOUT_S
    parameters.blocked_connection_timeout = SOCKET_TIMEOUT_S
    try:
        connection = pika.BlockingConnection(parameters)
    except AMQPError as error:
        return QueueMessages(True, problems=(f"RabbitMQ did not answer: {error!r}",))
    try:
        channel = connection.channel()
        try:
            declared = channel.queue_declare(queue, passive=True)
        except ChannelClosedByBroker as refused:
            if refused.reply_code == 404:  # NOT_FOUND: nothing was ever sent to it
                return QueueMessages(False)
            raise
        found: list[tuple[dict[str, Any], bytes]] = []
        for _ in range(LIMIT):
            method, properties, body = channel.basic_get(queue, auto_ack=False)
            if method is None:
                break
            found.append((dict(properties.headers or {}), bytes(body)))
        # Closing the channel puts back every message it took, unacknowledged.
        channel.close()
        return QueueMessages(True, tuple(found), int(declared.method.consumer_count))
    except AMQPError as error:
        return QueueMessages(True, problems=(f"RabbitMQ refused the reading: {error!r}",))
    finally:
        if connection.is_open:
            connection.close()
