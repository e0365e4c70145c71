"""Phases around every committing transaction, and the hook type that observes them.

``BEFORE_*`` phases fire inside the open transaction after its writes, so a hook that
raises there rolls the whole transaction back; ``AFTER_*`` phases fire once COMMIT has
returned. The fault lab turns a chosen phase into a process death.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum


class Phase(StrEnum):
    """Every point at which the queue and the effect ledger call their hook."""

    BEFORE_SUBMIT_COMMIT = "BEFORE_SUBMIT_COMMIT"
    AFTER_SUBMIT_COMMIT = "AFTER_SUBMIT_COMMIT"
    BEFORE_CLAIM_COMMIT = "BEFORE_CLAIM_COMMIT"
    AFTER_CLAIM_COMMIT = "AFTER_CLAIM_COMMIT"
    BEFORE_HEARTBEAT_COMMIT = "BEFORE_HEARTBEAT_COMMIT"
    AFTER_HEARTBEAT_COMMIT = "AFTER_HEARTBEAT_COMMIT"
    BEFORE_EFFECT_COMMIT = "BEFORE_EFFECT_COMMIT"
    AFTER_EFFECT_COMMIT = "AFTER_EFFECT_COMMIT"
    BEFORE_SUCCESS_COMMIT = "BEFORE_SUCCESS_COMMIT"
    AFTER_SUCCESS_COMMIT = "AFTER_SUCCESS_COMMIT"
    BEFORE_FAILURE_COMMIT = "BEFORE_FAILURE_COMMIT"
    AFTER_FAILURE_COMMIT = "AFTER_FAILURE_COMMIT"
    BEFORE_RECOVERY_COMMIT = "BEFORE_RECOVERY_COMMIT"
    AFTER_RECOVERY_COMMIT = "AFTER_RECOVERY_COMMIT"
    BEFORE_PROMOTION_COMMIT = "BEFORE_PROMOTION_COMMIT"
    AFTER_PROMOTION_COMMIT = "AFTER_PROMOTION_COMMIT"


Hook = Callable[[Phase], None]


def no_hook(phase: Phase) -> None:
    """The default hook: observes nothing."""
