"""What a campaign's report says, computed from its case, probe and model reports alone: its
summary (by crash mode), each failure as one finding whose line names the case or probe, and
its verdict (``ok`` only when everything asked for ran and passed)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from crashqueuelab.judges.findings import Anomaly, Kind, inconsistent, joined, restored
from crashqueuelab.lab.campaign.cases import (
    death_finding,
    differs_finding,
    effects_finding,
    unfinished_finding,
)
from crashqueuelab.lab.campaign.failover_cases import (
    LEASE_WENT_BACK,
    LOST,
    RESURRECTED,
    WENT_BACK,
)
from crashqueuelab.lab.campaign.probes import (
    FAILED,
    NOT_APPLICABLE,
    NOT_RUN,
    PASSED,
    probe_finding,
    status_of,
)
from crashqueuelab.lab.runs.modes import FAILOVER, POWER_LOSS, PROCESS
from crashqueuelab.lab.workloads.scenario import scenario_jobs

#: How each mode kills, as reports name it.
MECHANISM = {
    PROCESS: "spawned_process_os_exit",
    POWER_LOSS: "spawned_process_os_exit_then_fuse_power_cut",
    FAILOVER: "spawned_process_os_exit_then_primary_killed_and_standby_promoted",
}


def _probe_summary(report: dict[str, Any]) -> dict[str, Any]:
    probes, model = report["probes"], report["model"]
    statuses = Counter(status_of(probe) for probe in probes)
    return {
        "probes_passed": statuses[PASSED],
        "probes_failed": statuses[FAILED],
        # The system declares it lacks what these need: they ask nothing of it.
        "probes_not_applicable": statuses[NOT_APPLICABLE],
        # The lab could not open the system for these: never counted as passed.
        "probes_not_run": statuses[NOT_RUN],
        "model_workload_ok": model["ok"],
        "model_workload_observations": model["observations"],
    }


def _case_summary(cases: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "named_fault_points": len({case["fault_point"] for case in cases}),
        "passed": sum(1 for case in cases if case["passed"]),
        "failed": sum(1 for case in cases if not case["passed"]),
        "timeouts": sum(1 for case in cases if case["timed_out"]),
        "exit_codes": sorted(
            {case["exit_code"] for case in cases if case["exit_code"] is not None}
        ),
    }


def summarize_power_loss(report: dict[str, Any]) -> dict[str, Any]:
    """A power-loss campaign's summary, computed from its case and probe reports."""
    cases = report["cases"]
    states = [state for case in cases for state in case["crash_states"]]
    return {
        "crash_mode": MECHANISM[POWER_LOSS],
        **_case_summary(cases),
        # Distinct states: a choice that made a state already judged is counted apart.
        "crash_states": len(states),
        "crash_states_passed": sum(1 for state in states if state["passed"]),
        "duplicate_crash_states_skipped": sum(
            len(case["duplicate_crash_states"]) for case in cases
        ),
        "cases_with_nothing_unsynced": sum(
            1 for case in cases if case["power_cut"]["nothing_unsynced"]
        ),
        "states_losing_acknowledged_work": sum(
            1 for state in states if not state["durable_as_promised"]
        ),
        # Choices a bounded case never made: no state of theirs was judged.
        "crash_state_choices_unstarted": sum(len(_unstarted(case)) for case in cases),
        "pending_writes_at_cuts": sum(case["power_cut"]["pending_writes"] for case in cases),
        "pending_directory_changes_at_cuts": sum(
            case["power_cut"]["pending_directory_changes"] for case in cases
        ),
        **_probe_summary(report),
    }


