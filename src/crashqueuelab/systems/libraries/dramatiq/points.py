"""dramatiq's crash points: around its calls, with the state each death must leave."""

from __future__ import annotations

from crashqueuelab.judges.readers.dramatiq import ACKED, DELAYED, FETCHED, QUEUED
from crashqueuelab.systems.libraries.dramatiq import LIBRARY

_point = LIBRARY.point


_NEW, _TAKEN, _DONE = (QUEUED, 0), (FETCHED, 1), (ACKED, 1)
#: The first occurrence of each point in the lab's workload: enqueue both jobs
#: (``RedisBroker.enqueue``), run the effect job (``fetch``: the consumer's next message,
#: into the worker's acks set; the work; ``finish``: the middleware stores the result and
#: the consumer acknowledges), run the flaky job once (``fail``: ``Retries`` enqueues a
#: copy in the delay queue and the consumer acknowledges the failed delivery).
CRASH_POINTS = (
    _point("enqueue:before", None, None, 0),
    _point("enqueue:after", _NEW, None, 0),
    _point("fetch:before", _NEW, _NEW, 0),
    _point("fetch:after", _TAKEN, _NEW, 0),
    _point("BEFORE_EFFECT_COMMIT", _TAKEN, _NEW, 0),
    _point("AFTER_EFFECT_COMMIT", _TAKEN, _NEW, 1),
    _point("finish:before", _TAKEN, _NEW, 1),
    _point("finish:after", _DONE, _NEW, 1),
    _point("fail:before", _DONE, _TAKEN, 1),
    _point("fail:after", _DONE, (DELAYED, 1), 1),
)

#: On RabbitMQ, the same calls; a message the dead process held goes back to its queue as
#: RabbitMQ sees the process's connection close, as it was (no retry counted), so a death
#: while a job is taken leaves it queued.
CRASH_POINTS_ON_RABBITMQ = (
    _point("enqueue:before", None, None, 0),
    _point("enqueue:after", _NEW, None, 0),
    _point("fetch:before", _NEW, _NEW, 0),
    _point("fetch:after", _NEW, _NEW, 0),
    _point("BEFORE_EFFECT_COMMIT", _NEW, _NEW, 0),
    _point("AFTER_EFFECT_COMMIT", _NEW, _NEW, 1),
    _point("finish:before", _NEW, _NEW, 1),
    _point("finish:after", _DONE, _NEW, 1),
    _point("fail:before", _DONE, _NEW, 1),
    _point("fail:after", _DONE, (DELAYED, 1), 1),
)
