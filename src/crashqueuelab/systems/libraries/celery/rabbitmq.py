"""Celery on its RabbitMQ broker (``celery-rabbitmq``, ``celery-rabbitmq-acks-late``): each
lab worker is one consumer as RabbitMQ sees it.

A claim is kombu's ``Queue.get`` (AMQP ``basic.get``, unacknowledged) on a connection and a
channel of the lab worker's own, so that what a worker holds goes back to the queue as
RabbitMQ sees that connection close ("any delivery (message) that was not acked is
automatically requeued when the channel (or connection) on which the delivery happened is
closed"); Celery's own ``Request.execute`` runs it, as on Redis (``client.Execution``).
py-amqp writes an acknowledgement to the socket and RabbitMQ answers none: after each step
that may have acknowledged (the execution's start at Celery's default, its end with
``task_acks_late``, where a retry or a last failure rejects it without requeue instead) the
adapter makes one round trip on the channel (``basic.qos``), which RabbitMQ answers after
the frames before it, so the settling of a message the adapter reported is one RabbitMQ
has. Celery's publishes (a submission, a retry) go on the app's producer connection at its
defaults, unconfirmed: no round trip covers them. Celery's own worker does not wait (at
least once, with late acknowledgement, allows it).

A message a consumer holds is in no reading (the judges' reader takes the ready messages
over AMQP and puts them back): the adapter remembers each publish that returned
(``celery-published.jsonl`` in the store's directory), takes a published task with no ready
message and no result as received by a consumer, and publishes no key twice. ``recover``
has nothing to do: RabbitMQ puts back a gone consumer's messages itself.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from crashqueuelab.core.errors import SystemUnavailable
from crashqueuelab.judges.readers.celery import (
    FAILED,
    RESERVED,
    SUCCEEDED,
    read_celery_rabbitmq_store,
)
from crashqueuelab.servers.rabbitmq import URL_VARIABLE
from crashqueuelab.systems.boundary import around
from crashqueuelab.systems.contract import Claim, JobSpec, JobView, OpenRequest
from crashqueuelab.systems.libraries.celery.client import (
    STATUS,
    CeleryClient,
    Execution,
    Settings,
    redis_socket,
)
from crashqueuelab.systems.libraries.redisstore import record_line, recorded_keys

#: The tasks whose publish returned, in the store's directory.
PUBLISHED_FILE = "celery-published.jsonl"


@dataclass(frozen=True)
class Consumer:
    """One lab worker's connection to the node, its channel and the store's queue on it."""

    connection: Any
    channel: Any
    queue: Any


class CeleryRabbitmqClient(CeleryClient):
    """``QueueClient`` over one Celery queue on its RabbitMQ broker."""

    def __init__(self, request: OpenRequest, settings: Settings) -> None:
        super().__init__(request, settings)
        self.directory = request.directory
        self.consumers: dict[str, Consumer] = {}
        self.held: dict[Execution, Consumer] = {}

    def _jobs(self) -> dict[str, tuple[str, int]]:
        """Every task of the store: the reader's, and each published one with no ready
        message and no result as received by a consumer (its attempt unknown: 0)."""
        url = os.environ.get(URL_VARIABLE)
        if not url:
            raise SystemUnavailable("celery", f"no RabbitMQ node: {URL_VARIABLE} is unset")
        jobs = dict(read_celery_rabbitmq_store(self.directory, url, redis_socket()).jobs)
        for key in recorded_keys(self.directory / PUBLISHED_FILE):
            jobs.setdefault(key, (RESERVED, 0))
        return jobs

    def submit_many(self, jobs: Sequence[JobSpec]) -> list[str]:
        known = set(self._jobs())
        for job in jobs:
            # Celery has no idempotency key: a producer's retry sends nothing the store has.
            if job.key in known:
                continue
            known.add(job.key)
            publish = partial(
                self.task.apply_async,
                (job.key, job.job_type, dict(job.payload), job.max_attempts),
                task_id=self._id(job.key),
                queue=self.queue,
            )
            around(self.hook, "apply_async", publish)
            record_line(self.directory / PUBLISHED_FILE, job.key, self._id(job.key))
        return [self._id(job.key) for job in jobs]

    def _forget(self, worker_id: str) -> None:
        """A consumer whose connection broke is let go: the worker's next claim opens a new
        one (RabbitMQ put back what the broken one held)."""
        consumer = self.consumers.pop(worker_id, None)
        if consumer is not None:
            with contextlib.suppress(Exception):
                consumer.connection.collect()

    def _consumer(self, worker_id: str) -> Consumer:
        if worker_id not in self.consumers:
            connection = self.app.connection_for_read()
            try:
                channel = connection.default_channel
                queue = self.app.amqp.queues[self.queue].bind(channel)
            except BaseException:
                connection.release()
                raise
            self.consumers[worker_id] = Consumer(connection, channel, queue)
        return self.consumers[worker_id]

    def _started(self, consumer: Consumer, message: Any) -> Execution:
        execution = self._start(message)
        try:
            # At Celery's default the message was acknowledged as the task started.
            flushed(consumer)
        except BaseException:
            # Its claim fails: the execution ends unrecorded, as its process's death would.
            execution.abandon()
            raise
        return execution

    def _take(self, worker_id: str) -> Execution | None:
        consumer = self._consumer(worker_id)
        receive = partial(consumer.queue.get, no_ack=False, accept=["json"])
        try:
            message = around(self.hook, "receive", receive)
            if message is None:
                return None
            execution: Execution = around(
                self.hook, "execute", partial(self._started, consumer, message)
            )
        except consumer.connection.connection_errors:
            self._forget(worker_id)
            raise
        self.held[execution] = consumer
        return execution

    def _finish(self, claim: Claim, failure: str | None, retry: bool) -> bool:
        execution: Execution = claim.handle  # type: ignore[assignment]
        if not execution.finish(failure, retry):
            return False
        # With task_acks_late the message was settled as the task ended (acknowledged, or
        # rejected without requeue after a retry or a last failure).
        flushed(self.held.pop(execution))
        if retry and self._retry_unpublished(execution):
            raise SystemUnavailable("celery", f"the retry of {claim.key} was not published")
        return True

    def _retry_unpublished(self, execution: Execution) -> bool:
        """Whether Task.retry's publish failed: Celery then rejected the message and stored
        nothing, so the result is still this attempt's STARTED (a retry published and
        already taken by another worker stores its own, one retry later)."""
        result = self.app.AsyncResult(execution.request.id)
        retries = int(getattr(result, "retries", None) or 0)
        return str(result.state) == "STARTED" and retries == execution.attempt - 1

    def recover(self) -> int:
        # RabbitMQ puts a gone consumer's messages back itself, as it sees its connection
        # close: there is no maintenance to run.
        return 0

    def job(self, key: str) -> JobView | None:
        found = self._jobs().get(key)
        if found is None:
            return None
        state, attempts = found
        return JobView(key, STATUS[state], attempts, state)

    def active_count(self) -> int:
        return sum(1 for state, _ in self._jobs().values() if state not in (SUCCEEDED, FAILED))

    def close(self) -> None:
        # A closed client is a process gone: its executions end unrecorded, and closing each
        # consumer's connection puts back what it held, as a killed worker's does.
        for execution in list(self.executions.values()):
            execution.abandon()
        consumers, self.consumers = list(self.consumers.values()), {}
        self.held.clear()
        try:
            with contextlib.ExitStack() as releasing:
                # Each released, whatever the others raise (the first error is raised).
                for consumer in consumers:
                    releasing.callback(consumer.connection.release)
        finally:
            super().close()


def flushed(consumer: Consumer) -> None:
    """One round trip on the consumer's channel: RabbitMQ answers ``basic.qos`` after the
    frames before it (an acknowledgement py-amqp wrote), so what was sent is taken."""
    consumer.channel.basic_qos(0, 0, False)
