"""The page of a crash campaign, in either crash mode: for process faults, each crash
point's child, the state it left and its recovery; for power loss, each point's cut and
every crash state the disk allowed. Both end with the fencing probes, the model-driven
workload and the reproducers, and give each failing case and probe the command that
runs it alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crashqueuelab.lab.campaign.probes import FAILED, NOT_APPLICABLE, status_of
from crashqueuelab.lab.pages.common import (
    Verdict,
    View,
    promises_of,
    read_json,
    reproducers,
    system_label,
)
from crashqueuelab.lab.pages.transitions import store_transitions
from crashqueuelab.lab.runs.commands import campaign_command
from crashqueuelab.lab.workloads.scenario import RECOVERY_OFFSET_US, START_US


def _yes(flag: bool) -> str:
    return "yes" if flag else "NO"


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
    probes = report.get("probes", [])
    not_applicable = [
        f"{probe['name']} ({probe['detail']})"
        for probe in probes
        if status_of(probe) == NOT_APPLICABLE
    ]
    not_run = summary.get("probes_not_run", 0)
    probes_row = (
        "fencing probes",
        f"{summary['probes_passed']} passed, {summary['probes_failed']} failed"
        + (f", {not_run} not run" if not_run else "")
        + (f", {len(not_applicable)} not applicable" if not_applicable else ""),
        f"not applicable (the system declares it lacks what they need, so they ask nothing"
        f" of it): {'; '.join(not_applicable)}"
        if not_applicable
        else "every probe applies to this system",
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
    return [probes_row, workload, ("system", system["version"], system["durability"])]


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
            "status": status_of(probe),
            "rerun": campaign_command(
                report, str(run_dir / RERUNS_DIRECTORY / probe["name"]), probe=probe["name"]
            )
            if status_of(probe) == FAILED
            else None,
        }
        for probe in report["probes"]
    ]


def _case_states_text(case: dict[str, Any]) -> str:
    """A case's crash states passed, or that its cut had nothing to lose."""
    count = len(case["crash_states"])
    if case["power_cut"].get("nothing_unsynced"):
        return f"nothing unsynced at the cut: {count} crash state"
    left = len(case["power_cut"].get("choices_unstarted", []))
    return f"{case['states_passed']} of {count}" + (f" ({left} not judged)" if left else "")


def _states_detail(summary: dict[str, Any]) -> str:
    """What the count of crash states counts, and what it leaves out."""
    judged = "each read, compared with the point's promise, recovered and read again"
    if "duplicate_crash_states_skipped" not in summary:  # a report from before they were
        return judged
    skipped = summary["duplicate_crash_states_skipped"]
    nothing = summary["cases_with_nothing_unsynced"]
    return (
        f"{judged}; {skipped} more {'choice' if skipped == 1 else 'choices'} made a state"
        " already judged (the same fate of every unsynced operation, or the same bytes) and"
        f" were not judged again; {nothing} crash {'point' if nothing == 1 else 'points'}"
        " had nothing unsynced at the cut (1 crash state each)"
    )


def _verdict(
    run_dir: Path, report: dict[str, Any], title: str, durability: str | None = None
) -> Verdict:
    """The verdict of a campaign whose cases list their own anomalies (power loss,
    failover): its first reasons, the rest in the tables (``durability``: what the run
    made of the system's own)."""
    system = report["system"]
    return Verdict(
        ok=report.get("passed_what_ran", report["ok"]),
        title=title,
        system=system_label(system),
        durability=durability or system["durability"],
        seed=report["seed"],
        duration=report["timings"]["total_ms"] / 1000,
        command=campaign_command(report, str(run_dir)),
        reasons=_first(report.get("anomalies", [])),
        not_run=report.get("not_run", []),
    )


