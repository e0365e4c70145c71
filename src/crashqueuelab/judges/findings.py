"""One finding of the lab, as data: what happened (its ``Kind``), to which job, at which
attempt, at which point, with the facts that tell its causes apart, beside the line the lab
prints for it (``text``, the lab's words on pages and in JSON).

A system's documented weaknesses name the kinds they explain and the conditions on these
fields (``systems.contract.Documented``): "handed out as attempt 2 of 1" is one kind,
``attempt_beyond_limit``, whose ``previous_attempt`` fact says whether the attempt before it
expired without a report or failed, and only the first may be what a library documents.

Every producer of anomaly lines (the judges, the probes, the crash cases, chaos, the
heartbeat run, the contract's rules) makes these records; each record file keeps them as
``findings`` beside its ``anomalies``. A line without one (a record kept before findings
existed) is matched by its text alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

#: A fact's value.
Fact = str | int | bool


class Kind(StrEnum):
    """The closed set of what the lab finds, one name per distinct finding (docs/systems.md
    lists each with its fields and facts)."""

    # What a caller was told, against the rules of a fenced lease.
    CLAIMED_WHILE_LEASED = "claimed_while_leased"
    CLAIMED_AFTER_ACKNOWLEDGEMENT = "claimed_after_acknowledgement"
    ATTEMPT_BEYOND_LIMIT = "attempt_beyond_limit"
    LATE_ACKNOWLEDGEMENT_ACCEPTED = "late_acknowledgement_accepted"
    ACKNOWLEDGEMENT_AT_DEADLINE_ACCEPTED = "acknowledgement_at_deadline_accepted"
    LATE_FAILURE_REPORT_ACCEPTED = "late_failure_report_accepted"
    FAILURE_REPORT_AT_DEADLINE_ACCEPTED = "failure_report_at_deadline_accepted"
    DEAD_HEARTBEAT_ACCEPTED = "dead_heartbeat_accepted"
    LIVE_REPORT_ANSWERED_WRONG = "live_report_answered_wrong"
    LIVE_HEARTBEAT_REFUSED = "live_heartbeat_refused"
    KEY_GAVE_TWO_JOBS = "key_gave_two_jobs"
    CLAIM_NOT_OFFERED = "claim_not_offered"
    UNEXPECTED_CLAIM = "unexpected_claim"
    LAST_FAILURE_NOT_DEAD = "last_failure_not_dead"
    EXPIRED_LAST_ATTEMPT_NOT_DEAD = "expired_last_attempt_not_dead"
    RETRY_NOT_READY = "retry_not_ready"
    LEASE_LOST_ON_RESTART = "lease_lost_on_restart"
    # What the system says of itself, and what its store holds.
    REPORT_DIFFERS = "report_differs"
    STORE_DIFFERS = "store_differs"
    STORE_INCONSISTENT = "store_inconsistent"
    SYSTEM_RAISED = "system_raised"
    CAPABILITY_MISSING = "capability_missing"
    # A crash case: the child's death, the crash state, the recovery.
    CHILD_DIED_ELSEWHERE = "child_died_elsewhere"
    CRASH_POINT_NOT_REACHED = "crash_point_not_reached"
    CRASH_STATE_DIFFERS = "crash_state_differs"
    ACKNOWLEDGED_WORK_LOST = "acknowledged_work_lost"
    SERVER_REFUSED_CRASH_STATE = "server_refused_crash_state"
    LOST_IN_RECOVERY = "lost_in_recovery"
    ATTEMPTS_WENT_BACK = "attempts_went_back"
    FINISHED_JOB_UNDONE = "finished_job_undone"
    EFFECTS_NOT_ONCE = "effects_not_once"
    RECOVERY_UNFINISHED = "recovery_unfinished"
    # A run of many workers: chaos and the heartbeat run.
    LOST = "lost"
    UNFINISHED = "unfinished"
    DEAD_LETTERED = "dead_lettered"
    DEAD_LETTERED_OFF_ITS_LIMIT = "dead_lettered_off_its_limit"
    POISON_SUCCEEDED = "poison_succeeded"
    EFFECT_DUPLICATED = "effect_duplicated"
    EFFECT_MISSING = "effect_missing"
    EFFECT_NOT_SUBMITTED = "effect_not_submitted"
    ACKNOWLEDGED_TWICE = "acknowledged_twice"
    OVERLAPPING_LEASES = "overlapping_leases"
    WORKER_EXITED = "worker_exited"
    WORK_STALLED = "work_stalled"
    WORK_NEVER_ENDED = "work_never_ended"
    DEADLINE_PASSED = "deadline_passed"
    NEVER_RUN = "never_run"
    RUN_AGAIN = "run_again"
    # A deploy run: workers stopped by signals, a grace period, then SIGKILL.
    LOST_IN_DEPLOY = "lost_in_deploy"
    RAN_TWICE = "ran_twice"
    RAN_BESIDE_LIVE_HOLDER = "ran_beside_live_holder"
    SCHEDULED_EARLY = "scheduled_early"
    SCHEDULED_LATE = "scheduled_late"
    # The pytest plugin: one assertion of a contract rule.
    CONTRACT_RULE_FAILED = "contract_rule_failed"


#: The fields every finding has beside its facts, by the names a condition uses.
FIELDS = ("job", "attempt", "limit", "point")


@dataclass(frozen=True)
class Anomaly:
    """One finding. ``parts``: the findings of a line that joins several (a crash case's
    reasons); the line is explained only when each of its parts is."""

    kind: Kind
    text: str
    job: str | None = None
    attempt: int | None = None
    limit: int | None = None
    point: str | None = None
    facts: Mapping[str, Fact] = field(default_factory=dict)
    parts: tuple[Anomaly, ...] = ()

    def value(self, name: str) -> Fact | None:
        """The field or fact ``name`` (None where the finding has none)."""
        if name in FIELDS:
            found: Fact | None = getattr(self, name)
            return found
        return self.facts.get(name)

    def within(self, prefix: str, *, point: str | None = None, **facts: Fact) -> Anomaly:
        """The same finding on a line that names where it was found (``case ID: ``,
        ``model workload: ``), with that place's point and facts; so are its parts."""
        return Anomaly(
            self.kind,
            prefix + self.text,
            self.job,
            self.attempt,
            self.limit,
            self.point if point is None else point,
            {**self.facts, **facts},
            tuple(part.within("", point=point, **facts) for part in self.parts),
        )

    def leaves(self) -> tuple[Anomaly, ...]:
        """What must be explained for this line to be: its parts, or itself."""
        return self.parts or (self,)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "kind": self.kind.value,
            "text": self.text,
            "job": self.job,
            "attempt": self.attempt,
            "limit": self.limit,
            "point": self.point,
            "facts": dict(self.facts),
        }
        if self.parts:
            data["parts"] = [part.to_json() for part in self.parts]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Anomaly | None:
        """The finding a record keeps; None for a kind this lab does not know (its line is
        then matched by its text alone)."""
        parts = [cls.from_json(part) for part in data.get("parts", ())]
        if data.get("kind") not in KIND_NAMES or None in parts:
            return None
        return cls(
            Kind(data["kind"]),
            str(data["text"]),
            data.get("job"),
            data.get("attempt"),
            data.get("limit"),
            data.get("point"),
            dict(data.get("facts") or {}),
            tuple(part for part in parts if part is not None),
        )


