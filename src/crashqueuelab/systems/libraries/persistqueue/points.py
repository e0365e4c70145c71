"""persist-queue's crash points: around its calls, with the state each death must leave."""

from __future__ import annotations

from crashqueuelab.systems.libraries.persistqueue import LIBRARY

_point = LIBRARY.point

_NEW, _TAKEN, _DONE = ("inited", 0), ("unack", 1), ("acked", 1)
#: The first occurrence of each point in the lab's workload: submit both jobs, run the
#: effect job, fail the flaky job once (nack), then the first recover call.
CRASH_POINTS = (
    _point("submit:before", None, None, 0),
    _point("submit:after", _NEW, None, 0),
    _point("claim:before", _NEW, _NEW, 0),
    _point("claim:after", _TAKEN, _NEW, 0),
    _point("BEFORE_EFFECT_COMMIT", _TAKEN, _NEW, 0),
    _point("AFTER_EFFECT_COMMIT", _TAKEN, _NEW, 1),
    _point("ack:before", _TAKEN, _NEW, 1),
    _point("ack:after", _DONE, _NEW, 1),
    _point("fail:before", _DONE, ("unack", 1), 1),
    _point("fail:after", _DONE, ("ready", 1), 1),
)