def _unstarted_figure(
    summary: dict[str, Any], report: dict[str, Any]
) -> list[tuple[str, str, str]]:
    """The crash-state choices the cases left unjudged, where a bound left some."""
    left = summary.get("crash_state_choices_unstarted", 0)
    if not left:
        return []
    return [
        (
            "crash-state choices not judged",
            str(left),
            f"at most {report['crash_states_per_case']} crash states per case"
            " (--crash-states): what the others would show is not known",
        )
    ]


def power_loss_view(run_dir: Path, report: dict[str, Any]) -> View:
    """A power-loss campaign: each crash point's cut and every crash state it allowed."""
    summary = report["summary"]
    cases = []
    for case in report["cases"]:
        states = [state | _state_texts(state) for state in case["crash_states"]]
        cases.append(
            case
            | {
                "crash_states": states,
                "states_text": _case_states_text(case),
                "skipped": case.get("duplicate_crash_states", []),
                "unstarted": case["power_cut"].get("choices_unstarted", []),
                "rerun": _case_rerun(report, run_dir, case),
                "lost_in": sum(1 for state in states if not state["durable_as_promised"]),
                "promised_text": " or ".join(_signature_text(p) for p in case["promised"]),
            }
        )
    distinct = "distinct " if "duplicate_crash_states_skipped" in summary else ""
    verdict = _verdict(
        run_dir,
        report,
        f"power-loss campaign, {summary['named_fault_points']} crash points,"
        f" {summary['crash_states']} {distinct}crash states",
    )
    figures = [
        (
            "crash points passed",
            f"{summary['passed']} of {summary['named_fault_points']}",
            "a real child died there (exit 86), then the power was cut",
        ),
        (
            "crash states passed",
            f"{summary['crash_states_passed']} of {summary['crash_states']} {distinct}crash states",
            _states_detail(summary),
        ),
        (
            "crash states that lost acknowledged work",
            str(summary["states_losing_acknowledged_work"]),
            "must be 0",
        ),
        *_unstarted_figure(summary, report),
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
        "reproducers": reproducers(run_dir, report),
        "promises": promises_of(report),
    }
    return View("powerloss.html.j2", verdict, figures, data)


def case_history(history: list[dict[str, Any]], case_id: str) -> list[dict[str, Any]]:
    """A crash case's store history as transitions, in seconds from the case's start (the
    scripted workload's clock), recovery told apart from the child that died."""
    return store_transitions(
        history,
        origin_us=START_US,
        recovery_us=START_US + RECOVERY_OFFSET_US,
        job_prefix=f"{case_id}/",
    )


def _phases(case: dict[str, Any]) -> dict[str, str]:
    """What the two parts of a crash case's history are, as its table says them."""
    first = case.get("after_crash_at")
    child = (
        f"the children: one killed at {first['fault_point']}, then one at {case['fault_point']}"
        if first
        else f"the child, until it was killed at {case['fault_point']}"
    )
    return {"workload": child, "recovery": "recovery, after the crash"}


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _lost_text(changes: dict[str, Any]) -> str:
    """What a failover took back, in short: jobs by what became of them, transitions."""
    counts: dict[str, int] = {}
    for one in changes["jobs"]:
        counts[one["change"]] = counts.get(one["change"], 0) + 1
    parts = [f"{count} {change}" for change, count in sorted(counts.items())]
    parts.append(_plural(len(changes["transitions_lost"]), "transition") + " lost")
    return ", ".join(parts) if changes["jobs"] or changes["transitions_lost"] else "nothing"


