"""A model workload's observation log as a chain of events a person reads: who was granted
which lease until when, what struck (a restart, a carrier's death), who was told what, and
what the store holds at the end; times in seconds from the run's start, each lease by the
first characters that tell it from the chain's others."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from crashqueuelab.lab.pages.tokens import short_names


def seconds_from(t: int, origin: int) -> str:
    """``t`` as seconds after ``origin``: "5.000001 s", "0 s"."""
    return f"{(t - origin) / 1_000_000:.6f}".rstrip("0").rstrip(".") + " s"


def _told(line: dict[str, Any], origin: int, leases: dict[str, str]) -> tuple[str, str, str]:
    """(who, what happened, what they were told) for one line of the log."""
    op = line["op"]
    who = line.get("worker", "")
    lease = f"lease {leases[str(line['token'])]}" if "token" in line else ""
    if op == "submit":
        return (
            "producer",
            f"submitted {line['key']} (up to {line['max_attempts']} attempts)",
            (f"job {line['job_id']}"),
        )
    if op == "claim":
        until = seconds_from(line["deadline"], origin)
        batch = " in a batch" if line.get("batch") else ""
        return (
            who,
            f"claimed {line['key']}{batch}",
            f"{lease}, attempt {line['attempt']}, until {until}",
        )
    if op in ("ack", "fail"):
        verb = "acknowledged" if op == "ack" else "reported a failure of"
        chained = " (chained)" if line.get("chained") else ""
        return who, f"{verb} {line['key']}{chained} under {lease}", line["verdict"]
    if op == "heartbeat":
        until = seconds_from(line["deadline"], origin)
        verdict = "accepted" if line["ok"] else "refused"
        return who, f"heartbeat of {line['key']} under {lease}, asking until {until}", verdict
    if op == "clock":
        return "clock", "the clock moved", ""
    if op == "recover":
        return "recovery", "recovered expired leases", f"{line['moved']} moved"
    if op == "restart":
        return "fault", "the store was closed and opened again", ""
    if op == "carried":
        return "fault", f"the next call waits behind another writer, which {line['fate']}", ""
    if op == "read":
        view = line.get("view")
        status = (
            "not found" if view is None else f"{view['status']} after {view['attempts']} attempts"
        )
        final = " (end of run)" if line.get("final") else ""
        return "system", f"reports {line['key']}{final}", status
    if op == "count":
        return "system", "counts unfinished jobs", str(line["active"])
    return "system", op, str(line.get("error", ""))


def observation_chain(log: Path, store: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The log's lines as rows (``at``, ``who``, ``what``, ``told``, ``fault``), then one row
    per job of ``store`` saying what the independent reader found there at the end."""
    lines = [json.loads(raw) for raw in log.read_text(encoding="utf-8").splitlines() if raw]
    origin = lines[0]["t"] if lines else 0
    leases = short_names(str(line["token"]) for line in lines if "token" in line)
    rows = []
    for line in lines:
        who, what, told = _told(line, origin, leases)
        rows.append(
            {"at": seconds_from(line["t"], origin), "who": who, "what": what, "told": told,
             "fault": who == "fault", "key": line.get("key", "")}
        )  # fmt: skip
    end = seconds_from(lines[-1]["t"], origin) if lines else "0 s"
    for key, job in sorted((store or {}).items()):
        rows.append(
            {"at": end, "who": "store", "what": f"the independent reader finds {key}",
             "told": f"{job['status']} after {job['attempts']} attempts", "fault": False,
             "key": key}
        )  # fmt: skip
    return rows
