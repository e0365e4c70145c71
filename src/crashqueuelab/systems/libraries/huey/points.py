"""huey's crash points: around its calls, with the state each death must leave."""

from __future__ import annotations

from crashqueuelab.judges.readers.huey import DONE, QUEUED
from crashqueuelab.systems.libraries.huey import LIBRARY

_point = LIBRARY.point

_NEW, _DONE = (QUEUED, 0), (DONE, 1)
#: The first occurrence of each point in the lab's workload: enqueue both jobs, run the
#: effect job (dequeue, work, execute), run the flaky job once (dequeue, execute: it raises
#: and huey enqueues it again with one retry fewer). A dequeued task is in no table.
CRASH_POINTS = (
    _point("enqueue:before", None, None, 0),
    _point("enqueue:after", _NEW, None, 0),
    _point("dequeue:before", _NEW, _NEW, 0),
    _point("dequeue:after", None, _NEW, 0),
    _point("BEFORE_EFFECT_COMMIT", None, _NEW, 0),
    _point("AFTER_EFFECT_COMMIT", None, _NEW, 1),
    _point("execute:before", None, _NEW, 1),
    _point("execute:after", _DONE, _NEW, 1),
    _point("execute-error:before", _DONE, None, 1),
    _point("execute-error:after", _DONE, (QUEUED, 1), 1),
)
