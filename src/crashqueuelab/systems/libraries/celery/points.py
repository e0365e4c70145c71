"""Celery's crash points: around its calls, with the state each death must leave."""

from __future__ import annotations

from crashqueuelab.judges.readers.celery import QUEUED, RESERVED, STARTED, SUCCEEDED
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
