"""RQ's crash points: around its calls, with the state each death must leave."""

from __future__ import annotations

from crashqueuelab.judges.readers.rq import DEQUEUED, FINISHED, QUEUED, STARTED
from crashqueuelab.systems.libraries.rq import LIBRARY

_point = LIBRARY.point


_NEW, _TAKEN, _RUNNING, _DONE = (QUEUED, 0), (DEQUEUED, 0), (STARTED, 1), (FINISHED, 1)
#: The first occurrence of each point in the lab's workload: enqueue both jobs, run the
#: effect job (dequeue, start, work, finish), run the flaky job once (dequeue, start, fail:
#: RQ enqueues it again with one retry fewer).
CRASH_POINTS = (
    _point("enqueue:before", None, None, 0),
    _point("enqueue:after", _NEW, None, 0),
    _point("dequeue:before", _NEW, _NEW, 0),
    _point("dequeue:after", _TAKEN, _NEW, 0),
    _point("start:before", _TAKEN, _NEW, 0),
    _point("start:after", _RUNNING, _NEW, 0),
    _point("BEFORE_EFFECT_COMMIT", _RUNNING, _NEW, 0),
    _point("AFTER_EFFECT_COMMIT", _RUNNING, _NEW, 1),
    _point("finish:before", _RUNNING, _NEW, 1),
    _point("finish:after", _DONE, _NEW, 1),
    _point("fail:before", _DONE, _RUNNING, 1),
    _point("fail:after", _DONE, (QUEUED, 1), 1),
)
