"""arq's crash points: around its calls, with the state each death must leave."""

from __future__ import annotations

from crashqueuelab.judges.readers.arq import COMPLETE, IN_PROGRESS, QUEUED
from crashqueuelab.systems.libraries.arq import LIBRARY

_point = LIBRARY.point


_NEW, _RUNNING, _DONE = (QUEUED, 0), (IN_PROGRESS, 1), (COMPLETE, 1)
#: The first occurrence of each point in the lab's workload: enqueue both jobs
#: (``enqueue_job``), run the effect job (``start_job``: ``Worker.start_jobs`` sets its
#: in-progress key and ``run_job`` counts the try and calls the function; the work;
#: ``finish``: the function returns and arq records the result), run the flaky job once
#: (``retry``: the function raises ``Retry`` and arq puts the job back, its try counted).
CRASH_POINTS = (
    _point("enqueue_job:before", None, None, 0),
    _point("enqueue_job:after", _NEW, None, 0),
    _point("start_job:before", _NEW, _NEW, 0),
    _point("start_job:after", _RUNNING, _NEW, 0),
    _point("BEFORE_EFFECT_COMMIT", _RUNNING, _NEW, 0),
    _point("AFTER_EFFECT_COMMIT", _RUNNING, _NEW, 1),
    _point("finish:before", _RUNNING, _NEW, 1),
    _point("finish:after", _DONE, _NEW, 1),
    _point("retry:before", _DONE, _RUNNING, 1),
    _point("retry:after", _DONE, (QUEUED, 1), 1),
)
