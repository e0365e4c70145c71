"""Celery's client: the lab's calls, made through Celery's and kombu's own code.

A submission is ``Task.apply_async`` with ``task_id`` the job's id (derived from the store's
queue and the lab's key). A claim is what Celery's worker does with a message, one step at a
time: kombu takes it from the queue (``Queue.get``: the Redis transport's ``basic_get``,
which keeps it in the ``unacked`` hash until it is acknowledged, as a consumer's delivery
does), and Celery's own ``Request.execute`` runs it in a thread of the adapter's: it
acknowledges at once at Celery's default (early acknowledgement), runs ``trace_task`` (which
stores ``STARTED``, then the task's result), and acknowledges after it with
``task_acks_late``. The task function waits inside the trace until the lab reports how the
work ended, then returns, calls ``Task.retry`` (Celery publishes the message again, its
``retries`` counted, and acknowledges the first) or raises, so that Celery itself records
the result. Celery's consumer loop never runs here: the lab's worker decides when to take
a job (the own worker, ``worker.py``, runs Celery's whole worker).

Celery has no token, no lease per claim and no heartbeat, and no idempotency key: a second
submission of a key is refused by the adapter when the store holds the task already. A
message received and not acknowledged comes back when kombu's ``restore_visible`` finds it
older than ``visibility_timeout`` on the wall clock (one hour by default), or when the
channel that received it closes (``restore_unacked``): the lab's clock moves nothing of it.

On RabbitMQ (``Settings.broker``, kombu's AMQP transport; the results still in Redis) the
claims, the outcomes and the readings are ``rabbitmq.CeleryRabbitmqClient``'s: this class's
claim and restore, and its look at waiting messages, are kombu's Redis transport's.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from crashqueuelab.core.errors import SystemUnavailable
from crashqueuelab.judges.readers.celery import (
    FAILED,
    QUEUE_FILE,
    QUEUED,
    RESERVED,
    RESULT_PREFIX,
    RETRIED,
    STARTED,
    SUCCEEDED,
    key_prefix,
    task_id,
)
from crashqueuelab.servers.rabbitmq import URL_VARIABLE
from crashqueuelab.systems.boundary import around
from crashqueuelab.systems.contract import Claim, JobSpec, JobStatus, JobView, OpenRequest, Verdict
from crashqueuelab.systems.libraries.redisstore import kept_once, unique_suffix
from crashqueuelab.systems.libraries.redisstore import redis_socket as shared_socket
from crashqueuelab.systems.libraries.skeleton import LibraryClient, tokenless_claim

#: The one task every lab job is.
TASK_NAME = "crashqueuelab.job"
#: How long the adapter waits for Celery's code (a start, a completion) before it says so.
CALL_TIMEOUT_S = 30.0
#: The visibility timeout the reliable configuration states (kombu's default: 3600 s).
RELIABLE_VISIBILITY_TIMEOUT_S = 30
#: Where a job stands (the reader's states), in the lab's words.
STATUS = {
    QUEUED: JobStatus.PENDING,
    RESERVED: JobStatus.LEASED,
    STARTED: JobStatus.LEASED,
    RETRIED: JobStatus.PENDING,
    SUCCEEDED: JobStatus.SUCCEEDED,
    FAILED: JobStatus.DEAD,
}
#: The attribute of a client's Celery app holding the executions it runs.
EXECUTIONS = "crashqueuelab_executions"
#: ``Settings.broker`` of Celery on RabbitMQ.
RABBITMQ = "rabbitmq"


@dataclass(frozen=True)
class Settings:
    """How a system configures Celery: its acknowledgement settings, as a run states them."""

    acks_late: bool = False
    reject_on_worker_lost: bool = False
    #: None: kombu's default (3600 s).
    visibility_timeout_s: int | None = None
    #: ``"redis"``: kombu's Redis transport on the run's Redis server; ``"rabbitmq"``: its
    #: AMQP transport (py-amqp) on the RabbitMQ node ``URL_VARIABLE`` names, which the test
    #: starts (a run of the lab starts none). Results are in Redis either way.
    broker: str = "redis"

    @property
    def words(self) -> str:
        on = " (broker RabbitMQ)" if self.broker == RABBITMQ else ""
        if not self.acks_late:
            return f"Celery's defaults: early acknowledgement (task_acks_late off){on}"
        # RabbitMQ has no visibility timeout: a message comes back when the channel that
        # received it closes.
        timeout = f", visibility_timeout {self.visibility_timeout_s or 3600} s" if not on else ""
        return (
            "task_acks_late, task_reject_on_worker_lost"
            f" {'on' if self.reject_on_worker_lost else 'off'}{timeout}{on}"
        )


DEFAULTS = Settings()
RELIABLE = Settings(True, True, RELIABLE_VISIBILITY_TIMEOUT_S)


class JobFailed(Exception):
    """What the lab's task raises inside Celery's trace when the lab's work failed on its
    last attempt, or when it runs outside the lab."""


class Abandoned(BaseException):
    """Raised inside the task of an execution whose client closed before the lab reported
    its outcome: its process is taken for gone, and Celery's trace lets a BaseException
    through without storing a result or acknowledging (its process would have died)."""


#: The work of the worker process Celery's own worker runs in (``worker.serve`` sets it,
#: under ``"work"``): a prefork pool's children are forked from that process after it is
#: set, and Celery hands a task nothing of the worker that runs it, so a holder the task
#: reads is the only way in. Process-wide, not a context variable: each greenlet of the
#: gevent pool starts with an empty context.
SERVED_WORK: dict[str, Callable[[str], None]] = {}


class Execution(threading.Thread):
    """Celery's ``Request.execute`` of one received message, paused inside the task until
    the lab says how the work ended."""

    def __init__(self, request: Any) -> None:
        super().__init__(name=f"celery-execution-{request.id}", daemon=True)
        self.request = request
        self.entered = threading.Event()
        self.decided = threading.Event()
        self.failure: str | None = None
        self.retry = False
        self.attempt = 0
        self.abandoned = False
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.request.execute()
        except Abandoned:
            pass
        except BaseException as error:  # reported to the claim or the completion
            self.error = error
        finally:
            self.entered.set()

    def await_decision(self, attempt: int) -> str | None:
        self.attempt = attempt
        self.entered.set()
        if not self.decided.wait(CALL_TIMEOUT_S * 10):
            raise JobFailed("the lab never reported how the work ended")
        if self.abandoned:
            raise Abandoned()
        return self.failure

    def abandon(self) -> None:
        """End the execution as its process's death would: nothing recorded, nothing
        acknowledged."""
        if self.decided.is_set():
            return
        self.abandoned = True
        self.decided.set()
        self.join(CALL_TIMEOUT_S)

    def finish(self, failure: str | None, retry: bool) -> bool:
        if self.decided.is_set() or not self.is_alive():
            return False
        self.failure, self.retry = failure, retry
        self.decided.set()
        self.join(CALL_TIMEOUT_S)
        if self.error is not None:
            raise self.error
        return True


def lab_task(task: Any, key: str, job_type: str, payload: dict[str, Any], limit: int) -> int:
    """The task every lab job runs. Run by the adapter's execution, it waits for the lab's
    outcome; run by Celery's own worker (``worker.serve``), it does the worker process's
    work for ``key``."""
    executions: dict[str, Execution] | None = getattr(task.app, EXECUTIONS, None)
    attempt = int(task.request.retries) + 1
    if executions is not None and task.request.id in executions:
        execution = executions[task.request.id]
        failure = execution.await_decision(attempt)
        if failure is None:
            return 0
        if execution.retry:
            # Celery's retry: the message published again, its retries counted, at once.
            raise task.retry(exc=JobFailed(failure), countdown=0, max_retries=limit - 1)
        raise JobFailed(failure)
    work = SERVED_WORK.get("work")
    if work is None:
        raise JobFailed(f"job {key} runs only under crashqueuelab (its adapter or its worker)")
    work(key)
    return 0


def store_queue(directory: Path) -> str:
    """The store's queue name, named in its directory (made on the first open)."""
    kept = kept_once(
        directory / QUEUE_FILE, lambda: {"queue": f"celery-lab-{unique_suffix(directory)}"}
    )
    return str(kept["queue"])


