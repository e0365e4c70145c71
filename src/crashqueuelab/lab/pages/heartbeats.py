"""The page of a heartbeat experiment: each job's executions on one time axis, a job run
twice at once shown as two bars side by side, with what the store holds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from crashqueuelab.lab.pages.charts import LaneChart
from crashqueuelab.lab.pages.common import Verdict, View, promises_of, system_label

#: One colour per worker (the lanes are jobs; a bar's colour says who ran it).
_WORKER_COLOURS = ("#1a73e8", "#e37400", "#188038", "#9334e6", "#c5221f", "#007b83")
_RUN_AGAIN = "#d93025"
#: Where the library's own guard ended an execution (cut it, or killed its process).
_ENDED_BY_LIBRARY = "#202124"
_HOW = {"cut": "cut by the library's own guard", "killed": "killed by the library's own guard"}
#: The colours of the chaos page's network windows, for the same faults.
_HOLDING = {"stall": "#9acd32", "partition": "#8d6e63"}
#: A worker frozen by a pause, then stopped.
_PAUSED = "#5f6368"


def _paused_lanes(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One lane per worker a pause froze, its window as a bar."""
    pauses = report.get("pauses") or {}
    return [
        {
            "label": f"{entry['target']} paused",
            "spans": [
                {
                    "start": entry["start"],
                    "end": entry["end"],
                    "color": _PAUSED,
                    "title": f"{entry['target']} frozen from {entry['start']:.2f} s to"
                    f" {entry['end']:.2f} s, then sent {entry['then']}",
                }
            ],
            "dots": [],
        }
        for entry in pauses.get("delivered", [])
    ]


