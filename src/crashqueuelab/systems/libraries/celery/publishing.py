"""Celery's own publishing to durable queues on a RabbitMQ node, for the power-cut
experiment (``crashqueuelab power-cut --publisher celery``): ``send_task`` through kombu's
AMQP transport, once with kombu's publisher confirms (the ``confirm_publish`` transport
option: py-amqp waits for the broker's ``basic.ack`` before the publish returns) and once at
Celery's defaults, where it is off and the publish returns as the bytes are written to the
socket. Celery's messages are persistent by default (``task_default_delivery_mode``), and
each queue is declared durable, a quorum queue by its ``x-queue-type`` argument, as Celery
declares a queue its ``task_queues`` name."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from crashqueuelab.systems.libraries.celery.client import TASK_NAME


def _app(url: str, queues: Mapping[str, str], *, confirm: bool) -> Any:
    """A Celery app on the node at ``url`` whose ``task_queues`` are ``queues`` (name: type),
    each on a direct exchange of its name; ``confirm``: kombu's publisher confirms on."""
    from celery import Celery
    from kombu import Exchange, Queue

    app = Celery("crashqueuelab-power-cut", set_as_current=False)
    app.conf.update(
        broker_url=url,
        broker_transport_options={"confirm_publish": True} if confirm else {},
        task_queues=[
            Queue(
                name,
                Exchange(name, type="direct"),
                routing_key=name,
                durable=True,
                queue_arguments={"x-queue-type": "quorum"} if kind == "quorum" else None,
            )
            for name, kind in queues.items()
        ],
        broker_connection_retry_on_startup=False,
    )
    return app


def declare(url: str, queues: Mapping[str, str]) -> None:
    """Each queue (and its exchange and binding) declared on the node, as Celery does."""
    app = _app(url, queues, confirm=False)
    try:
        with app.connection_for_write() as connection:
            channel = connection.default_channel
            for queue in app.amqp.queues.values():
                queue(channel).declare()
    finally:
        app.close()


def publish(
    url: str, queues: Mapping[str, str], confirmed: int, unconfirmed: int
) -> tuple[dict[str, dict[str, int]], Callable[[], None]]:
    """``confirmed`` tasks sent to each queue with publisher confirms (each ``send_task``
    returning once RabbitMQ confirmed it), then ``unconfirmed`` more at Celery's defaults.
    What each queue was sent, by kind, and what closes the connections: left open, as a
    process that loses power with its broker leaves them."""
    sent = {name: {"confirmed": 0, "unconfirmed": 0} for name in queues}
    opened: list[tuple[Any, Any]] = []

    def close() -> None:
        for app, connection in opened:
            connection.close()
            app.close()

    try:
        batches = (("confirmed", confirmed, True), ("unconfirmed", unconfirmed, False))
        for kind, count, confirm in batches:
            app = _app(url, queues, confirm=confirm)
            connection = app.connection_for_write()
            opened.append((app, connection))
            producer = app.amqp.Producer(connection)
            for number in range(count):
                for name in queues:
                    body = (f"{name}-{kind}-{number}",)
                    app.send_task(TASK_NAME, args=body, queue=name, producer=producer)
                    sent[name][kind] += 1
    except BaseException:
        close()
        raise
    return sent, close
