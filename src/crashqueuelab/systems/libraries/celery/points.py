"""Celery's crash points: around its calls, with the state each death must leave."""

from __future__ import annotations

from crashqueuelab.judges.readers.celery import QUEUED, RESERVED, STARTED, SUCCEEDED
from crashqueuelab.systems.crashpoints import CrashPoint
from crashqueuelab.systems.libraries.celery import LIBRARY

_point = LIBRARY.point


_NEW, _RECEIVED, _RUNNING, _DONE = (QUEUED, 0), (RESERVED, 1), (STARTED, 1), (SUCCEEDED, 1)
#: The first occurrence of each point in the lab's workload: publish both jobs
#: (``apply_async``), run the effect job (``receive``: kombu moves its message from the
#: queue to the ``unacked`` hash, ``unacked`` being the second half of that move;
#: ``execute``: Celery's ``Request.execute`` acknowledges it at Celery's default and
#: ``trace_task`` stores ``STARTED``; the work; ``finish``: the task returns, Celery stores
#: ``SUCCESS`` and, with ``task_acks_late``, acknowledges), run the flaky job once
#: (``retry``: ``Task.retry`` publishes the message again, its retries counted, and the first
#: is acknowledged).
CRASH_POINTS = (
    _point("apply_async:before", None, None, 0),
    _point("apply_async:after", _NEW, None, 0),
    _point("receive:before", _NEW, _NEW, 0),
    # Inside kombu's receive: the message is off the queue and not yet in the unacked hash.
    # A transport that moved it atomically would leave it received, as at receive:after.
    _point("unacked:before", _RECEIVED, _NEW, 0),
    _point("receive:after", _RECEIVED, _NEW, 0),
    _point("execute:before", _RECEIVED, _NEW, 0),
    _point("execute:after", _RUNNING, _NEW, 0),
    _point("BEFORE_EFFECT_COMMIT", _RUNNING, _NEW, 0),
    _point("AFTER_EFFECT_COMMIT", _RUNNING, _NEW, 1),
    _point("finish:before", _RUNNING, _NEW, 1),
    _point("finish:after", _DONE, _NEW, 1),
    _point("retry:before", _DONE, _RUNNING, 1),
    _point("retry:after", _DONE, (QUEUED, 1), 1),
)


#: On RabbitMQ the same calls, but kombu's receive is one ``basic.get`` (no unacked hash to
#: move it into): a message a dead process received and had not acknowledged goes back to
#: the queue as RabbitMQ sees the process's connection close, as it was (its retries
#: uncounted). At Celery's default a task is acknowledged as it starts, so a death while it
#: runs leaves it started; with ``task_acks_late`` it is queued again.
def crash_points_on_rabbitmq(acks_late: bool) -> tuple[CrashPoint, ...]:
    running = _NEW if acks_late else _RUNNING
    return (
        _point("apply_async:before", None, None, 0),
        _point("apply_async:after", _NEW, None, 0),
        _point("receive:before", _NEW, _NEW, 0),
        _point("receive:after", _NEW, _NEW, 0),
        _point("execute:before", _NEW, _NEW, 0),
        _point("execute:after", running, _NEW, 0),
        _point("BEFORE_EFFECT_COMMIT", running, _NEW, 0),
        _point("AFTER_EFFECT_COMMIT", running, _NEW, 1),
        _point("finish:before", running, _NEW, 1),
        _point("finish:after", _DONE, _NEW, 1),
        _point("retry:before", _DONE, running, 1),
        _point("retry:after", _DONE, (QUEUED, 1), 1),
    )
