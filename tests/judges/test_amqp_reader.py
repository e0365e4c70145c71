"""The judges' AMQP reader (``judges.readers.amqp``) on a throwaway RabbitMQ node: it reads a
queue's ready messages and leaves every one where it was, and says what it could not read."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from crashqueuelab.judges.readers.amqp import (
    QueueMessages,
    Unreadable,
    read_or_raise,
    read_ready_messages,
)
from crashqueuelab.judges.readers.rabbitmq import rabbitmq_queues
from crashqueuelab.lab.runs.servers import started
from crashqueuelab.servers.rabbitmq import CONTROL_VARIABLE, ThrowawayRabbitMQ, find_binaries

pika = pytest.importorskip("pika")
pytestmark = pytest.mark.skipif(find_binaries() is None, reason="no rabbitmq-server here")


@pytest.fixture(scope="module")
def node() -> Iterator[ThrowawayRabbitMQ]:
    with started(ThrowawayRabbitMQ()) as server:
        yield server


def _publish(url: str, queue: str, count: int) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        channel.queue_declare(queue, durable=True)
        channel.confirm_delivery()
        for number in range(count):
            properties = pika.BasicProperties(delivery_mode=2, headers={"id": f"t-{number}"})
            channel.basic_publish("", queue, f"body-{number}".encode(), properties)
    finally:
        connection.close()


def test_every_ready_message_is_read_in_order_and_put_back(node: ThrowawayRabbitMQ) -> None:
    _publish(node.url, "kept", 3)
    first = read_ready_messages(node.url, "kept")
    assert first == QueueMessages(
        True, tuple(({"id": f"t-{n}"}, f"body-{n}".encode()) for n in range(3)), 0
    )
    # Read again: the same messages, in the same order (each put back in its place).
    assert read_ready_messages(node.url, "kept") == first
    counts = {q.name: q for q in rabbitmq_queues(node.environment()[CONTROL_VARIABLE], node.bindir)}
    assert (counts["kept"].ready, counts["kept"].unacknowledged) == (3, 0)


def test_a_reading_beside_a_consumer_counts_it_and_misses_what_it_holds(
    node: ThrowawayRabbitMQ,
) -> None:
    _publish(node.url, "held", 2)
    connection = pika.BlockingConnection(pika.URLParameters(node.url))
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=1)
        channel.basic_consume("held", lambda *_: None)
        connection.process_data_events(time_limit=1)
        reading = read_ready_messages(node.url, "held")
    finally:
        connection.close()
    assert reading.consumers == 1
    assert [headers["id"] for headers, _ in reading.messages] == ["t-1"]


def test_a_settling_reading_waits_for_a_stopped_consumer_and_refuses_one_still_there(
    node: ThrowawayRabbitMQ,
) -> None:
    _publish(node.url, "settling", 2)
    connection = pika.BlockingConnection(pika.URLParameters(node.url))
    closed: list[bool] = []
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=1)
        channel.basic_consume("settling", lambda *_: None)
        connection.process_data_events(time_limit=1)
        still = read_ready_messages(node.url, "settling", settle_s=0.2)
        with pytest.raises(Unreadable, match=r"1 consumer\(s\) still attached 0\.2 s after"):
            read_or_raise(node.url, "settling", settle_s=0.2)

        def worker_stops(_: float) -> None:
            # The consumer's connection closes while the reading waits: what it held is
            # put back, and the reading finds both messages.
            if not closed:
                connection.close()
                closed.append(True)

        settled = read_ready_messages(node.url, "settling", settle_s=10.0, sleep=worker_stops)
    finally:
        if not closed:
            connection.close()
    assert still.messages == ()
    assert still.problems == (
        "1 consumer(s) still attached 0.2 s after the workers stopped: what they hold cannot"
        " be read",
    )
    assert settled.problems == ()
    assert [headers["id"] for headers, _ in settled.messages] == ["t-0", "t-1"]
    with pytest.raises(Unreadable, match="no RabbitMQ node named"):
        read_or_raise(None, "settling")


def test_a_queue_never_declared_is_absent_and_a_node_not_there_is_a_problem(
    node: ThrowawayRabbitMQ,
) -> None:
    assert read_ready_messages(node.url, "never") == QueueMessages(False)
    gone = read_ready_messages("amqp://guest:guest@127.0.0.1:1/", "kept")
    assert gone.exists
    assert gone.messages == ()
    assert gone.problems[0].startswith("RabbitMQ did not answer: ")


def test_a_refused_login_or_a_queue_another_connection_owns_is_a_problem_said(
    node: ThrowawayRabbitMQ,
) -> None:
    wrong = node.url.replace("guest:guest@", "guest:wrong@")
    refused = read_ready_messages(wrong, "kept")
    # The reader asks for a refused login to be said (authentication_failure_close): not a
    # socket dropped without a word, which reads as a node that did not answer.
    assert refused.problems[0].startswith("RabbitMQ refused the connection: 403 ACCESS_REFUSED")
    owner = pika.BlockingConnection(pika.URLParameters(node.url))
    try:
        owner.channel().queue_declare("mine", exclusive=True)
        locked = read_ready_messages(node.url, "mine")
    finally:
        owner.close()
    assert locked.problems[0].startswith("RabbitMQ refused the reading: 405 RESOURCE_LOCKED")