KIND_NAMES = frozenset(kind.value for kind in Kind)


def joined(prefix: str, reasons: Sequence[Anomaly], **facts: Fact) -> Anomaly:
    """One line of several reasons (``prefix`` and each reason's text, "; " between): its
    kind is the first reason's, and each reason is a part of it."""
    first = reasons[0]
    return Anomaly(
        first.kind,
        prefix + "; ".join(reason.text for reason in reasons),
        first.job,
        first.attempt,
        first.limit,
        first.point,
        {**first.facts, **facts},
        tuple(reasons),
    )


def texts(findings: Sequence[Anomaly]) -> list[str]:
    """The lines of ``findings``, as the lab prints them."""
    return [finding.text for finding in findings]


def to_json(findings: Sequence[Anomaly]) -> list[dict[str, Any]]:
    return [finding.to_json() for finding in findings]


def restored(lines: Sequence[str], kept: Sequence[Mapping[str, Any]] | None) -> list[Anomaly | str]:
    """A record's anomaly ``lines`` with the findings it kept beside them (``kept``): each
    line its finding where the record has one for it, else the line alone (a record kept
    before findings existed, or a kind this lab does not know)."""
    by_text: dict[str, Anomaly] = {}
    for data in kept or ():
        finding = Anomaly.from_json(data)
        if finding is not None:
            by_text.setdefault(finding.text, finding)
    return [by_text.get(line, line) for line in lines]


def system_raised(error: BaseException, text: str | None = None, **facts: Fact) -> Anomaly:
    """The system under test raised ``error`` (``text``: the lab's line for it, by default
    "the system raised TYPE: MESSAGE")."""
    name = type(error).__name__
    line = f"the system raised {name}: {error}" if text is None else text
    return Anomaly(Kind.SYSTEM_RAISED, line, facts={"error": name, **facts})


def inconsistent(problem: str, prefix: str = "") -> Anomaly:
    """What a system's independent reader found wrong in its store (``prefix``: where)."""
    return Anomaly(Kind.STORE_INCONSISTENT, prefix + problem, facts={"problem": problem})
