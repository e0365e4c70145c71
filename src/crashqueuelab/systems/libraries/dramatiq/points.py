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
#: copy in the delay queue and the consumer acknowledges the failed delivery), then, in the
#: last claim, move that copy once due (``move``: the worker fetched it from the delay
#: queue, enqueues it on its queue, then acknowledges the delayed one). A death between the
#: two leaves both live: the reader reads the job as its delayed copy and names the second
#: copy as a problem of the store, which the moved-twice weakness (``promises.py``) takes.
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
    _point("move:before", _DONE, (DELAYED, 1), 1),
    _point("move:after", _DONE, (DELAYED, 1), 1),
)

#: On RabbitMQ, the same calls; a message the dead process held goes back to its queue as
#: RabbitMQ sees the process's connection close, as it was (no retry counted), so a death
#: while a job is taken leaves it queued. No ``move``: the consumer of the delay queue
#: receives the due copy in the background, and the workload's last claim does not find it
#: there at a point the case could cut (its chaos reaches it: ``claim_cut``).
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
