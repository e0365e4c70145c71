"""The page of a chaos run: acknowledgements per second with every fault drawn where it
struck, one lane per worker slot, the accounting the run was judged by, and the first
anomalies told with what the workers' logs say of their jobs; the command that
delivers the same schedule again."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from crashqueuelab.lab.chaos.worklog import read_logs
from crashqueuelab.lab.pages.charts import (
    DENSE_LANE,
    Chart,
    LaneChart,
    Mark,
    Series,
    Window,
    nice_ticks,
    number_text,
    rate_over_time,
)
from crashqueuelab.lab.pages.common import (
    PALETTE,
    Verdict,
    View,
    promises_of,
    read_json,
    reproducers,
    system_label,
)
from crashqueuelab.lab.pages.faults import (
    FAULT_COLORS,
    KILL,
    SHADED,
    deploy_marks,
    fault_title,
)
from crashqueuelab.lab.pages.network import WINDOW_LEGENDS, legend, network_rows
from crashqueuelab.lab.runs.commands import runnable


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
    failovers = report.get("failovers_delivered", 0)
    held = report.get("held_commits_delivered", 0)
    session_kills = report.get("session_kills_delivered", 0)
    return (
        runnable("crashqueuelab chaos", report)
        + f" --system {report.get('system_spec', report['system']['name'])}"
        f" --seed {report['seed']} --jobs {parameters['jobs']} --workers {parameters['workers']}"
        f" --kills {parameters['kills']} --pauses {parameters['pauses']}"
        + (f" --crash-mode power-loss --power-cuts {cuts}" if cuts else "")
        + (f" --server-restarts {restarts}" if restarts else "")
        + (f" --failovers {failovers}" if failovers else "")
        + (f" --held-commits {held}" if held else "")
        + (f" --session-kills {session_kills}" if session_kills else "")
        + f" --lease-ms {parameters['lease_ms']} --batch {parameters['batch']}"
        + (f" --poison-jobs {parameters['poison_jobs']}" if "poison_jobs" in parameters else "")
        + (f" --long-jobs {parameters['long_jobs']}" if "long_jobs" in parameters else "")
        + f" --output-directory {run_dir}"
    )


def chaos_view(run_dir: Path) -> View:
    report = read_json(run_dir / "chaos.json")
    accounting, parameters = report["accounting"], report["parameters"]
    elapsed = report["timings"]["elapsed_s"]
    start = report.get("started_monotonic_s")
    logs = read_logs(run_dir / "worker-logs")
    acks = [at - start for log in logs.values() for at in log.ack_times] if start else []
    faults = [f for f in report["faults"] if "at_s" in f]
    throughput, density = _throughput_charts(report, faults, acks, elapsed)
    lanes = _chaos_lanes(report, logs, start, elapsed)
    verdict = _chaos_verdict(report, parameters, run_dir, elapsed)
    figures = _chaos_figures(report, accounting)
    cuts = report.get("power_cuts_delivered", 0)
    anomalies = report.get("anomalies", [])
    explanations = _explain(anomalies[:EXPLAINED_ANOMALIES], logs, start, faults)
    return View(
        "chaos.html.j2",
        verdict,
        figures,
        {
            "throughput": throughput,
            "density": density,
            "reproducers": reproducers(run_dir, report),
            "lanes": LaneChart(
                lanes,
                max(elapsed, 0.001),
                [(at, number_text(at)) for at in nice_ticks(0.0, max(elapsed, 0.001))],
            ),
            "dense_lane": DENSE_LANE,
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
            "deploys": report.get("deploys_delivered", 0),
            "network": bool(report.get("network")),
        },
    )


def _throughput_charts(
    report: dict[str, Any], faults: list[dict[str, Any]], acks: list[float], elapsed: float
) -> tuple[Chart, Chart | None]:
    """Acknowledgements per second with the faults drawn over them, and the kills'
    density when there are too many kills to draw one line each."""
    kills = [f for f in faults if f["kind"] == "SIGKILL"]
    dense = len(kills) > DENSE_MARKS
    # Pauses are shaded for as long as they held; the rare faults (cuts, restarts, ended
    # sessions) are lines drawn over everything; kills are lines too unless there are so many
    # that they would wall the chart, and then their density has a chart of its own.
    windows = [
        Window(
            f["at_s"],
            f.get("continued_at_s", f.get("until_s", elapsed)),
            fault_title(f),
            FAULT_COLORS[f["kind"]],
            *([WINDOW_LEGENDS[f["kind"]]] if f["kind"] in WINDOW_LEGENDS else []),
        )
        for f in faults
        if f["kind"] in SHADED
    ]
    wide = {"power cut", "server restart", "failover", "commits held open"}
    marks = sorted(
        (
            Mark(f["at_s"], fault_title(f), FAULT_COLORS[f["kind"]], f["kind"] in wide)
            for f in faults
            if f["kind"] not in SHADED and not (dense and f["kind"] == "SIGKILL")
        ),
        key=lambda mark: mark.color != KILL,
    )
    cuts = report.get("power_cuts_delivered", 0)
    restarts = report.get("server_restarts_delivered", 0)
    failovers = report.get("failovers_delivered", 0)
    held = report.get("held_commits_delivered", 0)
    session_kills = report.get("session_kills_delivered", 0)
    throughput = Chart(
        "Acknowledgements per second"
        + (", with every kill (red line)" if kills and not dense else "")
        + (", pauses shaded (orange)" if report["pauses_delivered"] else "")
        + (", power cuts (violet)" if cuts else "")
        + (", server restarts (black)" if restarts else "")
        + (", failovers (blue)" if failovers else "")
        + (", commits held open (green)" if held else "")
        + (", terminated sessions (teal)" if session_kills else "")
        + (", deploys (purple)" if report.get("deploys_delivered") else "")
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
    return throughput, density


def _chaos_verdict(
    report: dict[str, Any], parameters: dict[str, Any], run_dir: Path, elapsed: float
) -> Verdict:
    """The verdict, its title counting every fault delivered."""
    cuts = report.get("power_cuts_delivered", 0)
    restarts = report.get("server_restarts_delivered", 0)
    failovers = report.get("failovers_delivered", 0)
    held = report.get("held_commits_delivered", 0)
    session_kills = report.get("session_kills_delivered", 0)
    return Verdict(
        ok=report["ok"],
        title=f"chaos: {parameters['jobs']:,} jobs, {report['kills_delivered']:,} kills,"
        f" {report['pauses_delivered']} pauses,"
        + (f" {cuts} power cuts," if cuts else "")
        + (f" {restarts} server restarts," if restarts else "")
        + (f" {failovers} failovers," if failovers else "")
        + (f" {held} times commits held open," if held else "")
        + (f" {session_kills} sessions terminated," if session_kills else "")
        + (f" {report['deploys_delivered']} deploys," if report.get("deploys_delivered") else "")
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


def _chaos_figures(
    report: dict[str, Any], accounting: dict[str, Any]
) -> list[tuple[str, str, str]]:
    """The accounting the run was judged by, and the faults it delivered."""
    cuts = report.get("power_cuts_delivered", 0)
    restarts = report.get("server_restarts_delivered", 0)
    failovers = report.get("failovers_delivered", 0)
    held = report.get("held_commits_delivered", 0)
    session_kills = report.get("session_kills_delivered", 0)
    return [
        (
            "jobs submitted / succeeded",
            f"{accounting['submitted']:,} / {accounting['succeeded']:,}",
            "",
        ),
        (
            "lost, unfinished, dead, unexpected",
            f"{accounting['lost']}, {accounting.get('unfinished', 0)}, {accounting['dead']},"
            f" {accounting['unexpected']}",
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
        *(
            [
                (
                    "failovers",
                    str(failovers),
                    "the primary killed while its standby lagged, the standby promoted; the"
                    " workers lived on and reconnected to it",
                )
            ]
            if failovers
            else []
        ),
        *(
            [
                (
                    "commits held open",
                    str(held),
                    "the standby stopped answering and every worker's connection was reset"
                    " while COMMITs waited for it; the workers reconnected and asked",
                )
            ]
            if held
            else []
        ),
        *_deploy_rows(report),
        ("respawns", f"{report['respawns']:,}", ""),
        (
            "store judged by",
            accounting["judge"],
            "ok" if accounting["judge_ok"] else "INCONSISTENT",
        ),
    ]


def _deploy_rows(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """How the deployed workers ended, and what became of the jobs the SIGKILLed held."""
    deployed, parameters = report.get("deploys"), report["parameters"]
    if not deployed or not deployed["workers_stopped"]:
        return []
    fates = ", ".join(
        f"{count:,} {fate}" for fate, count in deployed["jobs_held_when_killed"].items()
    )
    return [
        (
            "deployed workers: SIGTERMed / exited within the grace / SIGKILLed at its end",
            f"{deployed['workers_stopped']:,} / {deployed['exited_within_grace']:,} /"
            f" {deployed['sigkilled']:,}",
            f"{report['deploys_delivered']} deploys of {parameters['surge']}, grace"
            f" {parameters['grace_s']:g} s, replacement {parameters['replace']};"
            f" {deployed['sigkilled_holding_jobs']} SIGKILLed holding jobs"
            + (f", which became: {fates}" if fates else ""),
        )
    ]


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
    """One lane per worker slot: each process's life, its kills and pauses, each deploy's
    SIGTERM, grace window and SIGKILL."""
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
            and f["kind"] != "deploy"
            # A partition of some workers names each path it cut off.
            and (f.get("worker_slot", slot) == slot or f"worker-{slot}" in f.get("paths", ()))
        ]
        deploys = [f for f in report["faults"] if "at_s" in f and f["kind"] == "deploy"]
        radius = 2 if len(mine) > DENSE_MARKS // 2 else 4
        dots = [
            {"at": f["at_s"], "color": FAULT_COLORS[f["kind"]], "title": fault_title(f, 3),
             "r": radius, "kind": f["kind"]}
            for f in mine
            if f["kind"] not in SHADED
        ]  # fmt: skip
        kills = sum(1 for f in mine if f["kind"] == "SIGKILL")
        windows = [
            {"start": f["at_s"], "end": f.get("continued_at_s", f.get("until_s", elapsed)),
             "color": FAULT_COLORS[f["kind"]], "title": fault_title(f, 3)}
            for f in mine
            if f["kind"] in SHADED
        ]  # fmt: skip
        stops = 0
        for f in deploys:
            marks, grace = deploy_marks(f, slot, elapsed)
            dots += marks
            windows += grace
            stops += len(grace)
        label = (
            f"slot {slot} ({len(workers):,} processes, {kills:,} kill{'' if kills == 1 else 's'}"
            + (f", {stops} deployed" if stops else "")
            + ")"
        )
        lanes.append({"label": label, "spans": spans, "dots": dots, "windows": windows,
                      "spans_are": "processes, one after another,"})  # fmt: skip
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
         fault_title(f, 3))
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
