"""What each kind of report shows, computed from a run directory's retained files alone."""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crashqueuelab.lab.chaos.worklog import read_logs
from crashqueuelab.lab.mutants.catalog import MUTANTS
from crashqueuelab.lab.mutants.runner import score
from crashqueuelab.lab.pages.chains import observation_chain
from crashqueuelab.lab.pages.charts import (
    Chart,
    Mark,
    Rule,
    Series,
    Window,
    nice_ticks,
    number_text,
    rate_over_time,
)
from crashqueuelab.lab.pages.network import (
    NETWORK_COLORS,
    WINDOW_LEGENDS,
    WINDOWED,
    legend,
    network_rows,
    network_title,
)
from crashqueuelab.lab.runs.commands import campaign_command, runnable

#: Twelve colors, so a bench with ten lanes (ours, the textbook queue, six peers) repeats none.
PALETTE = (
    "#1a73e8",
    "#188038",
    "#9334e6",
    "#e37400",
    "#d01884",
    "#007b83",
    "#5f6368",
    "#795548",
    "#12b5cb",
    "#f9ab00",
    "#3949ab",
    "#7cb342",
)
#: Faults shaded for as long as they held (the others are lines at their instant).
SHADED = ("SIGSTOP", *WINDOWED)
KILL, PAUSE, POWER_CUT = "#d93025", "#f29900", "#5f2eea"
SERVER_RESTART, SESSION_KILL = "#202124", "#00897b"
FAULT_COLORS = {
    "SIGKILL": KILL,
    "SIGSTOP": PAUSE,
    "power cut": POWER_CUT,
    "server restart": SERVER_RESTART,
    "session terminated": SESSION_KILL,
    **NETWORK_COLORS,
}


def _fault_title(fault: dict[str, Any], digits: int = 2) -> str:
    if fault["kind"] == "power cut":
        fate = fault["fate"]
        return (
            f"power cut at {fault['at_s']:.{digits}f} s: every process died; of"
            f" {fault['pending_writes']} unsynced writes and"
            f" {fault['pending_directory_changes']} unsynced directory changes the disk kept"
            f" {fate.get('kept', 0)} and tore {fate.get('torn', 0)} (crash state"
            f" {fault['crash_state']})"
        )
    if fault["kind"] == "server restart":
        return (
            f"server crashed (pg_ctl stop -m immediate) at {fault['at_s']:.{digits}f} s,"
            f" accepting connections again {fault['back_after_s']:.{digits}f} s later"
        )
    if fault["kind"] in NETWORK_COLORS:
        return network_title(fault, digits)
    return f"{fault['kind']} {fault['worker_id']} at {fault['at_s']:.{digits}f} s"


@dataclass
class Verdict:
    ok: bool
    title: str
    system: str
    durability: str
    seed: int | None
    duration: float | None
    command: str
    reasons: list[str] = field(default_factory=list)
    #: Evidence that did not run, and why: shown beside the verdict, never as passed.
    not_run: list[str] = field(default_factory=list)
    interrupted: bool = False
    #: What the page says above ``command``.
    command_label: str = "Reproduce this run:"

    @property
    def word(self) -> str:
        if self.interrupted:
            return "INTERRUPTED"
        if not self.ok:
            return "FAILED"
        return "Passed what ran" if self.not_run else "Passed"


@dataclass
class View:
    template: str
    verdict: Verdict
    figures: list[tuple[str, str, str]]
    data: dict[str, Any]