def summarize_failover(report: dict[str, Any]) -> dict[str, Any]:
    """A failover campaign's summary, computed from its case and probe reports: the level
    and its promise, what the failovers took back, and what each cost."""
    cases, setting = report["cases"], report["failover"]
    changes = Counter(one["change"] for case in cases for one in case["changes"]["jobs"])
    lags = [case["failover"]["lag_bytes"] or 0 for case in cases]
    promotions = sorted(case["failover"]["promoted_s"] for case in cases)
    return {
        "crash_mode": MECHANISM[FAILOVER],
        "synchronous_commit": setting["synchronous_commit"],
        "promise": setting["promise"]["quoted"],
        "promise_allows_loss": setting["promise"]["allows_loss"],
        "standby_held": setting["standby_held"],
        **_case_summary(cases),
        "cases_losing_committed_work": sum(1 for case in cases if case["lost_at_failover"]),
        "cases_with_documented_loss": sum(1 for case in cases if case["documented"]),
        "broken_promises": sum(
            1
            for case in cases
            for finding in case["findings"]
            if finding["kind"] == Kind.ACKNOWLEDGED_WORK_LOST.value
        ),
        "jobs_lost": changes[LOST],
        "jobs_went_back": changes[WENT_BACK],
        "jobs_resurrected": changes[RESURRECTED],
        "leases_went_back": changes[LEASE_WENT_BACK],
        "transitions_lost": sum(len(case["changes"]["transitions_lost"]) for case in cases),
        "lag_bytes_max": max(lags, default=0),
        "lag_bytes_total": sum(lags),
        "promoted_s_median": promotions[len(promotions) // 2] if promotions else None,
        "promoted_s_max": promotions[-1] if promotions else None,
        **_probe_summary(report),
    }


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    """The campaign's summary, computed from its case and probe reports."""
    if report["crash_mode"] == POWER_LOSS:
        return summarize_power_loss(report)
    if report["crash_mode"] == FAILOVER:
        return summarize_failover(report)
    cases = report["cases"]
    checks = sorted({name for case in cases for name in case["crash_judgement"]["checks"]})
    return {
        "crash_mode": MECHANISM[PROCESS],
        **_case_summary(cases),
        "crash_time_judgement_all_ok": all(case["crash_judgement"]["ok"] for case in cases),
        # Each named check of the system's reader (for SQLite: replay, invariants).
        **{
            f"crash_time_{name}_all_ok": all(
                case["crash_judgement"]["checks"].get(name, False) for case in cases
            )
            for name in checks
        },
        "crash_states_all_match": all(case["crash_state_matches_point"] for case in cases),
        "recovery_all_succeeded": all(case["recovery_ok"] for case in cases),
        **_probe_summary(report),
    }


def anomalies_of(report: dict[str, Any]) -> list[Anomaly | str]:
    """Every failure of a campaign as one finding whose line names the case or probe and
    what happened (a line alone where the record kept no finding for it)."""
    found: list[Anomaly | str] = []
    for case in report["cases"]:
        if case["passed"]:
            continue
        prefix, point = f"case {case['case_id']}: ", case["fault_point"]
        if "anomalies" in case:  # a power-loss or failover case lists its own
            found += [
                prefix + line if isinstance(line, str) else line.within(prefix, point=point)
                for line in restored(case["anomalies"], case.get("findings"))
            ]
            continue
        reasons = _case_reasons(case)
        structured = [reason for reason in reasons if isinstance(reason, Anomaly)]
        if len(structured) == len(reasons):
            found.append(joined(prefix, structured).within("", point=point))
        else:  # a reason kept as a line alone: so is the case's line
            words = [reason if isinstance(reason, str) else reason.text for reason in reasons]
            found.append(prefix + "; ".join(words))
    found += [probe_finding(p) for p in report["probes"] if status_of(p) == FAILED]
    model = report["model"]
    found += [
        MODEL_LINE + line if isinstance(line, str) else line.within(MODEL_LINE)
        for line in restored(model["anomalies"], model.get("findings"))
    ]
    return found


#: What starts the line of each of the model workload's anomalies.
MODEL_LINE = "model workload: "


def _case_reasons(case: dict[str, Any]) -> list[Anomaly | str]:
    """Why a process-death case failed, reason by reason, in the order its line says them."""
    reasons: list[Anomaly | str] = []
    never_reached = case.get("points_reached") is not None and case["exit_code"] == 0
    if not case["died_at_fault_point"]:
        reasons.append(death_finding(case))
    # A point never reached left the workload's final state: comparing it says nothing.
    if not case["crash_state_matches_point"] and not never_reached:
        found, expected = case["crash_state"]["signature"], case["expected_crash_signature"]
        reasons.append(differs_finding(found, expected))
    reasons += [inconsistent(problem) for problem in case["crash_judgement"]["problems"]]
    recovery = case["recovery"]
    reasons += restored(recovery["anomalies"], recovery.get("findings"))
    reasons += [
        inconsistent(problem, "after recovery: ") for problem in recovery["store"]["problems"]
    ]
    if not recovery["each_effect_durable_once"]:
        jobs = scenario_jobs(case["case_id"])
        reasons.append(effects_finding(recovery["ledger"]["effects_by_key"], jobs))
    if recovery["final_states"] is not None and not case["recovery_ok"]:
        reasons.append(unfinished_finding(recovery["final_states"]))
    return reasons


def _unstarted(case: dict[str, Any]) -> list[str]:
    """The crash-state choices a power-loss case left unstarted (none in a record made
    before cases were bounded)."""
    return list(case.get("power_cut", {}).get("choices_unstarted", []))


def not_run_of(report: dict[str, Any]) -> list[str]:
    """What the campaign was asked for and did not run, each with why."""
    bounded = [case for case in report["cases"] if _unstarted(case)]
    unstarted = []
    if bounded:
        left = sum(len(_unstarted(case)) for case in bounded)
        choices = sum(case["power_cut"]["choices"] for case in bounded)
        unstarted.append(
            f"crash states: {left} of {choices} choices not judged, in {len(bounded)} of"
            f" {len(report['cases'])} cases (at most {report['crash_states_per_case']} states"
            " per case; each case's power_cut.choices_unstarted names its own)"
        )
    return unstarted + [
        f"probe {probe['name']}: {probe['detail']}"
        for probe in report["probes"]
        if status_of(probe) == NOT_RUN
    ]


def judge(report: dict[str, Any]) -> dict[str, Any]:
    """The campaign's verdict: ``ok`` only when everything asked for ran and passed,
    ``passed_what_ran`` when nothing that ran failed, ``not_run`` what did not and why."""
    summary = report["summary"]
    passed_what_ran = (
        summary["failed"] == 0 and summary["probes_failed"] == 0 and bool(report["model"]["ok"])
    )
    not_run = not_run_of(report)
    return {
        "ok": passed_what_ran and not not_run,
        "passed_what_ran": passed_what_ran,
        "complete": not not_run,
        "not_run": not_run,
    }
