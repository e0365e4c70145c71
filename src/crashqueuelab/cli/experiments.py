"""The experiments: each writes a new output directory (its JSON, its retained evidence and
its page) instead of using a database; and ``report``, which rebuilds a page."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from crashqueuelab.cli.common import (
    EXIT_OK,
    EXIT_REJECTED,
    SYSTEM_HELP,
    Command,
    add_crash_mode,
    add_dsn,
    add_shrink_seconds,
    add_system,
    non_negative,
    positive,
    positive_number,
)
from crashqueuelab.cli.network import add_network_faults, network_plan
from crashqueuelab.cli.pages import html_report
from crashqueuelab.cli.progress import progress_for
from crashqueuelab.cli.replay import ReplayAction
from crashqueuelab.cli.shrink import reproducer_lines
from crashqueuelab.cli.verdict import exit_code
from crashqueuelab.core.errors import InvalidInput
from crashqueuelab.lab.bench.peers import BENCH_PEERS
from crashqueuelab.lab.bench.report import BENCH_FILE, table
from crashqueuelab.lab.bench.runner import run_bench
from crashqueuelab.lab.campaign.run import CAMPAIGN_FILE, run_campaign
from crashqueuelab.lab.chaos.longjobs import DEFAULT_LONG_JOBS
from crashqueuelab.lab.chaos.poison import DEFAULT_POISON_JOBS
from crashqueuelab.lab.chaos.run import CHAOS_FILE, run_chaos
from crashqueuelab.lab.demo import DEFAULT_SEED, run_demo
from crashqueuelab.lab.failover.promises import LEVELS
from crashqueuelab.lab.faults.deploy import Replace, Rollout
from crashqueuelab.lab.mutants.runner import MUTANTS_FILE, run_mutants
from crashqueuelab.lab.reproducers.campaign import shrink_if_failed
from crashqueuelab.lab.reproducers.chaos import add_chaos_reproducer
from crashqueuelab.lab.runs.kinds import KINDS
from crashqueuelab.lab.runs.modes import CAMPAIGN_CRASH_MODES, FAILOVER, POWER_LOSS
from crashqueuelab.lab.showcase import run_showcase
from crashqueuelab.systems.registry import DEFAULT_SYSTEM, SHIPPED

#: The file each experiment writes into its output directory: the record of its run.
RUN_FILES = {kind.command: kind.record for kind in KINDS}


def _report(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from crashqueuelab.lab.pages.render import write_report

    directory: Path = args.directory
    if not directory.is_dir():
        raise InvalidInput("directory", f"{directory} is not a directory")
    path = write_report(directory)
    return EXIT_OK, {"ok": True, "report": str(path)}


def _demo(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    comparison = run_demo(args.output_directory, seed=args.seed, system=args.system)
    ok = all(comparison[name]["invariants_ok"] for name in ("idempotent", "non_idempotent"))
    return (EXIT_OK if ok else EXIT_REJECTED), {
        "ok": ok,
        "report": html_report(args.output_directory),
        "comparison": comparison,
        "output_directory": str(args.output_directory),
    }


def library_verdict(report: dict[str, Any]) -> dict[str, Any]:
    """For a library that documents its weaknesses, its verdict against its own promises:
    the run's headline (what its users read first, before the lab's contract) and the
    record's ``promises`` in short; nothing for a system that documents none."""
    promises = report.get("promises")
    if not promises or not promises.get("declared"):
        return {}
    return {
        "headline": promises["verdict"],
        "promises": {
            "keeps_its_promises": promises["keeps_its_promises"],
            "verdict": promises["verdict"],
            "broken_promises": len(promises["broken_promises"]),
            "weaker_as_documented": [entry["what"] for entry in promises["weaker_as_documented"]],
        },
    }


