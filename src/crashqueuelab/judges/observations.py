"""The observation log against the lease rules and the store: what the callers were told
must be possible. Times in its anomalies count from the log's first line, in seconds.

Each line of the log is one thing a caller was told (``lab/workloads/model.py`` writes it): a job
submitted under a key, a lease claimed with its deadline, a heartbeat, an acknowledgement
or a failure with the system's verdict, a clock step, a restart. Replaying it with nothing
but the rules of a fenced lease, this judge names:

- a lease observed by two holders at once (a claim while another lease was live);
- an acknowledgement accepted at or after its lease's deadline, or for a lease that was
  no longer the job's;
- an acknowledgement accepted while the store does not show the job succeeded;
- one key that returned two job ids; a claim beyond the job's attempts, or of a job already
  acknowledged;
- what the system reports about itself (``read`` and ``count`` lines) that differs from
  what its callers were told: an attempt's holder, number, deadline (the last one a claim or
  an accepted heartbeat set, even a nearer one) or outcome; at the end of the run, a job's
  status and attempts, or the count of unfinished jobs, that differ from the store.

It imports nothing of the code it judges.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crashqueuelab.judges.findings import Anomaly, Fact, Kind


@dataclass
class _Lease:
    worker: str
    token: str
    deadline: int
    attempt: int = 0
    ended: bool = False
    #: How its holder was told it ended: ``succeeded``, ``failed``, or None.
    outcome: str | None = None


@dataclass
class ObservationVerdict:
    checked: int = 0
    findings: list[Anomaly] = field(default_factory=list)

    @property
    def anomalies(self) -> list[str]:
        return [finding.text for finding in self.findings]


@dataclass
class _Replay:
    verdict: ObservationVerdict = field(default_factory=ObservationVerdict)
    job_ids: dict[str, str] = field(default_factory=dict)
    max_attempts: dict[str, int] = field(default_factory=dict)
    leases: dict[str, _Lease] = field(default_factory=dict)
    tokens: dict[tuple[str, str], _Lease] = field(default_factory=dict)
    finished: dict[str, str] = field(default_factory=dict)
    acknowledged: set[str] = field(default_factory=set)
    #: Every lease granted on each key, in the order of its claims.
    granted: dict[str, list[_Lease]] = field(default_factory=dict)

    #: The first line's time: anomalies give times from here, in seconds.
    origin: int | None = None

    def at(self, t: int) -> str:
        """``t`` as the seconds since the run began: "5.000001 s"."""
        return f"{(t - (self.origin or 0)) / 1_000_000:.6f}".rstrip("0").rstrip(".") + " s"

    def problem(
        self,
        line: dict[str, Any],
        kind: Kind,
        text: str,
        *,
        attempt: int | None = None,
        limit: int | None = None,
        **facts: Fact,
    ) -> None:
        self.verdict.findings.append(
            Anomaly(
                kind,
                f"job {line['key']}: {text} (at {self.at(line['t'])})",
                job=line["key"],
                attempt=attempt,
                limit=limit,
                facts=facts,
            )
        )

    def ending(self, lease: _Lease, t: int) -> str:
        """How ``lease`` ended, as its holder was told, by ``t``: ``succeeded``, ``failed``,
        ``expired`` (its deadline passed with no report accepted), or ``live`` (no report,
        and its deadline still ahead)."""
        if lease.outcome is not None:
            return lease.outcome
        return "expired" if lease.ended or t >= lease.deadline else "live"

    def submit(self, line: dict[str, Any]) -> None:
        key, job_id = line["key"], line["job_id"]
        known = self.job_ids.setdefault(key, job_id)
        self.max_attempts.setdefault(key, line["max_attempts"])
        if known != job_id:
            self.problem(
                line,
                Kind.KEY_GAVE_TWO_JOBS,
                f"submitted again, the key gave job {job_id}; it names {known}",
            )

    def claim(self, line: dict[str, Any]) -> None:
        key, t = line["key"], line["t"]
        live = self.leases.get(key)
        attempt = line["attempt"]
        if live is not None and not live.ended and t < live.deadline:
            self.problem(
                line,
                Kind.CLAIMED_WHILE_LEASED,
                f"claimed by {line['worker']} (lease {line['token']}) while {live.worker}'s"
                f" lease {live.token} was live until {self.at(live.deadline)}",
                attempt=attempt,
                worker=line["worker"],
                holder=live.worker,
            )
        if key in self.acknowledged:
            self.problem(
                line,
                Kind.CLAIMED_AFTER_ACKNOWLEDGEMENT,
                f"claimed by {line['worker']} after an accepted acknowledgement",
                attempt=attempt,
                worker=line["worker"],
            )
        limit = self.max_attempts.get(key)
        if limit is not None and attempt > limit:
            endings = [self.ending(lease, t) for lease in self.granted.get(key, [])]
            self.problem(
                line,
                Kind.ATTEMPT_BEYOND_LIMIT,
                f"handed out as attempt {attempt} of {limit}",
                attempt=attempt,
                limit=limit,
                # What tells an uncounted expiry from a failure counted wrong.
                previous_attempt=endings[-1] if endings else "none",
                expired_before=endings.count("expired"),
                failed_before=endings.count("failed"),
                succeeded_before=endings.count("succeeded"),
                # Within the limit but for the attempts that ended with no report (expired,
                # or handed out again while live): what a library that counts only the
                # attempts its holders reported does.
                past_the_limit_by_unreported_attempts=(
                    endings.count("failed") + endings.count("succeeded") < limit
                ),
            )
        lease = _Lease(line["worker"], line["token"], line["deadline"], line["attempt"])
        self.leases[key] = lease
        self.tokens[(key, line["token"])] = lease
        self.granted.setdefault(key, []).append(lease)

    def heartbeat(self, line: dict[str, Any]) -> None:
        lease = self.tokens.get((line["key"], line["token"]))
        if line["ok"] and lease is not None:
            if lease.ended or line["t"] >= lease.deadline or self.leases[line["key"]] is not lease:
                self.problem(
                    line,
                    Kind.DEAD_HEARTBEAT_ACCEPTED,
                    f"a heartbeat of the dead lease {line['token']} was accepted",
                    attempt=lease.attempt,
                    worker=line["worker"],
                )
            lease.deadline = line["deadline"]

    def holder_verdict(self, line: dict[str, Any], what: str, late: Kind, overdue: Kind) -> None:
        key, t = line["key"], line["t"]
        lease = self.tokens.get((key, line["token"]))
        accepted = line["verdict"] != "stale"
        if not accepted or lease is None:
            return
        if lease.ended or self.leases.get(key) is not lease:
            self.problem(
                line,
                late,
                f"{what} of the ended lease {line['token']} was accepted",
                attempt=lease.attempt,
                worker=line["worker"],
            )
        elif t >= lease.deadline:
            self.problem(
                line,
                overdue,
                f"{what} by {line['worker']} at its deadline or later (deadline"
                f" {self.at(lease.deadline)}) was accepted",
                attempt=lease.attempt,
                worker=line["worker"],
            )
        lease.ended = True
        lease.outcome = "succeeded" if line["verdict"] == "succeeded" else "failed"
        if line["verdict"] == "succeeded":
            self.acknowledged.add(key)

    def read(self, line: dict[str, Any], final: dict[str, tuple[str, int]]) -> None:
        """The system's own report of one job against what its callers were told (and, at
        the end of the run, against the store)."""
        key = line["key"]
        if line.get("final") and key in final and line["view"] is not None:
            status, attempts = final[key]
            reported = (line["view"]["status"], line["view"]["attempts"])
            if reported != (status, attempts):
                self.problem(
                    line,
                    Kind.REPORT_DIFFERS,
                    f"the system reports it {reported[0]} after {reported[1]} attempts; the"
                    f" store holds it {status} after {attempts}",
                    about="status",
                    reported=reported[0],
                    stored=status,
                )
        if line.get("attempts") is None:
            return
        reported_attempts = {entry["token"]: entry for entry in line["attempts"]}
        granted = {lease.token: lease for lease in self.granted.get(key, [])}
        for token in sorted(granted.keys() - reported_attempts.keys()):
            self.problem(
                line,
                Kind.REPORT_DIFFERS,
                f"the system reports no attempt for lease {token}, granted",
                about="attempts",
            )
        for token in sorted(reported_attempts.keys() - granted.keys()):
            self.problem(
                line,
                Kind.REPORT_DIFFERS,
                f"the system reports an attempt under lease {token}, never granted",
                about="attempts",
            )
        for token, lease in granted.items():
            entry = reported_attempts.get(token)
            if entry is not None:
                self._compare_attempt(line, lease, entry)

    def _compare_attempt(self, line: dict[str, Any], lease: _Lease, entry: dict[str, Any]) -> None:
        told = {"attempt": lease.attempt, "worker": lease.worker, "deadline": lease.deadline}
        for name, value in told.items():
            if entry[name] != value:
                self.problem(
                    line,
                    Kind.REPORT_DIFFERS,
                    f"the system reports {name} {entry[name]} for lease {lease.token}; its"
                    f" holder was told {value}",
                    attempt=lease.attempt,
                    about=name,
                )
        allowed = (lease.outcome,) if lease.outcome is not None else (None, "expired")
        if entry["outcome"] not in allowed:
            told_outcome = lease.outcome or "nothing (open, or expired)"
            self.problem(
                line,
                Kind.REPORT_DIFFERS,
                f"the system reports lease {lease.token} {entry['outcome'] or 'open'}; its"
                f" holder was told {told_outcome}",
                attempt=lease.attempt,
                about="outcome",
            )

    def count(self, line: dict[str, Any], final: dict[str, tuple[str, int]]) -> None:
        unfinished = sum(status in ("pending", "leased") for status, _ in final.values())
        if line.get("final") and line["active"] != unfinished:
            self.verdict.findings.append(
                Anomaly(
                    Kind.REPORT_DIFFERS,
                    f"the system counts {line['active']} unfinished jobs; the store holds"
                    f" {unfinished} (at {self.at(line['t'])})",
                    facts={"about": "count"},
                )
            )


def judge_observations(
    log: Path, final_status: dict[str, str], final_attempts: dict[str, int] | None = None
) -> ObservationVerdict:
    """Replay ``log``; ``final_status`` is each key's status in the store (lab words), and
    ``final_attempts`` its attempts (where given, the system's final reports of each job
    are compared with both)."""
    replay = _Replay()
    final = (
        {}
        if final_attempts is None
        else {key: (status, final_attempts.get(key, 0)) for key, status in final_status.items()}
    )
    for raw in log.read_text(encoding="utf-8").splitlines():
        if not raw:
            continue
        line = json.loads(raw)
        if replay.origin is None:
            replay.origin = line["t"]
        replay.verdict.checked += 1
        op = line["op"]
        if op == "submit":
            replay.submit(line)
        elif op == "claim":
            replay.claim(line)
        elif op == "heartbeat":
            replay.heartbeat(line)
        elif op == "ack":
            replay.holder_verdict(
                line,
                "an acknowledgement",
                Kind.LATE_ACKNOWLEDGEMENT_ACCEPTED,
                Kind.ACKNOWLEDGEMENT_AT_DEADLINE_ACCEPTED,
            )
        elif op == "fail":
            replay.holder_verdict(
                line,
                "a failure report",
                Kind.LATE_FAILURE_REPORT_ACCEPTED,
                Kind.FAILURE_REPORT_AT_DEADLINE_ACCEPTED,
            )
        elif op == "read":
            replay.read(line, final)
        elif op == "count" and final:
            replay.count(line, final)
    for key in sorted(replay.acknowledged):
        status = final_status.get(key, "missing")
        if status != "succeeded":
            replay.verdict.findings.append(
                Anomaly(
                    Kind.STORE_DIFFERS,
                    f"job {key}: an acknowledgement was accepted, but the store shows it {status}",
                    job=key,
                    facts={"told": "succeeded", "stored": status},
                )
            )
    return replay.verdict
