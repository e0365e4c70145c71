"""pgqueuer's crash points: around its calls, with the state each death must leave."""

from __future__ import annotations

from crashqueuelab.systems.libraries.pgqueuer import LIBRARY

_point = LIBRARY.point

_NEW, _PICKED = ("queued", 0), ("picked", 1)
#: The first occurrence of each point in the lab's workload: enqueue both jobs, run the
#: effect job (dequeue, heartbeat, work, log it successful); the flaky job's failure with
#: attempts left changes nothing in the store.
CRASH_POINTS = (
    _point("enqueue:before", None, None, 0),
    _point("enqueue:after", _NEW, None, 0),
    _point("dequeue:before", _NEW, _NEW, 0),
    _point("dequeue:after", _PICKED, _NEW, 0),
    _point("heartbeat:before", _PICKED, _NEW, 0),
    _point("heartbeat:after", _PICKED, _NEW, 0),
    _point("BEFORE_EFFECT_COMMIT", _PICKED, _NEW, 0),
    _point("AFTER_EFFECT_COMMIT", _PICKED, _NEW, 1),
    _point("log_jobs-successful:before", _PICKED, _NEW, 1),
    _point("log_jobs-successful:after", ("successful", 1), _NEW, 1),
)