def _campaign(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    failover = None
    if args.synchronous_commit is not None and args.crash_mode != FAILOVER:
        raise InvalidInput("synchronous_commit", f"a setting of --crash-mode {FAILOVER}")
    if args.crash_mode == FAILOVER:
        from crashqueuelab.lab.failover.targets import case_failover

        failover = case_failover(args.synchronous_commit or "on")
    report = run_campaign(
        args.output_directory,
        seed=args.seed,
        system=args.system,
        crash_mode=args.crash_mode,
        progress=progress_for(args),
        crash_points=args.crash_point,
        probes=args.probe,
        failover=failover,
        crash_states=args.crash_states,
    )
    shrink_if_failed(args.output_directory, report, args.shrink_seconds)
    return exit_code(report["ok"], report["passed_what_ran"]), {
        "ok": report["ok"],
        "passed_what_ran": report["passed_what_ran"],
        "complete": report["complete"],
        "not_run": report["not_run"],
        "report": html_report(args.output_directory),
        "system": report["system"],
        "crash_mode": report["crash_mode"],
        **({"failover": report["failover"]} if "failover" in report else {}),
        "seed": report["seed"],
        "summary": report["summary"],
        "anomalies": report["anomalies"],
        "reasons": report["anomalies"],
        "campaign_report": str(args.output_directory / CAMPAIGN_FILE),
        "reproducers": reproducer_lines(report.get("shrink")),
        **library_verdict(report),
    }


def _showcase(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    summary = run_showcase(
        args.output_directory,
        seed=args.seed,
        systems=args.system or list(SHIPPED),
        progress=progress_for(args),
        shrink_seconds=args.shrink_seconds,
        # Each part's page as it finishes: a run stopped later links every finished part.
        finished=lambda directory: html_report(directory, args.stderr),
    )
    report = html_report(args.output_directory)
    if not args.quiet:
        print(f"crashqueuelab: {summary['mutants']['line']}", file=args.stderr)
    return exit_code(summary["ok"], summary["passed_what_ran"]), {"report": report, **summary}


def _chaos(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    report = run_chaos(
        args.output_directory,
        seed=args.seed,
        jobs=args.jobs,
        workers=args.workers,
        kills=args.kills,
        pauses=args.pauses,
        lease_ms=args.lease_ms,
        batch=args.batch,
        system=args.system,
        crash_mode=args.crash_mode,
        power_cuts=args.power_cuts,
        server_restarts=args.server_restarts,
        session_kills=args.session_kills,
        poison_count=args.poison_jobs,
        long_count=args.long_jobs,
        restart_server=None if args.server is None else args.server.restart_after_crash,
        failovers=args.failovers,
        fail_over=getattr(args.server, "fail_over_lagging", None),
        held_commits=args.held_commits,
        hold_commits=getattr(args.server, "hold_commits", None),
        progress=progress_for(args),
        schedule=args.schedule,
        replay_of=args.replay_of,
        network=network_plan(args),
        deploys=args.deploys,
        rollout=Rollout(grace_s=args.grace_s, surge=args.surge, replace=Replace(args.replace)),
    )
    if not report["ok"] and args.shrink_seconds > 0:
        add_chaos_reproducer(args.output_directory, report, args.shrink_seconds)
    return (EXIT_OK if report["ok"] else EXIT_REJECTED), {
        key: report[key]
        for key in (
            "ok", "reasons", "system", "crash_mode", "notes", "seed", "parameters",
            "kills_delivered", "pauses_delivered", "power_cuts_delivered",
            "server_restarts_delivered", "failovers_delivered", "session_kills_delivered",
            "network_faults_delivered",
            "deploys_delivered", "deploys", "pauses_with_takeover", "pauses_fenced", "respawns",
            "accounting", "anomalies", "timings",
        )
    } | {
        "chaos_report": str(args.output_directory / CHAOS_FILE),
        "reproducers": reproducer_lines(report.get("shrink")),
        "report": html_report(args.output_directory),
        **library_verdict(report),
        # Where the run had them.
        **{key: report[key] for key in ("held_commits_delivered",) if key in report},
    }  # fmt: skip


def _mutants(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    report = run_mutants(
        args.output_directory,
        seed=args.seed,
        names=args.mutant,
        seeds=args.seeds,
        jobs=args.jobs,
        kills=args.kills,
        pauses=args.pauses,
        power_cuts=args.power_cuts,
        named_evidence=args.named_evidence,
        progress=progress_for(args),
        shrink_seconds=args.shrink_seconds,
    )
    return exit_code(report["ok"], report["passed_what_ran"]), {
        key: report[key]
        for key in (
            "ok", "passed_what_ran", "complete", "reasons", "caught", "total", "not_run",
            "missed", "seeds", "evidence", "mutants",
        )
    } | {
        "mutants_report": str(args.output_directory / MUTANTS_FILE),
        "report": html_report(args.output_directory),
    }  # fmt: skip


def _bench(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    report = run_bench(
        args.output_directory,
        jobs=args.jobs,
        workers=args.workers,
        work_ms=args.work_ms,
        systems=args.system or [DEFAULT_SYSTEM],
        batch=args.batch,
        progress=progress_for(args),
        peers=args.peer or [],
        repeat=args.repeat,
    )
    args.stderr.write(table(report["cells"]) + "\n")
    return (EXIT_OK if report["ok"] else EXIT_REJECTED), {
        "ok": report["ok"],
        "report": html_report(args.output_directory),
        "reasons": report["reasons"],
        "systems": report["systems"],
        "disk": report["disk"],
        "targets": report["targets"],
        "bench_report": str(args.output_directory / BENCH_FILE),
    }


def _batch_size(text: str) -> int | None:
    if text == "adaptive":
        return None
    try:
        return positive(text)
    except argparse.ArgumentTypeError as error:
        raise argparse.ArgumentTypeError(
            f"{error}; give a positive integer or 'adaptive'"
        ) from None


def _numbers(text: str, convert: Callable[[str], float], minimum: float) -> list[float]:
    try:
        values = [convert(part) for part in text.split(",") if part]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list") from None
    if not values or min(values) < minimum:
        raise argparse.ArgumentTypeError(f"every value must be at least {minimum:g}")
    return values


def _int_list(text: str) -> list[int]:
    return [int(value) for value in _numbers(text, int, 1)]


def _float_list(text: str) -> list[float]:
    return _numbers(text, float, 0)


def add_experiment_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output-directory", type=Path, required=True, help="a new or empty directory"
    )
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="fixes order and ids")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def add_deploy_options(parser: argparse.ArgumentParser) -> None:
    """Chaos's deploys: SIGTERM to a batch of workers, a grace period, then SIGKILL."""
    parser.add_argument(
        "--deploys",
        type=non_negative,
        default=0,
        help="deploys spread over the work: each SIGTERMs --surge workers, which finish and"
        " acknowledge the batch in hand and exit 0; one still there after --grace-s gets"
        " SIGKILL, every process of its session; a replacement starts as --replace says",
    )
    parser.add_argument(
        "--grace-s",
        type=positive_number,
        default=Rollout.grace_s,
        help="a deployed worker's grace period, from its SIGTERM to the SIGKILL",
    )
    parser.add_argument(
        "--surge", type=positive, default=Rollout.surge, help="workers each deploy stops at once"
    )
    parser.add_argument(
        "--replace",
        choices=[str(each) for each in Replace],
        default=str(Rollout.replace),
        help="start a deployed worker's replacement with its SIGTERM (at-once) or once it"
        " exited or was killed (after-exit)",
    )


def _add_server_faults(sub: argparse.ArgumentParser) -> None:
    """chaos's faults of the system's server: restarts, failovers, ended sessions."""
    sub.add_argument(
        "--server-restarts",
        type=non_negative,
        default=0,
        help="stop the system's server with pg_ctl stop -m immediate and start it again this"
        " often (postgres, on the server the run started)",
    )
    sub.add_argument(
        "--failovers",
        type=non_negative,
        default=0,
        help="fail the server over this often (postgres systems): the run starts a primary and"
        " a streaming standby at synchronous_commit=on, and each failover kills the primary"
        " while the standby lags, promotes the standby and moves the workers' address to it",
    )
    sub.add_argument(
        "--held-commits",
        type=non_negative,
        default=0,
        help="hold the COMMITs open this often (postgres systems): the run starts a primary and"
        " a streaming standby at synchronous_commit=on; each time the standby stops answering,"
        " every worker's connection is reset while COMMITs wait for it, then it catches up",
    )
    sub.add_argument(
        "--session-kills",
        type=non_negative,
        default=0,
        help="end a worker's database session with pg_terminate_backend this often (postgres)",
    )


def _add_campaign_options(sub: argparse.ArgumentParser) -> None:
    """campaign's system, crash mode and what of it to run."""
    add_system(sub)
    add_crash_mode(sub, CAMPAIGN_CRASH_MODES)
    sub.add_argument(
        "--synchronous-commit",
        choices=LEVELS,
        default=None,
        help=f"with --crash-mode {FAILOVER}: the primary's level (default on); off and local"
        " do not wait for the standby, which each case then holds back",
    )
    sub.add_argument(
        "--crash-point",
        action="append",
        help="run only this crash point (repeat for several; default: every one)",
    )
    sub.add_argument(
        "--crash-states",
        type=positive,
        default=None,
        help=f"with --crash-mode {POWER_LOSS}: judge at most this many crash states per case"
        " (lose-all first; default: every one, 3 for a system on RabbitMQ, each state booting"
        " a node); the report names the choices left",
    )
    sub.add_argument(
        "--probe",
        action="append",
        help="run only this fencing probe (repeat for several), with no crash point unless"
        " --crash-point names some and no model workload: a failing probe's rerun",
    )


def add_experiment_commands(command: Command) -> None:
    """The experiments: they write an output directory instead of using a database."""
    sub = command(
        "showcase",
        _showcase,
        "run the effect experiment and the fault campaign; print the evidence summary",
        database=False,
    )
    sub.add_argument(
        "--system",
        action="append",
        help=f"repeat for several (default: every shipped one): {SYSTEM_HELP}",
    )
    add_dsn(sub)
    add_shrink_seconds(sub)
    sub = command(
        "demo",
        _demo,
        "crash after an effect commit, before acknowledgement: idempotent vs not",
        database=False,
    )
    add_system(sub)
    sub = command(
        "campaign",
        _campaign,
        "kill a child process with os._exit at each crash point of a system; run the probes",
        database=False,
    )
    _add_campaign_options(sub)
    add_shrink_seconds(sub)
    sub = command(
        "chaos",
        _chaos,
        "SIGKILL and SIGSTOP real worker processes at random; count lost and duplicated work",
        database=False,
    )
    sub.add_argument("--jobs", type=positive, default=3000, help="jobs submitted before the run")
    sub.add_argument(
        "--workers", type=positive, default=4, help="worker processes (respawned when killed)"
    )
    sub.add_argument(
        "--kills", type=non_negative, default=300, help="SIGKILLs, spread over the work"
    )
    sub.add_argument(
        "--pauses",
        type=non_negative,
        default=5,
        help="SIGSTOPs, each held until the worker's leases were taken over or expired",
    )
    sub.add_argument("--lease-ms", type=positive, default=500, help="each claim's lease")
    sub.add_argument(
        "--batch",
        type=positive,
        default=4,
        help="jobs a worker claims and acknowledges at once (1: the single calls)",
    )
    add_system(sub)
    add_crash_mode(sub)
    sub.add_argument(
        "--power-cuts",
        type=non_negative,
        default=0,
        help="with --crash-mode power-loss: cut the power this often (every process dies)",
    )
    sub.add_argument(
        "--poison-jobs",
        type=non_negative,
        default=DEFAULT_POISON_JOBS,
        help="jobs besides --jobs whose every attempt dies or fails, with limits of 2 and 3"
        " attempts: each must end dead-lettered after exactly its limit",
    )
    sub.add_argument(
        "--long-jobs",
        type=non_negative,
        default=DEFAULT_LONG_JOBS,
        help="jobs among --jobs whose handler works 2.5 leases and heartbeats meanwhile"
        " (systems with heartbeats): a heartbeat must keep the lease, in every process",
    )
    sub.add_argument(
        "--replay",
        action=ReplayAction,
        metavar="DIR",
        help="deliver DIR's recorded fault schedule again, with its seed, system and sizes"
        " (the processes' interleaving may differ); options after it override the sizes",
    )
    sub.set_defaults(schedule=None, replay_of=None)
    add_shrink_seconds(sub)
    _add_server_faults(sub)
    add_deploy_options(sub)
    add_network_faults(sub)
    sub = command(
        "mutants",
        _mutants,
        "run planted bugs of the shipped systems through the campaign and chaos; what caught each",
        database=False,
    )
    sub.add_argument("--mutant", action="append", help="only this one (repeatable)")
    sub.add_argument(
        "--seeds", type=positive, default=2, help="seeds from --seed on; each one must catch"
    )
    sub.add_argument("--jobs", type=positive, default=300, help="jobs of each chaos run")
    sub.add_argument("--kills", type=non_negative, default=15, help="SIGKILLs of each chaos run")
    sub.add_argument("--pauses", type=non_negative, default=2, help="SIGSTOPs of each chaos run")
    sub.add_argument("--power-cuts", type=non_negative, default=2, help="of each chaos run")
    sub.add_argument(
        "--named-evidence",
        action="store_true",
        help="each mutant only through the evidence the catalog names for it (quick)",
    )
    add_shrink_seconds(sub)
    sub = command(
        "bench",
        _bench,
        "throughput, latency and fairness against a textbook queue, side by side",
        database=False,
    )
    sub.add_argument("--jobs", type=positive, default=2000, help="jobs of each cell's run")
    sub.add_argument(
        "--repeat",
        type=positive,
        default=1,
        help="run every cell N times, interleaved; a cell shows its median run and the spread",
    )
    sub.add_argument(
        "--workers",
        type=_int_list,
        default=[1, 2, 4, 8, 16],
        help="comma-separated worker counts, one column of cells each",
    )
    sub.add_argument(
        "--work-ms",
        type=_float_list,
        default=[0.0, 1.0],
        help="comma-separated milliseconds of work per job, one row of cells each",
    )
    sub.add_argument(
        "--batch",
        type=_batch_size,
        default=None,
        help="jobs per batch of the batched path, or 'adaptive' (the default): each worker"
        " sizes its batches from the commit and work times it measures",
    )
    sub.add_argument(
        "--system",
        action="append",
        help=f"repeat to put systems side by side with the textbook queue: {SYSTEM_HELP}",
    )
    sub.add_argument(
        "--peer",
        action="append",
        help="repeat to add a peer library, driven through its own calls (the peers extra):"
        f" {', '.join(BENCH_PEERS)}",
    )
    add_dsn(sub)


def add_report_command(commands: Any) -> None:
    help_text = "(re)build DIR/report.html from a run's retained files (needs the reports extra)"
    sub = commands.add_parser("report", help=help_text, description=help_text)
    sub.set_defaults(handler=_report)
    sub.add_argument(
        "directory",
        type=Path,
        help=f"a run's output directory (of {', '.join(kind.command for kind in KINDS)})",
    )
