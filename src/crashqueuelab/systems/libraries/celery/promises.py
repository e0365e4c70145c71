"""What Celery documents of itself: where it is weaker than the lab's contract."""

from __future__ import annotations

from crashqueuelab.systems.contract import Documented
from crashqueuelab.systems.libraries.celery.client import Settings


def documented_for(settings: Settings) -> tuple[Documented, ...]:
    return ()
