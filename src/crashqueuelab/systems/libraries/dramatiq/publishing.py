"""dramatiq's own publishing to a durable queue on a RabbitMQ node, for the power-cut
experiment (``crashqueuelab power-cut --publisher dramatiq``): ``RabbitmqBroker.enqueue``, once
with ``confirm_delivery=True`` (pika's channel in confirm mode: the call returns once RabbitMQ
confirmed the message) and once at dramatiq's default, ``confirm_delivery=False``, where it
returns as the message is written to the socket. dramatiq publishes persistent messages and
declares its queues durable, each with a delay queue and a dead-letter queue beside it (which
the experiment does not judge)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from crashqueuelab.judges.readers.dramatiq import ACTOR

#: The one queue dramatiq publishes to here (it declares classic queues only).
QUEUE = "classic"


def _broker(url: str, *, confirm: bool) -> Any:
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    # Untyped in some releases and typed in others.
    rabbitmq_broker: Any = RabbitmqBroker
    return rabbitmq_broker(url=url, confirm_delivery=confirm, middleware=[])


def declare(url: str, queue: str = QUEUE) -> None:
    """The queue (with its delay and dead-letter queues), declared as dramatiq does."""
    broker = _broker(url, confirm=False)
    try:
        broker.declare_queue(queue, ensure=True)
    finally:
        broker.close()


def publish(
    url: str, confirmed: int, unconfirmed: int
) -> tuple[dict[str, dict[str, int]], Callable[[], None]]:
    """``confirmed`` messages enqueued with publisher confirms, then ``unconfirmed`` more at
    dramatiq's default. What the queue was sent, by kind, and what closes the brokers'
    connections: left open, as a process that loses power with its broker leaves them."""
    from dramatiq import Message

    sent = {QUEUE: {"confirmed": 0, "unconfirmed": 0}}
    brokers: list[Any] = []

    def close() -> None:
        for broker in brokers:
            broker.close()

    try:
        batches = (("confirmed", confirmed, True), ("unconfirmed", unconfirmed, False))
        for kind, count, confirm in batches:
            broker = _broker(url, confirm=confirm)
            brokers.append(broker)
            for number in range(count):
                message: Any = Message(
                    queue_name=QUEUE,
                    actor_name=ACTOR,
                    args=(f"{kind}-{number}", "t", {}),
                    kwargs={},
                    options={},
                    message_timestamp=int(time.time() * 1000),
                )
                broker.enqueue(message)
                sent[QUEUE][kind] += 1
    except BaseException:
        close()
        raise
    return sent, close