def failover_view(run_dir: Path, report: dict[str, Any]) -> View:
    """A failover campaign: each crash point's failover (the standby's lag, the time to
    promote) and every job and transition the promoted standby lacked."""
    summary, setting = report["summary"], report["failover"]
    promise = setting["promise"]
    cases = [
        case
        | {
            "rerun": _case_rerun(report, run_dir, case),
            "lost_text": _lost_text(case["changes"]),
            "found": _signature_text(case["crash_state"]["signature"]),
            "expected": _signature_text(case["expected_crash_signature"]),
            "promoted_text": _signature_text(case["promoted_state"]["signature"]),
            "final": _states(case["recovered_terminal_state"]),
        }
        for case in report["cases"]
    ]
    verdict = _verdict(
        run_dir,
        report,
        f"failover campaign at {promise['setting']}, {summary['named_fault_points']} crash points",
        f"each case on a primary and a streaming standby at {promise['setting']}",
    )
    allowed = "allows" if promise["allows_loss"] else "does not allow"
    figures = [
        (
            "crash points passed",
            f"{summary['passed']} of {summary['named_fault_points']}",
            "a real child died there (exit 86), the primary was killed, the standby promoted,"
            " judged, asked and recovered",
        ),
        (
            "replication setting",
            promise["setting"],
            f"its documented promise {allowed} losing a commit at a failover",
        ),
        (
            "cases that lost committed work",
            f"{summary['cases_losing_committed_work']} ({summary['cases_with_documented_loss']}"
            f" documented, {summary['broken_promises']} broken promises)",
            "committed on the primary at the crash, absent or older on the promoted standby",
        ),
        (
            "jobs lost / gone back / resurrected / leases gone back",
            f"{summary['jobs_lost']} / {summary['jobs_went_back']} /"
            f" {summary['jobs_resurrected']} / {summary['leases_went_back']}",
            f"{_plural(summary['transitions_lost'], 'transition')} of the primaries' histories"
            " lost in all",
        ),
        (
            "the standby's lag at the crash",
            f"at most {summary['lag_bytes_max']:,} bytes of WAL",
            setting["standby_held"],
        ),
        (
            "time to promote",
            f"median {summary['promoted_s_median']:.3f} s,"
            f" at most {summary['promoted_s_max']:.3f} s",
            "from the primary's kill until the promoted standby accepted writes",
        ),
        *_closing_figures(report),
    ]
    data = {
        "cases": cases,
        "probes": _probes_with_reruns(report, run_dir),
        "reproducers": reproducers(run_dir, report),
        "promises": promises_of(report),
        "promise": promise,
        "standby_held": setting["standby_held"],
    }
    return View("failovercampaign.html.j2", verdict, figures, data)


def campaign_view(run_dir: Path) -> View:
    report = read_json(run_dir / "campaign.json")
    if report.get("crash_mode") == "power-loss":
        return power_loss_view(run_dir, report)
    if report.get("crash_mode") == "failover":
        return failover_view(run_dir, report)
    system, summary = report["system"], report["summary"]
    cases = []
    for case in report["cases"]:
        case_dir = run_dir / case["artifacts"]["case_directory"]
        history_file = case_dir / "history.json"
        history = read_json(history_file) if history_file.is_file() else []
        ledger = case["recovery"]["ledger"]
        cases.append(
            case
            | {
                "anchor": case["case_id"],
                "rerun": _case_rerun(report, run_dir, case),
                "executions": ledger["effects"] + ledger["absorbed"],
                "durable_effects": ledger["effects"],
                "history": case_history(history, case["case_id"]),
                "phases": _phases(case),
                "found": _signature_text(case["crash_state"]["signature"]),
                "expected": _signature_text(case["expected_crash_signature"]),
                "final": _states(case["recovered_terminal_state"]),
            }
        )
    verdict = Verdict(
        ok=report.get("passed_what_ran", report["ok"]),
        title=f"process-fault campaign, {summary['named_fault_points']} crash points",
        system=system_label(system),
        durability=system["durability"],
        seed=report["seed"],
        duration=report["timings"]["total_ms"] / 1000,
        command=campaign_command(report, str(run_dir)),
        reasons=report.get("anomalies", []),
        not_run=report.get("not_run", []),
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
        "reproducers": reproducers(run_dir, report),
        "promises": promises_of(report),
        "history_kept": any(case["history"] for case in cases),
        "recovery_from": f"{RECOVERY_OFFSET_US / 1e6:,.0f} s",
    }
    return View("campaign.html.j2", verdict, figures, data)