def _held_lanes(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One lane per worker whose connection a network fault held, its windows as bars."""
    network = report.get("network") or {}
    lanes: dict[str, list[dict[str, Any]]] = {}
    for window in network.get("windows", []):
        if window["kind"] not in _HOLDING:
            continue
        for path in window["paths"]:
            lanes.setdefault(path, []).append(
                {
                    "start": window["start_s"],
                    "end": window["end_s"],
                    "color": _HOLDING[window["kind"]],
                    "title": f"{window['kind']}: {path}'s connection held from"
                    f" {window['start_s']:.2f} s to {window['end_s']:.2f} s",
                }
            )
    return [
        {"label": f"{path} held", "spans": spans, "dots": []}
        for path, spans in sorted(lanes.items())
    ]


def _lanes(report: dict[str, Any]) -> tuple[list[dict[str, Any]], float]:
    workers = sorted({run["worker"] for run in report["executions"]})
    colour = {w: _WORKER_COLOURS[i % len(_WORKER_COLOURS)] for i, w in enumerate(workers)}
    end = max(
        [report["timings"]["run_s"]]
        + [run["end_s"] or run["start_s"] for run in report["executions"]]
    )
    rows = []
    for key in report["jobs"]:
        runs = [run for run in report["executions"] if run["key"] == key]
        # One lane per execution: two executions at once are two bars one above the other.
        for index, run in enumerate(runs):
            finish = end if run["end_s"] is None else run["end_s"]
            label = key if index == 0 else f"{key} again"
            how = _HOW.get(run.get("how", "ended"))
            ended = f" ({how})" if how else " (still running)" if run["end_s"] is None else ""
            span = {
                "start": run["start_s"],
                "end": finish,
                "color": colour[run["worker"]],
                "title": f"{label}, by {run['worker']}: {run['start_s']:.2f} s to"
                f" {finish:.2f} s{ended}",
            }
            dots = (
                []
                if index == 0
                else [
                    {"at": run["start_s"], "color": _RUN_AGAIN, "title": f"{key} handed out again"}
                ]
            )
            if how:
                dots.append({"at": finish, "color": _ENDED_BY_LIBRARY, "title": f"{key}: {how}"})
            rows.append({"label": label, "spans": [span], "dots": dots})
    return rows, max(end, 0.001)


def _network_options(network: dict[str, Any] | None) -> str:
    if not network:
        return ""
    plan = network["plan"]
    options = [f" --{key} {plan[key]}" for key in ("stalls", "partitions") if plan[key]]
    if plan["latency_ms"]:
        options.append(f" --latency-ms {plan['latency_ms']:g}")
    after = network.get("strike_after_timers")
    if after is not None:
        options.append(f" --network-fault-after-timers {after:g}")
    return "".join(options) + f" --network-fault-ms {plan['window_ms']:g}"


def _pause_options(pauses: dict[str, Any] | None) -> str:
    if not pauses:
        return ""
    asked = len(pauses["delivered"]) + pauses["not_delivered"]
    return f" --pauses-then-stops {asked}"


def _after_option(run_dir: Path, upgrade: dict[str, Any] | None) -> str:
    if not upgrade:
        return ""
    return f" --after-run {run_dir.parent / upgrade['from']['directory']}"


def heartbeats_view(run_dir: Path) -> View:
    report = json.loads((run_dir / "heartbeats.json").read_text(encoding="utf-8"))
    parameters = report["parameters"]
    reasons = list(report["anomalies"])
    if report["error"]:
        reasons.insert(0, f"{report['error']['type']}: {report['error']['message']}")
    runs_again = sum(max(0, job["runs"] - 1) for job in report["jobs"].values())
    by_library = sum(job.get("ended_by_the_library", 0) for job in report["jobs"].values())
    verdict = Verdict(
        ok=report["ok"],
        title=f"heartbeats: {parameters['jobs']} jobs of {parameters['work_s']:g} s on"
        f" {parameters['workers']} live workers",
        system=system_label(report["system"]),
        durability=report["library_worker"],
        seed=None,
        duration=report["timings"]["run_s"],
        command=f"crashqueuelab heartbeats --system {report['spec']} --jobs {parameters['jobs']}"
        f" --workers {parameters['workers']} --work-timers {parameters['work_timers']:g}"
        f" --retry-timer-s {parameters['retry_after_s']:g}"
        f"{_network_options(report.get('network'))}{_pause_options(report.get('pauses'))}"
        f"{_after_option(run_dir, report.get('upgrade'))}"
        f" --output-directory {run_dir}",
        reasons=reasons,
    )
    figures = [
        (
            "executions",
            f"{len(report['executions'])} for {parameters['jobs']} jobs",
            "each job must run once: the lab killed or stopped no worker"
            + ("" if not report.get("network") else "; one held by a network fault may run again")
            + ("" if not report.get("pauses") else "; one a paused worker held may run again")
            + ("" if not by_library else "; one the library's own guard ended is retried"),
        ),
        (
            "ended by the library's own guard",
            str(by_library),
            "executions cut or killed by the library (its job timeout): each an attempt",
        ),
        ("handed out again", str(runs_again), "while every worker was alive"),
        (
            "retry timer",
            f"{parameters['retry_after_s']:g} s",
            "a job whose heartbeat is older is handed out again",
        ),
        ("each job works", f"{parameters['work_s']:g} s", f"{parameters['work_timers']:g} timers"),
        ("grace", f"{parameters['grace_s']:g} s", "polling on after the last job ended"),
    ]
    network = report.get("network")
    if network:
        plan = network["plan"]
        kinds = [entry["kind"] for entry in network["delivered"]]
        figures.append(
            (
                "network faults",
                ", ".join(kinds) or "none delivered",
                f"each {plan['window_ms'] / 1000:g} s; latency {plan['latency_ms']:g} ms;"
                f" not delivered (the work ended first): {len(network['not_delivered'])}",
            )
        )
    pauses = report.get("pauses")
    if pauses:
        figures.append(
            (
                "pauses, then stops",
                str(len(pauses["delivered"])),
                f"each worker frozen {pauses['window_s']:g} s, then SIGCONT and SIGTERM;"
                f" not delivered (the work ended first): {pauses['not_delivered']}",
            )
        )
    lanes, end = _lanes(report)
    lanes = _held_lanes(report) + _paused_lanes(report) + lanes
    ticks = [(at, f"{at:g} s") for at in range(0, int(end) + 1, max(1, int(end) // 8 or 1))]
    legend = [
        {"worker": worker, "color": _WORKER_COLOURS[i % len(_WORKER_COLOURS)]}
        for i, worker in enumerate(sorted({run["worker"] for run in report["executions"]}))
    ]
    data = {
        "promises": promises_of(report),
        "lanes": LaneChart(lanes, end, ticks),
        "legend": legend,
        "again": _RUN_AGAIN,
        "holding": _HOLDING if report.get("network") else {},
        "executions": report["executions"],
        "jobs": report["jobs"],
        "workers": report["workers"],
        "upgrade": report.get("upgrade"),
        "store_problems": report.get("store_problems") or [],
        "library_logs": report.get("library_logs") or {},
    }
    return View("heartbeats.html.j2", verdict, figures, data)
