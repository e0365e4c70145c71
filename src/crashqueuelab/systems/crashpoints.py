"""What a crash point is: a named place where the campaign kills a child, the durable state
that death must leave (as the system's reader reports it), and the families of points
around a transition's COMMIT (its reply lost, the COMMIT still open, its transaction id
reused), named after the phase ``AFTER_<T>_COMMIT`` they die at."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ExpectedState:
    """The durable state a death at one crash point must leave, as the reader reports it.

    ``effect_job`` and ``flaky_job`` are ``(native state, attempts)`` or None when the job
    must not exist; ``facts`` are the reader's further observations (a last event, a torn
    tail) that tell this point apart.

    ``effect_deadline`` declares the effect job's lease deadline durable: which grant set the
    deadline the store must hold (``"claim"``, ``"heartbeat"``, or ``"none"`` when the job is
    not leased). It is compared in both crash modes, as the jobs are; None declares nothing.
    """

    effect_job: tuple[str, int] | None
    flaky_job: tuple[str, int] | None
    effects: int
    facts: Mapping[str, Any] = field(default_factory=dict, hash=False)
    effect_deadline: str | None = None

    def signature(self) -> dict[str, Any]:
        deadline = (
            {} if self.effect_deadline is None else {"effect_job_deadline": self.effect_deadline}
        )
        return {
            "effect_job": None if self.effect_job is None else list(self.effect_job),
            "flaky_job": None if self.flaky_job is None else list(self.flaky_job),
            "effect_job_effects": self.effects,
            **deadline,
            **self.facts,
        }


@dataclass(frozen=True)
class CrashPoint:
    """A named point where the campaign kills a child, and what the death must leave.

    With ``after``, the case first kills a child at that point and then kills a second
    child, which is recovering from the first death, at this one (a crash during recovery).

    ``unacknowledged`` is for a point between an operation's write and its sync: the state
    before that operation, which a power cut may also leave because the operation was never
    acknowledged. Nothing else is excused: after a power cut, the jobs must stand as
    ``expected`` says (or as ``unacknowledged`` says, where set).
    """

    name: str
    where: str
    expected: ExpectedState
    after: str | None = None
    unacknowledged: ExpectedState | None = None

    def power_loss_states(self) -> list[dict[str, Any]]:
        """The signatures a power cut here may leave."""
        states = [self.expected] + ([self.unacknowledged] if self.unacknowledged else [])
        return [state.signature() for state in states]


#: A crash point named ``<T>_COMMIT_REPLY_LOST`` is the death at ``AFTER_<T>_COMMIT`` of a
#: child whose connection lost the server's answer to that transition's COMMIT: the
#: system must have found out what happened before it told its caller.
REPLY_LOST_SUFFIX = "_COMMIT_REPLY_LOST"


def _family_point(after: str, suffix: str) -> str:
    """The crash point of a COMMIT family (``suffix``) at the phase ``AFTER_<T>_COMMIT``."""
    return after.removeprefix("AFTER_").removesuffix("_COMMIT") + suffix


def _family_phases(point: str, suffix: str) -> tuple[str, str] | None:
    """For a crash point of a COMMIT family (``suffix``), the phases before and after its
    transition's COMMIT; None for any other point."""
    if not point.endswith(suffix):
        return None
    transition = point.removesuffix(suffix)
    return f"BEFORE_{transition}_COMMIT", f"AFTER_{transition}_COMMIT"


def reply_lost_point(after: str) -> str:
    """The reply-lost crash point of the phase ``AFTER_<T>_COMMIT``."""
    return _family_point(after, REPLY_LOST_SUFFIX)


def reply_lost_phases(point: str) -> tuple[str, str] | None:
    """For a reply-lost crash point, the phase before its COMMIT (where the answers start
    being dropped) and the one after it (where the child dies); None for any other point."""
    return _family_phases(point, REPLY_LOST_SUFFIX)


def phase_before(point: str) -> str | None:
    """The phase before the step whose aftermath ``point`` is: ``BEFORE_<T>_COMMIT`` for
    ``AFTER_<T>_COMMIT`` and for every COMMIT family of it (reply lost, open, id reused);
    ``<call>:before`` for a library's ``<call>:after`` (``systems.boundary``); None for any
    other point (a phase before a step itself: the step never ran)."""
    if point.startswith("AFTER_") and point.endswith("_COMMIT"):
        return "BEFORE_" + point.removeprefix("AFTER_")
    if point.endswith(":after"):
        return point.removesuffix(":after") + ":before"
    for suffix in (REPLY_LOST_SUFFIX, OPEN_COMMIT_SUFFIX, ID_REUSED_SUFFIX):
        phases = _family_phases(point, suffix)
        if phases is not None:
            return phases[0]
    return None


#: A crash point named ``<T>_COMMIT_OPEN`` is the death at ``AFTER_<T>_COMMIT`` of a child
#: whose COMMIT was still in progress on the server (waiting for a synchronous standby that
#: did not answer) when its connection was reset, and went on once the standby did: the
#: system must have waited for the outcome before it told its caller.
OPEN_COMMIT_SUFFIX = "_COMMIT_OPEN"


def open_commit_point(after: str) -> str:
    """The open-commit crash point of the phase ``AFTER_<T>_COMMIT``."""
    return _family_point(after, OPEN_COMMIT_SUFFIX)


def open_commit_phases(point: str) -> tuple[str, str] | None:
    """For an open-commit crash point, the phase before its COMMIT (where the standby is
    held and the answers start being dropped) and the one after it (where the child dies);
    None for any other point."""
    return _family_phases(point, OPEN_COMMIT_SUFFIX)


#: A crash point named ``<T>_COMMIT_ID_REUSED`` is the death at ``AFTER_<T>_COMMIT`` of a
#: child whose server crashed as the transition's COMMIT was on its way (before it was
#: durable), started again, and handed the transaction's id to another session, which
#: committed, before the system asked about it: the system must not take the other's
#: outcome for its own.
ID_REUSED_SUFFIX = "_COMMIT_ID_REUSED"


def id_reused_point(after: str) -> str:
    """The id-reused crash point of the phase ``AFTER_<T>_COMMIT``."""
    return _family_point(after, ID_REUSED_SUFFIX)


def id_reused_phases(point: str) -> tuple[str, str] | None:
    """For an id-reused crash point, the phase before its COMMIT (where the server crashes)
    and the one after it (where the child dies); None for any other point."""
    return _family_phases(point, ID_REUSED_SUFFIX)
