"""The page of a disk-fault run: the matrix of faults x steps, then each case: what the
caller was told, what the disk held after the cut, what the restarted client found, and the
findings, the fault's before the system's own."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from crashqueuelab.lab.pages.common import Verdict, View, promises_of, read_json, system_label
from crashqueuelab.lab.runs.commands import runnable
from crashqueuelab.lab.runs.kinds import DISK_FAULTS

#: A case's verdicts, in the order the page lists them, and the class each is shown with.
_VERDICT_CLASS = {
    "failed": "bad",
    "fails-without-the-fault": "bad",
    "not-exercised": "",
    "passed": "good",
}


def _told(told: dict[str, Any] | None) -> str:
    """What a caller was told, as one line: the error it got, or the value it returned."""
    if told is None:
        return "no call: an earlier answer left nothing to do"
    if "error" in told:
        return f"error: {told['error']}"
    value = told.get("value")
    if isinstance(value, dict) and "claim" in value:
        return f"claimed {value['claim']} (attempt {value['attempt']})"
    return "returned nothing" if value is None else f"returned {value}"


def _held(reading: dict[str, Any], key: str) -> str:
    job = reading["jobs"].get(key)
    if job is None:
        return "absent" if reading["exists"] else "no store"
    return f"{job['status']} after {job['attempts']} attempts"


def _readings(case: dict[str, Any], jobs: list[str]) -> list[dict[str, Any]]:
    """The store as each reading of the case found it: the crash state right after the
    faulted call, the recovered disk before its cut (the page cache), and after it."""
    rows = []
    for name, reading, note in (
        ("cut at once", case["cut_at_once"]["after_cut"], "the power cut right after the call"),
        (
            "recovered, before the cut",
            case["recovered"]["live"],
            "what the restarted client left, as the page cache shows it",
        ),
        (
            "recovered, after the cut",
            case["recovered"]["after_cut"],
            "the same disk after the power cut: what a failed fsync dropped is gone",
        ),
    ):
        rows.append(
            {
                "name": name,
                "note": note,
                "jobs": [_held(reading, key) for key in jobs],
                "ok": reading["ok"],
                "problems": reading["problems"],
            }
        )
    return rows


def _reopen(reopen: dict[str, Any], closed: str | None) -> str:
    parts = []
    if closed:
        parts.append(f"the close after the fault raised {closed}")
    if "server" in reopen:
        parts.append(f"server {reopen['server']}")
    if reopen.get("opened"):
        parts.append("the store opened again")
    else:
        parts.append(f"the store refused to open: {reopen.get('refused', 'no answer')}")
    return "; ".join(parts)


def _case(case: dict[str, Any], jobs: list[str]) -> dict[str, Any]:
    calls = case["recovered"]["calls"]
    faulted_at = next((i for i, call in enumerate(calls) if call["faulted"]), len(calls) - 1)
    fault = case["fault"]
    return {
        "id": f"{case['disk_fault']}-{case['step']}",
        "fault": case["disk_fault"],
        "step": case["step"],
        "verdict": case["verdict"],
        "verdict_class": _VERDICT_CLASS.get(case["verdict"], ""),
        "open": case["verdict"] != "passed",
        "told": _told(case["told"]),
        "told_error": bool(case["told"] and "error" in case["told"]),
        "fault_text": f"{fault['operation']} answers {fault['error']} on {fault['path']}"
        + (
            ", every matching operation until the call returns"
            if fault["count"] is None
            else f", the first {fault['count']} matching operation(s) of the call"
        ),
        "errors_answered": case["errors_answered"],
        "dropped": case["recovered"]["writes_dropped_by_failed_fsync"],
        "dropped_at_once": case["cut_at_once"]["writes_dropped_by_failed_fsync"],
        "reopen": _reopen(case["reopen"], case["recovered"].get("close_after_fault")),
        "readings": _readings(case, jobs),
        "before": [{"step": call["step"], "told": _told(call)} for call in calls[:faulted_at]],
        "restarted": [
            {"step": call["step"], "told": _told(call), "error": "error" in call}
            for call in calls[faulted_at + 1 :]
        ],
        "promised": case["recovered"].get("promised", {}),
        "anomalies": case["anomalies"],
        "own": case["found_without_the_fault"],
        "artifacts": case["artifacts"],
    }


def _command(record: dict[str, Any], run_dir: Path) -> str:
    parameters = record["parameters"]
    faults = "".join(f" --disk-fault {name}" for name in record["disk_faults"])
    options = "" if parameters["count"] is None else f" --count {parameters['count']}"
    if parameters["path"] != "*":
        options += f" --path {shlex.quote(parameters['path'])}"
    return runnable(
        f"crashqueuelab disk-faults --system {shlex.quote(record['system_spec'])}{faults}"
        f"{options} --seed {record['seed']}"
        f" --output-directory {shlex.quote(str(run_dir))}",
        record,
    )


def disk_faults_view(run_dir: Path) -> View:
    record = read_json(run_dir / DISK_FAULTS.record)
    summary = record["summary"]
    steps = record["parameters"]["steps"]
    verdict = Verdict(
        ok=record["ok"],
        title=f"disk faults: {len(record['disk_faults'])} faults x {len(steps)} steps",
        system=system_label(record["system"]),
        durability=str(record["system"]["durability"]),
        seed=record["seed"],
        duration=record["wall_s"],
        command=_command(record, run_dir),
        reasons=record["reasons"],
    )
    figures = [
        (
            "cases passed",
            f"{summary['passed']} of {summary['cases']}",
            "a case is one step made under one fault, cut at once and cut after recovery",
        ),
        ("failed", str(summary["failed"]), "findings the fault caused: a broken promise"),
        (
            "fail without the fault too",
            str(summary["fails_without_the_fault"]),
            "a healthy disk gives the same findings: the system's own weakness",
        ),
        (
            "not exercised",
            str(summary["not_exercised"]),
            "the step never reached an operation the fault covers: never counted as passed",
        ),
        (
            "callers told",
            f"{summary['told_failure']} failure, {summary['told_success']} success",
            "what the faulted call answered",
        ),
        ("refused to open", str(summary["refused_to_open"]), "after the disk recovered"),
        (
            "reader",
            record["reader"] or "the system's own client (not independent)",
            "how each crash state was read",
        ),
    ]
    jobs = sorted(
        {key for case in record["cases"] for key in case["recovered"]["live"]["jobs"]}
        | {key for case in record["cases"] for key in case["recovered"].get("promised", {})}
    )
    cases = [_case(case, jobs) for case in record["cases"]]
    by_cell = {(case["fault"], case["step"]): case for case in cases}
    matrix = [
        {"step": step, "cells": [by_cell.get((fault, step)) for fault in record["disk_faults"]]}
        for step in steps
    ]
    data = {
        "promises": promises_of(record),
        "headline": record["headline"],
        "faults": record["disk_faults"],
        "matrix": matrix,
        "jobs": jobs,
        "cases": cases,
        "anomalies": record["anomalies"],
        "own": record["found_without_the_fault"],
    }
    return View("diskfaults.html.j2", verdict, figures, data)
