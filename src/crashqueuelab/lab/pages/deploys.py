"""The page of a deploy run: the verdict, the command, the key figures, then one lane per
worker process across the deploys, each stop signal, grace window and SIGKILL marked, and
every job's executions drawn on the lane of the process that ran them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from crashqueuelab.lab.pages.charts import LaneChart
from crashqueuelab.lab.pages.common import Verdict, View, promises_of, system_label

_LIFE = "#e8eaed"
#: The part of a process's life before its library said it takes jobs (where it tells).
_STARTING = "#c6dafc"
_GRACE = "#fde293"
#: An execution by how it ended.
_HOW = {
    "ended": ("#188038", "ran to completion"),
    "killed": ("#d93025", "cut by the SIGKILL"),
    "abandoned": ("#9334e6", "left when its worker exited"),
    "cut": ("#202124", "cut by an exception"),
    "running": ("#1a73e8", "still running at the end"),
}
_STOP = "#e37400"
_KILL = "#202124"
_EXIT = "#5f6368"


def _execution_span(run: dict[str, Any], end: float, *, by_worker: bool) -> dict[str, Any]:
    """One execution on a lane, to ``end`` while it runs; on a job's own lane (``by_worker``)
    its title names the worker that ran it."""
    colour, said = _HOW.get(run["how"], _HOW["running"])
    finish = end if run["end_s"] is None else run["end_s"]
    when = f"{run['start_s']:.2f} s to {finish:.2f} s"
    title = (
        f"{run['key']}: ran {when} by {run['worker']}, {said}"
        if by_worker
        else f"{run['key']}: {when}, {said}"
    )
    return {"start": run["start_s"], "end": finish, "color": colour, "title": title}


def command_of(report: dict[str, Any], run_dir: Path) -> str:
    plan = report["plan"]
    words = [
        f"crashqueuelab deploys --system {report['spec']}",
        f"--workers {plan['workers']} --deploys {plan['deploys']} --grace-s {plan['grace_s']:g}",
        f"--surge {plan['surge']} --interval-s {plan['interval_s']:g}"
        f" --warmup-s {plan['warmup_s']:g}",
        f"--replace {plan['replace']} --fleet-restarts {plan['fleet_restarts']}",
        f"--signal {plan['signal']} --jobs {plan['jobs']} --long-share {plan['long_share']:g}",
        f"--seed {plan['seed']}",
    ]
    if plan.get("scheduled"):
        words.append(f"--scheduled {plan['scheduled']}")
    if plan.get("due_tolerance_s") is not None:
        words.append(f"--due-tolerance-s {plan['due_tolerance_s']:g}")
    if plan.get("submit_until_s") is not None:
        words.append(f"--submit-until-s {plan['submit_until_s']:g}")
    if plan.get("submit_at_stops"):
        words.append(f"--submit-at-stops {plan['submit_at_stops']}")
    if plan.get("stop_when", "due") != "due":
        words.append(f"--stop-when {plan['stop_when']}")
    if plan.get("failovers"):
        words.append(f"--failovers {plan['failovers']}")
        if plan.get("promote_after_s"):
            words.append(f"--promote-after-s {plan['promote_after_s']:g}")
    if plan.get("server_restarts"):
        words.append(f"--server-restarts {plan['server_restarts']}")
    if report.get("lease_s") is not None:
        words.append(f"--lease-s {report['lease_s']:g}")
    if report["recovery"]["basis"] == "given by the run":
        words.append(f"--recovery-wait-s {report['recovery']['wait_s']:g}")
    return " ".join([*words, f"--output-directory {run_dir}"])


def _lane(
    worker: dict[str, Any], runs: list[dict[str, Any]], end: float, *, tells_ready: bool
) -> dict[str, Any]:
    until = worker["exit_s"] if worker["exit_s"] is not None else end
    spans = [
        {
            "start": worker["started_s"],
            "end": until,
            "color": _LIFE,
            "title": f"{worker['name']} (pid {worker['pid']}): from {worker['started_s']:.2f} s"
            + ("" if worker["exit"] is None else f" to {until:.2f} s, {worker['exit']}"),
        }
    ]
    if tells_ready:
        ready = worker.get("ready_s")
        spans.append(
            {
                "start": worker["started_s"],
                "end": until if ready is None else min(ready, until),
                "color": _STARTING,
                "title": f"{worker['name']}: starting from {worker['started_s']:.2f} s, "
                + (
                    "never said it takes jobs"
                    if ready is None
                    else f"said it takes jobs at {ready:.2f} s"
                ),
            }
        )
    if worker["stop_s"] is not None:
        grace_end = min(worker["grace_end_s"], until)
        spans.append(
            {
                "start": worker["stop_s"],
                "end": grace_end,
                "color": _GRACE,
                "title": f"grace period from {worker['stop_s']:.2f} s to"
                f" {worker['grace_end_s']:.2f} s",
            }
        )
    for run in runs:
        spans.append(_execution_span(run, end, by_worker=False))
    dots = []
    for signal in worker["signals"]:
        kill = signal["signal"] == "SIGKILL"
        what = "SIGKILL of its session" if kill else signal["signal"]
        dots.append(
            {
                "at": signal["at_s"],
                "color": _KILL if kill else _STOP,
                "title": f"{what} at {signal['at_s']:.2f} s",
                "r": 5,
            }
        )
    if worker["exit_s"] is not None and worker["killed_s"] is None:
        dots.append(
            {
                "at": worker["exit_s"],
                "color": _EXIT,
                "title": f"exited at {worker['exit_s']:.2f} s ({worker['exit']})",
                "r": 3,
            }
        )
    return {"label": worker["name"], "spans": spans, "dots": dots, "spans_are": "bars"}


_DUE = "#1a73e8"
_TOLERANCE = "#d2e3fc"


def _scheduled_lanes(
    scheduled: dict[str, Any], executions: list[dict[str, Any]], end: float
) -> list[dict[str, Any]]:
    """One lane per scheduled job: its due time (a blue dot), the window it may start in
    (due to due + tolerance, pale blue), and each of its executions, coloured by how it
    ended; its label names its verdict."""
    tolerance = scheduled["tolerance_s"]
    lanes = []
    for key, job in scheduled["jobs"].items():
        spans = [
            {
                "start": job["due_s"],
                "end": min(job["due_s"] + tolerance, max(end, job["due_s"])),
                "color": _TOLERANCE,
                "title": f"{key}: may start from {job['due_s']:.2f} s to"
                f" {job['due_s'] + tolerance:.2f} s",
            }
        ]
        for run in (r for r in executions if r["key"] == key):
            spans.append(_execution_span(run, end, by_worker=True))
        dots = [
            {
                "at": job["due_s"],
                "color": _DUE,
                "title": f"{key} due at {job['due_s']:.2f} s ({job['window']}), submitted at"
                f" {job['submit_s']:.2f} s",
                "r": 5,
            }
        ]
        label = f"{key}: {job['verdict']}"
        lanes.append({"label": label, "spans": spans, "dots": dots, "spans_are": "bars"})
    return lanes


def _start_up(workers: list[dict[str, Any]]) -> tuple[str, str, str]:
    """How long the workers took from their process's start to their library's word that
    they take jobs, the figure a stop waits for."""
    took = sorted(w["ready_s"] - w["started_s"] for w in workers if w.get("ready_s") is not None)
    return (
        "start-up",
        f"{took[0]:.2f} to {took[-1]:.2f} s" if took else "no worker said it takes jobs",
        f"from a process's start to its library's word that it takes jobs: {len(took)} of"
        f" {len(workers)} workers said it; a stop waits for it",
    )


def deploys_view(run_dir: Path) -> View:
    report = json.loads((run_dir / "deploys.json").read_text(encoding="utf-8"))
    plan = report["plan"]
    reasons = list(report["anomalies"])
    if report["error"]:
        reasons.insert(0, f"{report['error']['type']}: {report['error']['message']}")
    workers = sorted(report["workers"], key=lambda w: (w["slot"], w["generation"]))
    end = max(report["timings"]["run_s"], 0.001)
    # Records made before libraries could tell it have no such fact.
    tells_ready = bool(report["worker"].get("tells_ready"))
    lanes = [
        _lane(
            worker,
            [r for r in report["executions"] if r["worker"] == worker["name"]],
            end,
            tells_ready=tells_ready,
        )
        for worker in workers
    ]
    step = max(1, int(end) // 10 or 1)
    ticks = [(float(at), f"{at:g} s") for at in range(0, int(end) + 1, step)]
    jobs = report["jobs"]
    stopped = [w for w in workers if w["stopped_by"] == "deploy"]
    killed = [w for w in stopped if w["killed_s"] is not None]
    kinds = [finding["kind"] for finding in report["findings"]]
    # A record made before the fact existed says every such job lost.
    waiting = sum(
        1
        for finding in report["findings"]
        if finding["kind"] == "lost_in_deploy" and finding["facts"].get("waiting")
    )
    recovery = report["recovery"]
    # A run recorded before scheduled jobs existed has none.
    scheduled = report.get("scheduled")
    figures = [
        ("jobs lost", str(kinds.count("lost_in_deploy") - waiting), f"of {len(jobs)}"),
        (
            "not done, still waiting",
            str(waiting),
            "held waiting to be claimed in the store after the recovery wait",
        ),
        (
            "ran twice",
            str(len({f["job"] for f in report["findings"] if f["kind"] == "ran_twice"})),
            "run again after an execution that ran to completion",
        ),
        (
            "redelivered",
            str(sum(job["redelivered"] for job in jobs.values())),
            "run again after an execution a SIGKILL cut (at least once)",
        ),
        (
            "stopped workers",
            f"{len(stopped) - len(killed)} of {len(stopped)} exited within the grace",
            f"{len(killed)} SIGKILLed at its end, holding"
            f" {sum(len(w['held_when_killed']) for w in killed)} job(s)",
        ),
        (
            "rollout",
            f"{plan['deploys']} rolling, {plan['fleet_restarts']} fleet",
            f"{plan['workers']} workers, surge {plan['surge']}, every {plan['interval_s']:g} s,"
            f" replacement {plan['replace']}"
            + (
                ", each stop once its worker held a job outlasting the grace (mid-job)"
                if plan.get("stop_when") == "mid-job"
                else ""
            ),
        ),
        ("stop signal", plan["signal"], f"grace {plan['grace_s']:g} s, then SIGKILL"),
        (
            "jobs",
            f"{len(jobs)}, {sum(1 for job in jobs.values() if job['long'])} longer than the grace",
            "submitted throughout the run through the system's own client",
        ),
        ("recovery bound", f"{recovery['wait_s']:g} s", recovery["basis"]),
    ]
    if tells_ready:
        figures.append(_start_up(workers))
    restarted = report.get("server_restarts")
    if restarted:
        downs = [r["down_s"] for r in restarted["restarts"] if r["down_s"] is not None]
        figures.append(
            (
                f"crashes of {restarted['server']}",
                f"{len(restarted['restarts'])}, down up to {max(downs, default=0.0):g} s",
                "every process SIGKILLed, started again on what it kept, at "
                + ", ".join(f"{r['at_s']:g} s" for r in restarted["restarts"])
                + f"; {len(report['restarted_after_exit'])} worker exit(s) before any signal,"
                " each followed by a restart",
            )
        )
    failing_over = report.get("failovers")
    if failing_over:
        worst = [f["wait_s"]["max"] for f in failing_over["failovers"] if f["wait_s"]]
        before = failing_over["before_the_first"]["wait_s"]
        figures.append(
            (
                "failovers",
                f"{len(failing_over['failovers'])}, then a job waited up to"
                f" {max(worst, default=0.0):g} s",
                f"before the first: up to {0.0 if before is None else before['max']:g} s;"
                f" {len(report['restarted_after_exit'])} worker(s) exited by themselves and"
                " were started again",
            )
        )
    if scheduled and scheduled["jobs"]:
        figures.append(
            (
                "scheduled jobs",
                f"{scheduled['on_time']} of {len(scheduled['jobs'])} once, on time",
                f"tolerance {scheduled['tolerance_s']:g} s: {scheduled['tolerance_basis']}",
            )
        )
    verdict = Verdict(
        ok=report["ok"],
        title=f"deploys: {plan['workers']} workers, {len(report['steps'])} stops,"
        f" {plan['signal']} then SIGKILL after {plan['grace_s']:g} s"
        + (f", {plan['failovers']} failovers" if plan.get("failovers") else ""),
        system=system_label(report["system"]),
        durability=report["worker"]["describe"],
        seed=plan["seed"],
        duration=report["timings"]["run_s"],
        command=command_of(report, run_dir),
        reasons=reasons,
    )
    data = {
        "promises": promises_of(report),
        "headline": report["headline"],
        "lanes": LaneChart(lanes, end, ticks),
        "how": {said: colour for colour, said in _HOW.values()},
        "marks": {"stop signal": _STOP, "SIGKILL": _KILL, "exit": _EXIT},
        "grace": _GRACE,
        "life": _LIFE,
        "starting": _STARTING if tells_ready else None,
        "worker": report["worker"],
        "workers": workers,
        "held": report["held_when_killed"],
        "jobs": jobs,
        "checks": report["checks"],
        # Records before the store's facts were kept have none.
        "store": {"facts": {}, **report["store"]},
        "scheduled": scheduled,
        "scheduled_lanes": None
        if not scheduled or not scheduled["jobs"]
        else LaneChart(_scheduled_lanes(scheduled, report["executions"], end), end, ticks),
        "due": _DUE,
        "tolerance": _TOLERANCE,
        "failovers": report.get("failovers"),
        "promote_after_s": plan.get("promote_after_s", 0.0),
        "restarted": report.get("restarted_after_exit", []),
    }
    return View("deploys.html.j2", verdict, figures, data)
