"""taskiq's crash points: around its calls, with the state each death must leave."""

from __future__ import annotations

from crashqueuelab.judges.readers.taskiq import PENDING, QUEUED, SUCCEEDED
from crashqueuelab.systems.crashpoints import (
    CrashPoint,
)
from crashqueuelab.systems.libraries.taskiq import LIBRARY

#: No death leaves the reclaim lock held (the reader's ``reclaim_lock``): a consumer holds
#: it only while it runs XAUTOCLAIM, and none of these points is inside that.
_FREE = {"reclaim_lock": {"held": False}}


def _point(
    name: str, effect: tuple[str, int] | None, flaky: tuple[str, int] | None, effects: int
) -> CrashPoint:
    return LIBRARY.point(name, effect, flaky, effects, _FREE)


_NEW, _HELD, _DONE = (QUEUED, 0), (PENDING, 1), (SUCCEEDED, 1)
#: The first occurrence of each point in the lab's workload: kick both jobs (``kiq``: one
#: XADD each); the first claim's ``listen`` (one XREADGROUP, which delivers every new entry
#: at once: both jobs are pending for this consumer from then on, the flaky one too); the
#: effect job's work and ``finish`` (the receiver saves its result and acknowledges it);
#: the flaky job's failure (``retry``: the retry middleware kicks its next attempt as a new
#: entry, then the receiver acknowledges the old one).
CRASH_POINTS = (
    _point("kiq:before", None, None, 0),
    _point("kiq:after", _NEW, None, 0),
    _point("listen:before", _NEW, _NEW, 0),
    _point("listen:after", _HELD, _HELD, 0),
    _point("BEFORE_EFFECT_COMMIT", _HELD, _HELD, 0),
    _point("AFTER_EFFECT_COMMIT", _HELD, _HELD, 1),
    _point("finish:before", _HELD, _HELD, 1),
    _point("finish:after", _DONE, _HELD, 1),
    _point("retry:before", _DONE, _HELD, 1),
    _point("retry:after", _DONE, (QUEUED, 1), 1),
)
