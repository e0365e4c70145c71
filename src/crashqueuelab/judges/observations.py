"""The observation log against the lease rules and the store: what the callers were told
must be possible.

Each line of the log is one thing a caller was told (``lab/model.py`` writes it): a job
submitted under a key, a lease claimed with its deadline, a heartbeat, an acknowledgement
or a failure with the system's verdict, a clock step, a restart. Replaying it with nothing
but the rules of a fenced lease, this judge names:

- a lease observed by two holders at once (a claim while another lease was live);
- an acknowledgement accepted at or after its lease's deadline, or for a lease that was
  no longer the job's;
- an acknowledgement accepted while the store does not show the job succeeded;
- one key that returned two job ids; a claim beyond the job's attempts, or of a job already
  acknowledged.

It imports nothing of the code it judges.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class _Lease:
    worker: str
    token: str
    deadline: int
    ended: bool = False


@dataclass
class ObservationVerdict:
    checked: int = 0
    anomalies: list[str] = field(default_factory=list)


@dataclass
class _Replay:
    verdict: ObservationVerdict = field(default_factory=ObservationVerdict)
    job_ids: dict[str, str] = field(default_factory=dict)
    max_attempts: dict[str, int] = field(default_factory=dict)
    leases: dict[str, _Lease] = field(default_factory=dict)
    tokens: dict[tuple[str, str], _Lease] = field(default_factory=dict)
    finished: dict[str, str] = field(default_factory=dict)
    acknowledged: set[str] = field(default_factory=set)

    def problem(self, line: dict[str, Any], text: str) -> None:
        self.verdict.anomalies.append(f"job {line['key']}: {text} (at t={line['t']} us)")

    def submit(self, line: dict[str, Any]) -> None:
        key, job_id = line["key"], line["job_id"]
        known = self.job_ids.setdefault(key, job_id)
        self.max_attempts.setdefault(key, line["max_attempts"])
        if known != job_id:
            self.problem(line, f"submitted again, the key gave job {job_id}; it names {known}")

    def claim(self, line: dict[str, Any]) -> None:
        key, t = line["key"], line["t"]
        live = self.leases.get(key)
        if live is not None and not live.ended and t < live.deadline:
            self.problem(
                line,
                f"claimed by {line['worker']} (lease {line['token']}) while {live.worker}'s"
                f" lease {live.token} was live until t={live.deadline}",
            )
        if key in self.acknowledged:
            self.problem(line, f"claimed by {line['worker']} after an accepted acknowledgement")
        limit = self.max_attempts.get(key)
        if limit is not None and line["attempt"] > limit:
            self.problem(line, f"handed out as attempt {line['attempt']} of {limit}")
        lease = _Lease(line["worker"], line["token"], line["deadline"])
        self.leases[key] = lease
        self.tokens[(key, line["token"])] = lease

    def heartbeat(self, line: dict[str, Any]) -> None:
        lease = self.tokens.get((line["key"], line["token"]))
        if line["ok"] and lease is not None:
            if lease.ended or line["t"] >= lease.deadline or self.leases[line["key"]] is not lease:
                self.problem(line, f"a heartbeat of the dead lease {line['token']} was accepted")
            lease.deadline = line["deadline"]

    def holder_verdict(self, line: dict[str, Any], what: str) -> None:
        key, t = line["key"], line["t"]
        lease = self.tokens.get((key, line["token"]))
        accepted = line["verdict"] != "stale"
        if not accepted or lease is None:
            return
        if lease.ended or self.leases.get(key) is not lease:
            self.problem(line, f"{what} of the ended lease {line['token']} was accepted")
        elif t >= lease.deadline:
            self.problem(
                line,
                f"{what} by {line['worker']} at its deadline or later (deadline t="
                f"{lease.deadline}) was accepted",
            )
        lease.ended = True
        if line["verdict"] == "succeeded":
            self.acknowledged.add(key)


def judge_observations(log: Path, final_status: dict[str, str]) -> ObservationVerdict:
    """Replay ``log``; ``final_status`` is each key's status in the store (lab words)."""
    replay = _Replay()
    for raw in log.read_text(encoding="utf-8").splitlines():
        if not raw:
            continue
        line = json.loads(raw)
        replay.verdict.checked += 1
        op = line["op"]
        if op == "submit":
            replay.submit(line)
        elif op == "claim":
            replay.claim(line)
        elif op == "heartbeat":
            replay.heartbeat(line)
        elif op == "ack":
            replay.holder_verdict(line, "an acknowledgement")
        elif op == "fail":
            replay.holder_verdict(line, "a failure report")
    for key in sorted(replay.acknowledged):
        status = final_status.get(key, "missing")
        if status != "succeeded":
            replay.verdict.anomalies.append(
                f"job {key}: an acknowledgement was accepted, but the store shows it {status}"
            )
    return replay.verdict
