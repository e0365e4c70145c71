"""procrastinate's crash points: around its calls, with the state each death must leave."""

from __future__ import annotations

from crashqueuelab.systems.libraries.procrastinate import LIBRARY

_point = LIBRARY.point

_NEW, _DOING = ("todo", 0), ("doing", 1)
#: The first occurrence of each point in the lab's workload: defer both jobs, run the
#: effect job (fetch_job, update_heartbeat, work, finish_job), run the flaky job once
#: (fetch_job, the retry strategy, retry_job: todo again with one attempt ended).
CRASH_POINTS = (
    _point("defer:before", None, None, 0),
    _point("defer:after", _NEW, None, 0),
    _point("fetch_job:before", _NEW, _NEW, 0),
    _point("fetch_job:after", _DOING, _NEW, 0),
    _point("update_heartbeat:before", _DOING, _NEW, 0),
    _point("update_heartbeat:after", _DOING, _NEW, 0),
    _point("BEFORE_EFFECT_COMMIT", _DOING, _NEW, 0),
    _point("AFTER_EFFECT_COMMIT", _DOING, _NEW, 1),
    _point("finish_job:before", _DOING, _NEW, 1),
    _point("finish_job:after", ("succeeded", 1), _NEW, 1),
    _point("retry_job:before", ("succeeded", 1), _DOING, 1),
    _point("retry_job:after", ("succeeded", 1), ("todo", 1), 1),
)