def redis_socket() -> str:
    return shared_socket("celery")


def broker_url(settings: Settings, socket: str) -> str:
    """The broker's URL: the run's Redis server, or the RabbitMQ node it names."""
    if settings.broker != RABBITMQ:
        return f"redis+socket://{socket}"
    url = os.environ.get(URL_VARIABLE)
    if not url:
        raise SystemUnavailable(
            "celery", f"no RabbitMQ node: Celery's RabbitMQ broker needs {URL_VARIABLE} set"
        )
    return url


def quiet_celery() -> None:
    """Celery logs every task and the traceback of every failure: the lab's own logs say
    what happened, and a crash child's stderr is for its errors."""
    for name in ("celery", "kombu"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def make_app(queue: str, socket: str, settings: Settings) -> Any:
    """The Celery app of one store: its queue, kombu's key prefix for it, the Redis result
    backend, and ``settings``. ``task_track_started`` and ``result_extended`` only add to
    what the result backend records (a started task, its retries), so that a task
    acknowledged at its start is still seen; nothing of delivery changes with them."""
    from celery import Celery
    from celery.result import _set_task_join_will_block

    # As Celery's worker does for its pool (``worker.components.Pool``): no result is ever
    # waited for here, so a publish subscribes to none. Otherwise the Redis backend
    # subscribes to each task's result channel as it is sent, and an AsyncResult collected
    # during that subscription unsubscribes on the same pubsub connection: measured, a
    # model workload hung for good (1 run in 4) inside redis-py's subscribe.
    _set_task_join_will_block(True)
    app = Celery(f"crashqueuelab-{queue}", set_as_current=False)
    # kombu's Redis transport's options (its AMQP transport has neither).
    transport: dict[str, Any] = {}
    if settings.broker != RABBITMQ:
        transport["global_keyprefix"] = key_prefix(queue)
        if settings.visibility_timeout_s is not None:
            transport["visibility_timeout"] = settings.visibility_timeout_s
    app.conf.update(
        broker_url=broker_url(settings, socket),
        result_backend=f"redis+socket://{socket}",
        broker_transport_options=transport,
        task_default_queue=queue,
        task_track_started=True,
        result_extended=True,
        # Results are kept (Celery's default: a day, then a cleanup task removes them).
        result_expires=None,
        task_acks_late=settings.acks_late,
        task_reject_on_worker_lost=settings.reject_on_worker_lost,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    app.task(name=TASK_NAME, bind=True)(lab_task)
    return app


class CeleryClient(LibraryClient):
    """``QueueClient`` over one Celery queue on its Redis broker (on RabbitMQ its submissions
    and its executions serve ``rabbitmq.CeleryRabbitmqClient``)."""

    def __init__(self, request: OpenRequest, settings: Settings) -> None:
        socket = redis_socket()
        quiet_celery()
        self.hook = request.hook
        self.settings = settings
        self.queue = store_queue(request.directory)
        self.executions: dict[str, Execution] = {}
        self.app = make_app(self.queue, socket, settings)
        setattr(self.app, EXECUTIONS, self.executions)
        self.task = self.app.tasks[TASK_NAME]
        # The adapter's own look at the broker's keys, by their whole names (kombu's client
        # prefixes only the commands kombu itself sends).
        import redis

        # Any: redis-py's types answer every command with a sync-or-async union.
        self.redis: Any = redis.Redis(unix_socket_path=socket)
        prefix = key_prefix(self.queue)
        self.queue_key, self.unacked_key = f"{prefix}{self.queue}", f"{prefix}unacked"
        self.connection = self.app.connection_for_read()
        try:
            self.channel = self.connection.default_channel
            self.entity = self.app.amqp.queues[self.queue].bind(self.channel)
            self.entity.declare()
        except BaseException:
            self.connection.release()
            self.redis.close()
            raise

    def _id(self, key: str) -> str:
        return task_id(self.queue, key)

    def _messages(self) -> list[tuple[str, dict[str, Any]]]:
        """Each message of the store as kombu keeps it: waiting, or received and not
        acknowledged; with its headers."""
        waiting = [(QUEUED, json.loads(raw)) for raw in self.redis.lrange(self.queue_key, 0, -1)]
        held = [(RESERVED, json.loads(raw)[0]) for raw in self.redis.hvals(self.unacked_key)]
        return [(where, message["headers"]) for where, message in waiting + held]

    def _known(self, identifier: str) -> bool:
        if self.app.AsyncResult(identifier).state != "PENDING":
            return True
        return any(headers["id"] == identifier for _, headers in self._messages())

    def submit_many(self, jobs: Sequence[JobSpec]) -> list[str]:
        for job in jobs:
            identifier = self._id(job.key)
            # Celery has no idempotency key: a producer's retry sends nothing the store has.
            if self._known(identifier):
                continue
            publish = partial(
                self.task.apply_async,
                (job.key, job.job_type, dict(job.payload), job.max_attempts),
                task_id=identifier,
                queue=self.queue,
            )
            around(self.hook, "apply_async", publish)
        return [self._id(job.key) for job in jobs]

    def _receive(self) -> Any:
        qos = self.channel.qos
        hold = qos.append

        def append(message: Any, delivery_tag: Any) -> Any:
            # kombu's basic_get has taken the message off its queue (RPOP) and keeps it in
            # the unacked hash only now, in a call of its own: a death between is the point
            # ``unacked:before``. kombu's own method runs; the hook only sees it begin.
            return around(self.hook, "unacked", partial(hold, message, delivery_tag))

        qos.append = append
        try:
            return self.entity.get(no_ack=False, accept=["json"])
        finally:
            del qos.append

    def _start(self, message: Any) -> Execution:
        from celery.worker.request import Request

        request = Request(
            message,
            app=self.app,
            task=self.task,
            on_ack=message.ack_log_error,
            on_reject=lambda logger, errors, requeue: message.reject_log_error(
                logger, errors, requeue=requeue
            ),
            connection_errors=self.connection.connection_errors,
        )
        execution = Execution(request)
        self.executions[request.id] = execution
        execution.start()
        if not execution.entered.wait(CALL_TIMEOUT_S):
            raise SystemUnavailable("celery", f"Celery did not start a task in {CALL_TIMEOUT_S} s")
        if execution.error is not None:
            raise execution.error
        return execution

    def _take(self, worker_id: str) -> Execution | None:
        """The next message, received and started as Celery's worker does (None: none)."""
        message = around(self.hook, "receive", self._receive)
        if message is None:
            return None
        execution: Execution = around(self.hook, "execute", partial(self._start, message))
        return execution

    def claim(self, worker_id: str, lease_us: int) -> Claim | None:
        execution = self._take(worker_id)
        if execution is None:
            return None
        if not execution.is_alive() or execution.attempt == 0:
            # Celery ended it without running the task (revoked, or past its expiry).
            return None
        key, job_type, payload, _ = execution.request.args
        return tokenless_claim(
            job_id=execution.request.id,
            key=str(key),
            job_type=str(job_type),
            payload=dict(payload),
            attempt=execution.attempt,
            worker_id=worker_id,
            handle=execution,
        )

    def heartbeat(self, claim: Claim, lease_us: int) -> bool:
        from crashqueuelab.core.errors import OperationUnsupported

        raise OperationUnsupported("celery", "heartbeat")

    def _finish(self, claim: Claim, failure: str | None, retry: bool) -> bool:
        """The lab's outcome told to the claim's execution; False when it had ended."""
        execution: Execution = claim.handle  # type: ignore[assignment]
        return execution.finish(failure, retry)

    def succeed(self, claim: Claim) -> Verdict:
        done = around(self.hook, "finish", partial(self._finish, claim, None, False))
        return Verdict.SUCCEEDED if done else Verdict.STALE

    def fail(self, claim: Claim, error: str) -> Verdict:
        execution: Execution = claim.handle  # type: ignore[assignment]
        limit = int(execution.request.args[3])
        retry = claim.attempt < limit
        point = "retry" if retry else "fail"
        if not around(self.hook, point, partial(self._finish, claim, error, retry)):
            return Verdict.STALE
        return Verdict.RETRY if retry else Verdict.DEAD

    def recover(self) -> int:
        # kombu's own maintenance, which a consumer runs as it polls: messages received
        # longer ago than visibility_timeout (on the wall clock) go back to their queue.
        before = int(self.redis.hlen(self.unacked_key))
        self.channel.qos.restore_visible(start=0, num=1000, interval=1)
        return before - int(self.redis.hlen(self.unacked_key))

    def job(self, key: str) -> JobView | None:
        identifier = self._id(key)
        result = self.app.AsyncResult(identifier)
        state = str(result.state)
        retries = int(getattr(result, "retries", None) or 0)
        if state in ("SUCCESS", "FAILURE"):
            native = SUCCEEDED if state == "SUCCESS" else FAILED
            return JobView(key, STATUS[native], retries + 1, native)
        for where, headers in self._messages():
            if headers["id"] != identifier:
                continue
            if where == QUEUED:
                return JobView(key, JobStatus.PENDING, int(headers["retries"]), QUEUED)
            attempts = int(headers["retries"]) + 1
            native = STARTED if state == "STARTED" and retries + 1 == attempts else RESERVED
            return JobView(key, STATUS[native], attempts, native)
        if state == "STARTED":
            return JobView(key, JobStatus.LEASED, retries + 1, STARTED)
        if state == "RETRY":
            return JobView(key, JobStatus.PENDING, retries + 1, RETRIED)
        return None

    def active_count(self) -> int:
        # Messages and started or retried results, less those with a result: an acknowledged
        # running task is in no queue, and acks_late's result is stored before its ack.
        unfinished = {str(headers["id"]) for _, headers in self._messages()}
        finished: set[str] = set()
        for name in self.redis.scan_iter(match=f"{RESULT_PREFIX}{self.queue}-*", count=1000):
            meta = json.loads(self.redis.get(name) or "{}")
            finished_now = meta.get("status") in ("SUCCESS", "FAILURE")
            (finished if finished_now else unfinished).add(str(meta.get("task_id")))
        return len(unfinished - finished)

    def close(self) -> None:
        # A closed client is a process gone: the executions it held end unrecorded, then
        # kombu's own close puts back what the channel received and did not acknowledge
        # (restore_unacked), as a worker's connection does when it closes.
        for execution in list(self.executions.values()):
            execution.abandon()
        try:
            self.connection.release()
        finally:
            self.redis.close()
            self.app.close()