def _read(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _yes(flag: bool) -> str:
    return "yes" if flag else "NO"


def _timeline(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A store's history as rows relative to its first entry (SQLite events, walqueue frames)."""
    rows = []
    for entry in history:
        at = entry.get("at_us", entry.get("now"))
        what = entry.get("event_type", entry.get("type", "?"))
        job = (
            entry.get("job_id")
            or entry.get("task_id")
            or ",".join(
                str(item.get("task_id", item)) if isinstance(item, dict) else str(item)
                for item in entry.get("task_ids", entry.get("tasks", []))
            )
        )
        shown = ("at_us", "now", "event_type", "type", "job_id", "task_id", "task_ids", "tasks")
        detail = ", ".join(
            f"{key}={value}"
            for key, value in entry.items()
            if key not in shown and value is not None
        )
        rows.append(
            {
                "at": at if isinstance(at, int) else None,
                "what": what,
                "job": job,
                "detail": detail[:200],
            }
        )
    known = [row["at"] for row in rows if row["at"] is not None]
    start = min(known) if known else 0
    for row in rows:
        row["at"] = 0.0 if row["at"] is None else (row["at"] - start) / 1e6
    return rows


def _signature_text(signature: dict[str, Any]) -> str:
    return (
        f"effect {_job_state(signature['effect_job'])} · flaky {_job_state(signature['flaky_job'])}"
        f" · effects {signature['effect_job_effects']}"
    )


def _job_state(state: list[Any] | None) -> str:
    return "absent" if state is None else f"{state[0]}/{state[1]}"


def _states(states: dict[str, str] | None) -> str:
    return "none" if states is None else ", ".join(f"{role} {s}" for role, s in states.items())


def _closing_figures(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """A campaign's last rows, in either crash mode: the probes, the model workload, the system."""
    summary, system, model = report["summary"], report["system"], report.get("model")
    skipped = [
        f"{probe['name']} ({probe['detail']})"
        for probe in report.get("probes", [])
        if not probe["ran"]
    ]
    probes = (
        "fencing probes",
        f"{summary['probes_passed']} passed, {summary['probes_failed']} failed,"
        f" {summary['probes_skipped']} not run",
        f"not run, the system lacks what they need: {'; '.join(skipped)}"
        if skipped
        else "every probe ran",
    )
    workload = (
        ("model-driven workload", "not run", "a report from before it existed")
        if model is None
        else ("model-driven workload", "not run", model.get("detail", ""))
        if model.get("ran") is False
        else (
            "model-driven workload",
            f"{model['observations']} observations, {len(model['anomalies'])} anomalies",
            "single, batched, chained and carried calls, heartbeats, restarts, deadlines hit"
            " exactly; what each caller was told and what the system reports about itself,"
            " judged against the lease rules and the store (model/)",
        )
    )
    return [probes, workload, ("system", system["version"], system["durability"])]


#: A verdict lists this many reasons; the rest are one line away, in the tables below.
SHOWN_REASONS = 12


def _first(reasons: list[str]) -> list[str]:
    more = len(reasons) - SHOWN_REASONS
    return reasons[:SHOWN_REASONS] + ([f"... and {more} more below"] if more > 0 else [])


def _state_texts(state: dict[str, Any]) -> dict[str, str]:
    if state["crash_state"] is None:  # a state nothing could read (a server refused it)
        return {"found_text": "unreadable", "final_text": "not recovered"}
    return {
        "found_text": _signature_text(state["crash_state"]["signature"]),
        "final_text": _states(state["recovery"]["final_states"]),
    }


#: Where a page's rerun commands put their runs, inside the run directory.
RERUNS_DIRECTORY = "reruns"


def _case_rerun(report: dict[str, Any], run_dir: Path, case: dict[str, Any]) -> str | None:
    """The one-line command that runs a failing case's crash point alone."""
    if case["passed"]:
        return None
    target = run_dir / RERUNS_DIRECTORY / case["case_id"]
    return campaign_command(report, str(target), crash_point=case["fault_point"])


def _probes_with_reruns(report: dict[str, Any], run_dir: Path) -> list[dict[str, Any]]:
    """The probes, each failing one with the command that runs it alone."""
    return [
        probe
        | {
            "rerun": None
            if probe["ok"]
            else campaign_command(
                report, str(run_dir / RERUNS_DIRECTORY / probe["name"]), probe=probe["name"]
            )
        }
        for probe in report["probes"]
    ]


def _reproducers(run_dir: Path, report: dict[str, Any]) -> list[dict[str, Any]]:
    """The shrunk reproducers of a not-ok campaign, each model one with its chain of events
    read from its first rerun's retained log."""
    shown = []
    for record in (report.get("shrink") or {}).get("reproducers", []):
        chain: list[dict[str, Any]] = []
        if record.get("chain"):
            rerun = (run_dir / record["chain"]).parent
            model = _read(rerun / "model.json") if (rerun / "model.json").is_file() else {}
            chain = observation_chain(run_dir / record["chain"], model.get("store"))
            for row in chain:
                row["involved"] = bool(row["key"]) and row["key"] in record["anomaly"]
        shown.append(record | {"chain_rows": chain})
    return shown


def system_label(system: dict[str, Any]) -> str:
    """The system as the page names it: a released library by its release."""
    return str(system["version"]) if system.get("documented") else str(system["name"])


def promises_of(report: dict[str, Any]) -> dict[str, Any] | None:
    """The page's account of a library's own promises: every weakness it declares, with
    the failures each explains in this run; None for a system that declares none."""
    promises = report.get("promises")
    if not promises or not promises["declared"]:
        return None
    seen = {entry["what"]: entry for entry in promises["weaker_as_documented"]}
    rows = [
        seen.get(declared["what"], declared | {"lines": 0, "first": None})
        for declared in promises["declared"]
    ]
    text = promises["verdict"]
    if not promises["keeps_its_promises"]:
        text = f"{text}. Shown first below: the failures no documented weakness explains."
    shown: dict[str, Any] = promises | {"rows": rows, "verdict_text": text}
    return shown


def power_loss_view(run_dir: Path, report: dict[str, Any]) -> View:
    """A power-loss campaign: each crash point's cut and every crash state it allowed."""
    system, summary = report["system"], report["summary"]
    cases = []
    for case in report["cases"]:
        states = [state | _state_texts(state) for state in case["crash_states"]]
        cases.append(
            case
            | {
                "crash_states": states,
                "rerun": _case_rerun(report, run_dir, case),
                "lost_in": sum(1 for state in states if not state["durable_as_promised"]),
                "promised_text": " or ".join(_signature_text(p) for p in case["promised"]),
            }
        )
    verdict = Verdict(
        ok=report["ok"],
        title=f"power-loss campaign, {summary['named_fault_points']} crash points,"
        f" {summary['crash_states']} crash states",
        system=system_label(system),
        durability=system["durability"],
        seed=report["seed"],
        duration=report["timings"]["total_ms"] / 1000,
        command=campaign_command(report, str(run_dir)),
        reasons=_first(report.get("anomalies", [])),
    )
    figures = [
        (
            "crash points passed",
            f"{summary['passed']} of {summary['named_fault_points']}",
            "a real child died there (exit 86), then the power was cut",
        ),
        (
            "crash states passed",
            f"{summary['crash_states_passed']} of {summary['crash_states']}",
            "each read, compared with the point's promise, recovered and read again",
        ),
        (
            "crash states that lost acknowledged work",
            str(summary["states_losing_acknowledged_work"]),
            "must be 0",
        ),
        (
            "unsynced at the cuts",
            f"{summary['pending_writes_at_cuts']:,} writes,"
            f" {summary['pending_directory_changes_at_cuts']} directory changes",
            "what the disk could lose (each case's disk/unsynced.json)",
        ),
        *_closing_figures(report),
    ]
    probes = _probes_with_reruns(report, run_dir)
    data = {
        "cases": cases,
        "probes": probes,
        "reproducers": _reproducers(run_dir, report),
        "promises": promises_of(report),
    }
    return View("powerloss.html.j2", verdict, figures, data)


def _mutants_command(report: dict[str, Any], run_dir: Path) -> str:
    """The command that runs these mutants again: the same ones, evidence and sizes."""
    parameters = report["parameters"]
    ran = [m["mutant"] for m in report["mutants"]]
    named = "".join(f" --mutant {name}" for name in ran) if len(ran) < len(MUTANTS) else ""
    sizes = "".join(
        f" --{option} {parameters[key]}"
        for option, key in (
            ("jobs", "chaos_jobs"), ("kills", "chaos_kills"), ("pauses", "chaos_pauses"),
            ("power-cuts", "chaos_power_cuts"), ("shrink-seconds", "shrink_seconds"),
        )
        if key in parameters
    )  # fmt: skip
    evidence = " --named-evidence" if report.get("evidence") == "named" else ""
    return (
        f"crashqueuelab mutants --seed {report['seed']} --seeds {len(report['seeds'])}"
        f"{evidence}{named}{sizes} --output-directory {shlex.quote(str(run_dir))}"
    )


def mutants_view(run_dir: Path) -> View:
    report = _read(run_dir / "mutants.json")
    parameters = report["parameters"]
    evidence = (
        "the crash campaign, the power-loss campaign, the fencing probes, and a chaos run"
        f" ({parameters['chaos_jobs']} jobs, {parameters['chaos_kills']} kills,"
        f" {parameters['chaos_pauses']} pauses, {parameters.get('chaos_power_cuts', 0)} power cuts)"
    )
    not_run = [f"mutant {m['mutant']}: {m['reason']}" for m in report.get("not_run", [])]
    verdict = Verdict(
        ok=report["ok"],
        title=f"mutants: {score(report)}",
        system=", ".join(sorted({m["system"] for m in report["mutants"]})),
        durability="",
        seed=report["seed"],
        duration=report["timings"]["total_s"],
        command=_mutants_command(report, run_dir),
        reasons=report["reasons"],
        not_run=not_run,
    )
    figures = [
        ("mutants caught", score(report), "under every seed; a mutant not run is not caught"),
        ("seeds", ", ".join(map(str, report["seeds"])), "a catch must hold for each"),
    ]
    data = {
        "mutants": report["mutants"],
        "not_run": report.get("not_run", []),
        "seeds": report["seeds"],
        "evidence": evidence,
    }
    return View("mutants.html.j2", verdict, figures, data)


def campaign_view(run_dir: Path) -> View:
    report = _read(run_dir / "campaign.json")
    if report.get("crash_mode") == "power-loss":
        return power_loss_view(run_dir, report)
    system, summary = report["system"], report["summary"]
    cases = []
    for case in report["cases"]:
        case_dir = run_dir / case["artifacts"]["case_directory"]
        history_file = case_dir / "history.json"
        history = _read(history_file) if history_file.is_file() else []
        ledger = case["recovery"]["ledger"]
        cases.append(
            case
            | {
                "anchor": case["case_id"],
                "rerun": _case_rerun(report, run_dir, case),
                "executions": ledger["effects"] + ledger["absorbed"],
                "durable_effects": ledger["effects"],
                "timeline": _timeline(history),
                "found": _signature_text(case["crash_state"]["signature"]),
                "expected": _signature_text(case["expected_crash_signature"]),
                "final": _states(case["recovered_terminal_state"]),
            }
        )
    verdict = Verdict(
        ok=report["ok"],
        title=f"process-fault campaign, {summary['named_fault_points']} crash points",
        system=system_label(system),
        durability=system["durability"],
        seed=report["seed"],
        duration=report["timings"]["total_ms"] / 1000,
        command=campaign_command(report, str(run_dir)),
        reasons=report.get("anomalies", []),
    )
    figures = [
        (
            "crash points passed",
            f"{summary['passed']} of {summary['named_fault_points']}",
            "a real child died there (exit 86, its last words), left the declared state,"
            " and recovered",
        ),
        (
            "exit codes",
            ", ".join(map(str, summary["exit_codes"])),
            "86 is the crash hook's os._exit",
        ),
        ("crash states as declared", _yes(summary["crash_states_all_match"]), ""),
        (
            "store consistent at the crash",
            _yes(summary["crash_time_judgement_all_ok"]),
            "the system's independent reader on the crash-time copy",
        ),
        ("recovery finished every job, effects once", _yes(summary["recovery_all_succeeded"]), ""),
        *_closing_figures(report),
    ]
    probes = _probes_with_reruns(report, run_dir)
    data = {
        "cases": cases,
        "probes": probes,
        "reproducers": _reproducers(run_dir, report),
        "promises": promises_of(report),
    }
    return View("campaign.html.j2", verdict, figures, data)


def _chaos_command(report: dict[str, Any], run_dir: Path) -> str:
    """The command that delivers this run's schedule again: from its recorded schedule, or
    (a run from before schedules were recorded) from the same seed and sizes."""
    if report.get("schedule") is not None:
        again = shlex.quote(f"{run_dir}-again")
        return runnable(
            f"crashqueuelab chaos --replay {shlex.quote(str(run_dir))} --output-directory {again}",
            report,
        )
    parameters = report["parameters"]
    cuts = report.get("power_cuts_delivered", 0)
    restarts = report.get("server_restarts_delivered", 0)
    session_kills = report.get("session_kills_delivered", 0)
    return (
        runnable("crashqueuelab chaos", report)
        + f" --system {report.get('system_spec', report['system']['name'])}"
        f" --seed {report['seed']} --jobs {parameters['jobs']} --workers {parameters['workers']}"
        f" --kills {parameters['kills']} --pauses {parameters['pauses']}"
        + (f" --crash-mode power-loss --power-cuts {cuts}" if cuts else "")
        + (f" --server-restarts {restarts}" if restarts else "")
        + (f" --session-kills {session_kills}" if session_kills else "")
        + f" --lease-ms {parameters['lease_ms']} --batch {parameters['batch']}"
        + (f" --poison-jobs {parameters['poison_jobs']}" if "poison_jobs" in parameters else "")
        + (f" --long-jobs {parameters['long_jobs']}" if "long_jobs" in parameters else "")
        + f" --output-directory {run_dir}"
    )


def chaos_view(run_dir: Path) -> View:
    report = _read(run_dir / "chaos.json")
    accounting, parameters = report["accounting"], report["parameters"]
    elapsed = report["timings"]["elapsed_s"]
    start = report.get("started_monotonic_s")
    logs = read_logs(run_dir / "worker-logs")
    acks = [at - start for log in logs.values() for at in log.ack_times] if start else []
    faults = [f for f in report["faults"] if "at_s" in f]
    kills = [f for f in faults if f["kind"] == "SIGKILL"]
    dense = len(kills) > DENSE_MARKS
    # Pauses are shaded for as long as they held; the rare faults (cuts, restarts, ended
    # sessions) are lines drawn over everything; kills are lines too unless there are so many
    # that they would wall the chart, and then their density has a chart of its own.
    windows = [
        Window(
            f["at_s"],
            f.get("continued_at_s", f.get("until_s", elapsed)),
            _fault_title(f),
            FAULT_COLORS[f["kind"]],
            *([WINDOW_LEGENDS[f["kind"]]] if f["kind"] in WINDOW_LEGENDS else []),
        )
        for f in faults
        if f["kind"] in SHADED
    ]
    wide = {"power cut", "server restart"}
    marks = sorted(
        (
            Mark(f["at_s"], _fault_title(f), FAULT_COLORS[f["kind"]], f["kind"] in wide)
            for f in faults
            if f["kind"] not in SHADED and not (dense and f["kind"] == "SIGKILL")
        ),
        key=lambda mark: mark.color != KILL,
    )
    cuts = report.get("power_cuts_delivered", 0)
    restarts = report.get("server_restarts_delivered", 0)
    session_kills = report.get("session_kills_delivered", 0)
    throughput = Chart(
        "Acknowledgements per second"
        + (", with every kill (red line)" if kills and not dense else "")
        + (", pauses shaded (orange)" if report["pauses_delivered"] else "")
        + (", power cuts (violet)" if cuts else "")
        + (", server restarts (black)" if restarts else "")
        + (", terminated sessions (teal)" if session_kills else "")
        + legend(report),
        "seconds into the run",
        "jobs/s",
        [Series("acknowledged jobs/s", rate_over_time(acks, end=elapsed), PALETTE[0])],
        marks=marks,
        windows=windows,
        x_end=elapsed,
    )
    density = (
        Chart(
            f"Kills per second ({len(kills):,} in all)"
            + (", the same windows shaded" if windows else ""),
            "seconds into the run",
            "kills/s",
            [Series("SIGKILLs/s", rate_over_time([f["at_s"] for f in kills], end=elapsed), KILL)],
            windows=windows,
            x_end=elapsed,
        )
        if dense
        else None
    )
    lanes = _chaos_lanes(report, logs, start, elapsed)
    verdict = Verdict(
        ok=report["ok"],
        title=f"chaos: {parameters['jobs']:,} jobs, {report['kills_delivered']:,} kills,"
        f" {report['pauses_delivered']} pauses,"
        + (f" {cuts} power cuts," if cuts else "")
        + (f" {restarts} server restarts," if restarts else "")
        + (f" {session_kills} sessions terminated," if session_kills else "")
        + "".join(
            f" {count} {kind}{'' if kind.endswith('s') else 's'},"
            for kind, count in (report.get("network_faults_delivered") or {}).items()
            if count
        )
        + f" {parameters['workers']} workers",
        system=system_label(report["system"]),
        durability=report["system"]["durability"],
        seed=report["seed"],
        duration=elapsed,
        command_label="Run the same schedule again (same seed and faults; the interleaving"
        " of the processes may differ):",
        command=_chaos_command(report, run_dir),
        reasons=report.get("reasons", []),
    )
    figures = [
        (
            "jobs submitted / succeeded",
            f"{accounting['submitted']:,} / {accounting['succeeded']:,}",
            "",
        ),
        (
            "lost, dead, unexpected",
            f"{accounting['lost']}, {accounting['dead']}, {accounting['unexpected']}",
            "must be 0",
        ),
        (
            "duplicated effects (idempotent ledger)",
            str(accounting["duplicated_effects"]),
            "must be 0",
        ),
        (
            "executions (non-idempotent ledger)",
            f"{accounting['executions']:,}",
            f"{accounting['redelivered_executions']:,} ran again: at-least-once",
        ),
        ("repeats absorbed by the idempotent ledger", f"{accounting['absorbed_duplicates']:,}", ""),
        ("acknowledgements refused (fencing)", f"{accounting['stale_operations_rejected']:,}", ""),
        *_unknown_rows(accounting),
        *network_rows(report),
        *_shared_commit_rows(accounting.get("shared_commits")),
        ("jobs acknowledged twice", str(accounting["acknowledged_twice"]), "must be 0"),
        (
            "two live leases on one job",
            str(accounting.get("overlapping_leases", "not checked")),
            "must be 0: proven from the workers' logs (a claim returned, the lease neither"
            " being acknowledged nor past its earliest deadline), whatever the system's reader"
            " says",
        ),
        (
            "kills / pauses / power cuts delivered",
            f"{report['kills_delivered']:,} / {report['pauses_delivered']} / {cuts}",
            "a power cut kills every process and loses what nobody synced"
            if cuts
            else "no power cuts: process deaths keep the page cache",
        ),
        (
            "paused workers fenced",
            str(report.get("pauses_fenced", 0)),
            "every late acknowledgement of the leases they held was refused",
        ),
        *(
            [
                (
                    "server restarts / sessions terminated",
                    f"{restarts} / {session_kills}",
                    "the workers lived on and reconnected",
                )
            ]
            if restarts or session_kills
            else []
        ),
        ("respawns", f"{report['respawns']:,}", ""),
        (
            "store judged by",
            accounting["judge"],
            "ok" if accounting["judge_ok"] else "INCONSISTENT",
        ),
    ]
    anomalies = report.get("anomalies", [])
    explanations = _explain(anomalies[:EXPLAINED_ANOMALIES], logs, start, faults)
    return View(
        "chaos.html.j2",
        verdict,
        figures,
        {
            "throughput": throughput,
            "density": density,
            "reproducers": _reproducers(run_dir, report),
            "lanes": lanes,
            "lane_ticks": [(at, number_text(at)) for at in nice_ticks(0.0, max(elapsed, 0.001))],
            "end": max(elapsed, 0.001),
            "explanations": explanations,
            "unexplained": len(anomalies) - len(explanations),
            "promises": promises_of(report),
            "notes": report.get("notes", [])
            + (
                [
                    f"This run delivered the recorded fault schedule of {report['replay_of']} again"
                    " (same seed and faults; the interleaving of the processes may differ)."
                ]
                if report.get("replay_of")
                else []
            ),
            "power_cuts": cuts,
            "network": bool(report.get("network")),
        },
    )


def _unknown_rows(accounting: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Acknowledgements whose answer never came: unknown, and how the store settled them."""
    if "unknown_outcomes" not in accounting:
        return []
    settled = ", ".join(
        f"{count:,} {status}" for status, count in accounting["unknown_outcomes_settled"].items()
    )
    return [
        (
            "acknowledgements with no answer (unknown)",
            f"{accounting['unknown_outcomes']:,}",
            "sent, and no answer came (the worker died, or the answer was lost and the server"
            " could not be asked): counted neither done nor lost;"
            + (f" the store holds those jobs {settled}" if settled else ""),
        )
    ]


def _shared_commit_rows(shared: dict[str, int] | None) -> list[tuple[str, str, str]]:
    """The group-commit figures, for a system that shares commits between processes."""
    if shared is None:
        return []
    vanished = shared["carrier_vanished_applied"] + shared["carrier_vanished_rerun"]
    return [
        (
            "transitions carried by another worker's commit",
            f"{shared['carried_by_others']:,}",
            f"the carriers logged {shared['carried_for_others']:,}"
            " (one killed between its commit and its log line could not)",
        ),
        (
            "requests whose carrier died holding them",
            f"{vanished:,}",
            f"{shared['carrier_vanished_applied']:,} found committed by it,"
            f" {shared['carrier_vanished_rerun']:,} run again by their worker",
        ),
    ]


def _chaos_lanes(
    report: dict[str, Any], logs: dict[str, Any], start: float | None, elapsed: float
) -> list[dict[str, Any]]:
    """One lane per worker slot: each process's life, its kills and pauses."""
    by_slot: dict[int, list[dict[str, Any]]] = {}
    for worker in report.get("workers_started", []):
        by_slot.setdefault(worker["slot"], []).append(worker)
    lanes = []
    for slot, workers in sorted(by_slot.items()):
        spans = []
        for index, worker in enumerate(workers):
            end = workers[index + 1]["started_at_s"] if index + 1 < len(workers) else elapsed
            log = logs.get(worker["worker_id"])
            acked = len(log.acks) if log else 0
            spans.append(
                {
                    "start": worker["started_at_s"],
                    "end": end,
                    "color": PALETTE[index % 2],
                    "title": f"{worker['worker_id']}: {acked} acknowledgements",
                }
            )
        mine = [
            f
            for f in report["faults"]
            if "at_s" in f
            # A partition of some workers names each path it cut off.
            and (f.get("worker_slot", slot) == slot or f"worker-{slot}" in f.get("paths", ()))
        ]
        radius = 2 if len(mine) > DENSE_MARKS // 2 else 4
        dots = [
            {"at": f["at_s"], "color": FAULT_COLORS[f["kind"]], "title": _fault_title(f, 3),
             "r": radius}
            for f in mine
            if f["kind"] not in SHADED
        ]  # fmt: skip
        windows = [
            {"start": f["at_s"], "end": f.get("continued_at_s", f.get("until_s", elapsed)),
             "color": FAULT_COLORS[f["kind"]], "title": _fault_title(f, 3)}
            for f in mine
            if f["kind"] in SHADED
        ]  # fmt: skip
        lanes.append(
            {"label": f"slot {slot} ({len(workers)} processes)", "spans": spans, "dots": dots,
             "windows": windows}
        )  # fmt: skip
    return lanes


WORDS = {
    "claim": "claimed it",
    "acking": "sent its acknowledgement",
    "ack": "was told its acknowledgement was accepted",
    "stale": "was told its acknowledgement was refused",
}


#: More kills than this are drawn as their density, not one line each.
DENSE_MARKS = 60

#: The chaos page spells out this many anomalies with their evidence; chaos.json lists all.
EXPLAINED_ANOMALIES = 20


def _explain(
    anomalies: list[str],
    logs: dict[str, Any],
    start: float | None,
    faults: Sequence[dict[str, Any]] = (),
) -> list[dict[str, Any]]:
    """Each anomaly with what the workers' logs say of its job, in time order, and the faults
    that fell between: power cuts (what a cut lost explains a second acknowledgement), and
    pauses and network windows that overlapped (a stalled holder beside the second one)."""
    origin = start or 0.0
    cuts = [
        (origin + f["at_s"], origin + f.get("until_s", f.get("continued_at_s", f["at_s"])),
         _fault_title(f, 3))
        for f in faults
        if "at_s" in f and (f["kind"] == "power cut" or f["kind"] in SHADED)
    ]  # fmt: skip
    explained = []
    for line in anomalies:
        words = line.split()
        key = words[1].rstrip(":") if len(words) > 1 and words[0] == "job" else None
        evidence = sorted(
            (at, f"{at - origin:.3f} s: {worker} {WORDS.get(word, word)} (lease {token})")
            for worker, log in logs.items()
            for at, word, logged, token in log.events
            if logged == key
        )
        if evidence:
            first, last = evidence[0][0], evidence[-1][0]
            evidence += [(at, title) for at, until, title in cuts if at <= last and until >= first]
        explained.append({"anomaly": line, "evidence": [text for _, text in sorted(evidence)]})
    return explained


def bench_view(run_dir: Path) -> View:
    report = _read(run_dir / "bench.json")
    cells = [cell for cell in report["cells"] if "jobs_per_s" in cell]
    lanes = list(report.get("systems", {}))
    charts = []
    for work in sorted({cell["work_ms"] for cell in cells}):
        series, latency = [], []
        for index, lane in enumerate(lanes):
            own = sorted(
                (c for c in cells if c["system"] == lane and c["work_ms"] == work),
                key=lambda c: c["workers"],
            )
            if own:
                color = PALETTE[index % len(PALETTE)]
                series.append(Series(lane, [(c["workers"], c["jobs_per_s"]) for c in own], color))
                latency.append(
                    Series(lane, [(c["workers"], c["latency_p99_ms"]) for c in own], color)
                )
        charts.append(
            Chart(
                f"Jobs per second, {work:g} ms of work per job",
                "workers",
                "jobs/s",
                series,
                rules=[Rule(report["disk"]["fsyncs_per_s"], "fsyncs/s of this disk")],
                log_x=True,
            )
        )
        charts.append(
            Chart(
                f"p99 claim-to-acknowledgement latency, {work:g} ms of work",
                "workers",
                "ms",
                latency,
                log_x=True,
            )
        )
    # The run's own account of what failed; a bench.json from before it kept one is read
    # cell by cell.
    failed = report.get("reasons") or [
        f"{c['system']} at {c['workers']} workers: {c['failed']}"
        for c in report["cells"]
        if "failed" in c
    ] + [
        f"{c['system']} at {c['workers']} workers, {c['work_ms']:g} ms:"
        f" not verified ({c['verified']})"
        for c in cells
        if not c["verified"]["ok"]
    ]
    every = report["cells"]
    workers = ",".join(str(n) for n in sorted({c["workers"] for c in every}))
    work = ",".join(f"{ms:g}" for ms in sorted({c["work_ms"] for c in every}))
    verdict = Verdict(
        ok=report["ok"],
        title=f"benchmark: {', '.join(lanes)}",
        system=", ".join(lanes),
        durability="; ".join(
            f"{name}: {d.get('durability', '')}" for name, d in report.get("systems", {}).items()
        ),
        seed=None,
        duration=None,
        command="crashqueuelab bench "
        + " ".join(f"--system {spec}" for spec in report.get("system_specs", []))
        + "".join(f" --peer {peer}" for peer in report.get("peers", []))
        + f" --jobs {report['jobs_per_cell']} --workers {workers} --work-ms {work}"
        + (f" --repeat {report['repeat']}" if report.get("repeat", 1) > 1 else "")
        + f" --batch {report['batch']} --output-directory {run_dir}",
        reasons=failed,
    )
    figures = [
        (
            "disk",
            f"{report['disk']['fsyncs_per_s']:,.0f} fsyncs/s",
            f"p50 {report['disk']['p50_us']:.0f} µs",
        ),
        (
            "jobs per cell",
            f"{report['jobs_per_cell']:,}",
            "pre-submitted; workers released together",
        ),
        (
            "runs per cell",
            f"{report.get('repeat', 1)}",
            "each cell shows its median run; the range of every run beside it"
            if report.get("repeat", 1) > 1
            else "one run each",
        ),
        (
            "machine",
            f"{report['machine']['cpus']} CPUs",
            f"Python {report['machine']['python']}, SQLite {report['machine']['sqlite']}",
        ),
    ]
    return View("bench.html.j2", verdict, figures, {"charts": charts, "cells": report["cells"]})


def demo_view(run_dir: Path) -> View:
    comparison = _read(run_dir / "comparison.json")
    sides = []
    for name in ("non_idempotent", "idempotent"):
        scenario = _read(run_dir / name / "report.json")
        history_file = run_dir / name / "history.json"
        sides.append(
            {
                "name": name.replace("_", "-"),
                "figures": comparison[name],
                "report": scenario,
                "timeline": _timeline(_read(history_file)) if history_file.is_file() else [],
            }
        )
    system = comparison.get("system", {"name": "sqlite", "durability": ""})
    idem, non = comparison["idempotent"], comparison["non_idempotent"]
    ok = idem["invariants_ok"] and non["invariants_ok"]
    verdict = Verdict(
        ok=ok,
        title="effect committed, then a crash before the acknowledgement",
        system=system["name"],
        durability=system.get("durability", ""),
        seed=None,
        duration=None,
        command=f"crashqueuelab demo --system {system['name']} --output-directory {run_dir}",
        reasons=[] if ok else ["a store failed its judge"],
    )
    figures = [
        (
            "crash point",
            comparison["fault_point"],
            "the worker died after its effect, before acknowledging",
        ),
        (
            "attempts (non-idempotent / idempotent)",
            f"{non['attempt_count']} / {idem['attempt_count']}",
            "",
        ),
        (
            "durable effects",
            f"{non['effect_count']} / {idem['effect_count']}",
            "two executions both times; the idempotent destination keeps one",
        ),
        ("delivery semantics", comparison["queue_delivery_semantics"], ""),
    ]
    return View("demo.html.j2", verdict, figures, {"sides": sides})


def showcase_view(run_dir: Path) -> View:
    summary = _read(run_dir / "showcase.json")
    sections = []
    for spec, section in summary["systems"].items():
        base = Path(section["artifacts"]["campaign_report"]).parent.parent
        sections.append(
            {
                "spec": spec,
                "section": section,
                "campaign_link": str(
                    (base / "process-fault-campaign" / "report.html").relative_to(run_dir)
                ),
                "demo_link": str(
                    (base / "effect-commit-before-acknowledgement" / "report.html").relative_to(
                        run_dir
                    )
                ),
                "power_loss_link": str(
                    (base / "power-loss-campaign" / "report.html").relative_to(run_dir)
                ),
            }
        )
    reasons = [
        f"{spec}: not ok" for spec, section in summary["systems"].items() if not section["ok"]
    ]
    mutants = summary["mutants"]
    reasons += [f"mutant {name} not caught" for name in mutants["missed"]]
    verdict = Verdict(
        ok=summary["ok"],
        title=f"showcase: the effect experiment and the crash campaigns on {len(sections)}"
        f" systems; mutants {score(mutants)}",
        system=", ".join(summary["systems"]),
        durability="",
        seed=summary["seed"],
        duration=None,
        command=f"crashqueuelab showcase --seed {summary['seed']} "
        + " ".join(f"--system {spec}" for spec in summary["systems"])
        + f" --output-directory {run_dir}",
        reasons=reasons,
        not_run=summary.get("not_run", []),
    )
    campaign = summary["process_fault_campaign"]
    figures = [
        (
            f"{spec}: crash points passed",
            f"{s['section']['process_fault_campaign']['passed']} of "
            f"{s['section']['process_fault_campaign']['named_fault_points']}",
            "",
        )
        for s in sections
        for spec in [s["spec"]]
    ] + [
        ("mutants", score(mutants), mutants["line"]),
        ("power loss", summary["power_loss"], "campaigns that lose what nobody synced"),
        ("delivery semantics", summary["queue_delivery_semantics"], ""),
        ("exit codes", ", ".join(map(str, campaign["exit_codes"])), "86: killed by the crash hook"),
    ]
    return View(
        "showcase.html.j2",
        verdict,
        figures,
        {"sections": sections, "mutants": mutants, "mutants_link": "mutants/report.html"},
    )
