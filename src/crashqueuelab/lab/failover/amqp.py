"""The steady load a RabbitMQ failover run keeps on its queue, through pika (AMQP 0-9-1): a
producer publishing one persistent message per job at a fixed rate with publisher confirms,
and workers consuming with manual acknowledgements; threads of the run's own process, each
with its own connection.

Every answer goes to the ``Ledger`` (``workload``'s, with its event kinds):

- ``enqueued``: the broker confirmed the publish (``basic.ack`` on a channel in confirm
  mode). A publish that was refused (``basic.nack``, unroutable) or whose confirm never came
  (the connection died) is ``enqueue-failed``, and the producer publishes the job again as
  a new *copy* (a message of its own, numbered): a publisher that retries what it was not
  told is safe, as RabbitMQ tells publishers to, may put a job in the queue twice.
- ``executed``: a worker was handed a delivery (its copy, the broker's ``redelivered`` flag,
  the node the worker's connection is on); executing is taking it.
- ``completed``: the worker acknowledged it (``basic.ack``) and a synchronous call on the
  same channel was answered after it (``basic.qos``). AMQP 0-9-1 answers no acknowledgement:
  the later answer says the broker's channel read the acknowledgement before it, the most a
  consumer can know. An acknowledgement whose answer never came is ``call-failed``.

Clients connect to the node hosting the queue's leader first and, whenever a call fails,
reconnect through every node's address in turn (pika's list of connection parameters: the
first that accepts), the current leader's first: a killed node refuses at once and the next
is taken.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from crashqueuelab.lab.failover.workload import (
    CALL_FAILED,
    COMPLETED,
    ENQUEUE_FAILED,
    ENQUEUED,
    EXECUTED,
    IDLE_S,
    Ledger,
)

#: A client's connection attempt and each socket call give up after this (a killed node
#: refuses at once; one that hangs must not hold a thread).
SOCKET_TIMEOUT_S = 2.0
#: pika's heartbeat: a connection to a node that stopped answering is noticed.
HEARTBEAT_S = 5
#: A worker's outstanding deliveries: one at a time, as a job runner takes jobs.
PREFETCH = 1


def _error(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:300]


def connect(urls: Sequence[str]) -> Any:
    """A blocking pika connection to the first of ``urls`` that accepts."""
    import pika

    parameters = []
    for url in urls:
        each = pika.URLParameters(url)
        each.connection_attempts = 1
        each.socket_timeout = SOCKET_TIMEOUT_S
        each.blocked_connection_timeout = SOCKET_TIMEOUT_S * 5
        each.heartbeat = HEARTBEAT_S
        parameters.append(each)
    return pika.BlockingConnection(parameters)


def declare(urls: Sequence[str], queue: str, queue_type: str) -> None:
    """The queue, durable, as a client declares it (a quorum queue by its argument; a
    mirrored queue is a classic queue a policy matches)."""
    connection = connect(urls)
    try:
        arguments = {"x-queue-type": "quorum"} if queue_type == "quorum" else {}
        connection.channel().queue_declare(queue, durable=True, arguments=arguments)
    finally:
        connection.close()


def _close(connection: Any) -> None:
    with contextlib.suppress(Exception):  # a dead connection's close fails: nothing to keep
        connection.close()


@dataclass
class AmqpLoad:
    """The run's threads; ``start`` them, ``stop`` them (bounded), then read ``ledger``."""

    urls: Callable[[], list[str]]
    port_names: dict[int, str]
    queue: str
    keys: Sequence[str]
    workers: int
    rate_per_s: float
    ledger: Ledger
    #: How long a worker executes each job before it acknowledges it.
    work_s: float = 0.0
    stopping: threading.Event = field(default_factory=threading.Event)
    submitted_all: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    crashed: list[str] = field(default_factory=list)
    _copies: int = 0

    def start(self) -> None:
        bodies: list[tuple[str, Callable[[], None]]] = [("producer", self._produce)]
        bodies += [(f"worker-{n}", self._worker(f"worker-{n}")) for n in range(self.workers)]
        for name, body in bodies:
            # Daemons: a pika call stuck on a node that died must not keep the process up;
            # ``stop`` names such a thread.
            thread = threading.Thread(target=self._guarded, args=(name, body), name=name)
            thread.daemon = True
            self.threads.append(thread)
            thread.start()

    def stop(self, timeout_s: float) -> list[str]:
        self.stopping.set()
        deadline = time.monotonic() + timeout_s
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return [thread.name for thread in self.threads if thread.is_alive()]

    def _guarded(self, name: str, body: Callable[[], None]) -> None:
        try:
            body()
        except Exception as error:  # a thread's end is reported, never lost
            self.crashed.append(f"{name}: {_error(error)}")

    def _node(self, connection: Any) -> str | None:
        return self.port_names.get(connection._impl.params.port)

    def _produce(self) -> None:
        import pika

        interval = 1.0 / self.rate_per_s
        due = time.monotonic()
        connection: Any = None
        channel: Any = None
        try:
            for value, key in enumerate(self.keys):
                while not self.stopping.is_set():
                    self._copies += 1
                    copy = self._copies
                    try:
                        if channel is None:
                            connection = connect(self.urls())
                            channel = connection.channel()
                            channel.confirm_delivery()
                        body = json.dumps({"key": key, "copy": copy, "value": value})
                        channel.basic_publish(
                            "",
                            self.queue,
                            body.encode(),
                            pika.BasicProperties(delivery_mode=2, message_id=f"{key}/{copy}"),
                            mandatory=True,
                        )
                    except Exception as error:  # pika's own errors: the publisher told failure
                        self.ledger.note(ENQUEUE_FAILED, key, copy=copy, error=_error(error))
                        _close(connection)
                        connection = channel = None
                        self.stopping.wait(IDLE_S)
                        continue
                    self.ledger.note(ENQUEUED, key, copy=copy, node=self._node(connection))
                    break
                due = max(due + interval, time.monotonic())
                self.stopping.wait(max(0.0, due - time.monotonic()))
                if self.stopping.is_set():
                    return
            self.submitted_all.set()
        finally:
            if connection is not None:
                _close(connection)

    def _worker(self, worker_id: str) -> Callable[[], None]:
        def work() -> None:
            connection: Any = None
            deliveries: Any = None
            channel: Any = None
            try:
                while not self.stopping.is_set():
                    call, key = "consume", None
                    try:
                        if deliveries is None:
                            connection = connect(self.urls())
                            channel = connection.channel()
                            channel.basic_qos(prefetch_count=PREFETCH)
                            deliveries = channel.consume(self.queue, inactivity_timeout=IDLE_S)
                        method, _, body = next(deliveries)
                        if method is None:
                            continue
                        said = json.loads(body)
                        key = said["key"]
                        fields = {
                            "worker": worker_id,
                            "copy": said["copy"],
                            "redelivered": bool(method.redelivered),
                            "node": self._node(connection),
                        }
                        self.ledger.note(EXECUTED, key, **fields)
                        if self.work_s:
                            self.stopping.wait(self.work_s)
                        call = "ack"
                        channel.basic_ack(method.delivery_tag)
                        # Answered only after the channel read the acknowledgement.
                        channel.basic_qos(prefetch_count=PREFETCH)
                        self.ledger.note(COMPLETED, key, **fields)
                    except Exception as error:  # pika's own errors: the caller told failure
                        self.ledger.note(CALL_FAILED, key, call=call, error=_error(error))
                        _close(connection)
                        connection = channel = deliveries = None
                        self.stopping.wait(IDLE_S)
            finally:
                if connection is not None:
                    _close(connection)

        return work
