"""``crashqueuelab deploys``: workers stopped as every process manager stops them (a
signal, a grace period, then SIGKILL), each running the library's own worker or the lab's
(``lab.deploys``)."""

from __future__ import annotations

import argparse
from typing import Any

from crashqueuelab.cli.common import (
    EXIT_OK,
    EXIT_REJECTED,
    Command,
    add_system,
    non_negative,
    positive,
    positive_number,
    seconds,
)
from crashqueuelab.cli.pages import html_report
from crashqueuelab.cli.progress import progress_for
from crashqueuelab.lab.deploys.plan import (
    AT_STOP_S,
    LONG_SHARE,
    SCHEDULER_POLL_S,
    DeployPlan,
    StopSignal,
    StopWhen,
)
from crashqueuelab.lab.deploys.run import DEFAULT_LEASE_S, DEPLOYS_FILE, run_deploys
from crashqueuelab.lab.faults.deploy import Replace

_DEFAULTS = DeployPlan()


def plan_of(args: argparse.Namespace) -> DeployPlan:
    """The deploy plan the command line's options describe."""
    return DeployPlan(
        workers=args.workers,
        deploys=args.deploys,
        grace_s=args.grace_s,
        surge=args.surge,
        replace=Replace(args.replace),
        fleet_restarts=args.fleet_restarts,
        signal=StopSignal(args.signal),
        jobs=args.jobs,
        seed=args.seed,
        interval_s=args.interval_s,
        long_share=args.long_share,
        warmup_s=args.warmup_s,
        scheduled=args.scheduled,
        due_tolerance_s=args.due_tolerance_s,
        failovers=args.failovers,
        promote_after_s=args.promote_after_s,
        server_restarts=args.server_restarts,
        submit_until_s=args.submit_until_s,
        submit_at_stops=args.submit_at_stops,
        stop_when=StopWhen(args.stop_when),
    )


def _deploys(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    plan = plan_of(args)
    record = run_deploys(
        args.output_directory,
        system=args.system,
        plan=plan,
        lease_s=args.lease_s,
        recovery_wait_s=args.recovery_wait_s,
        progress=progress_for(args),
        # A replicated server the command line started for --failovers, or none.
        fail_over=getattr(args.server, "failover", None),
        # The server the command line started for the run (a library on RabbitMQ: its
        # node), or none (--dsn, or a node the environment names).
        restart_server=getattr(args.server, "restart_after_crash", None),
    )
    reasons = list(record["anomalies"])
    if record["error"]:
        reasons.insert(0, f"{record['error']['type']}: {record['error']['message']}")
    promises = record["promises"]
    headline = record["headline"]
    if promises is not None and promises.get("declared"):
        # A library's users read first whether it kept its own promises, then the counts.
        kept = "keeps" if promises["keeps_its_promises"] else "breaks"
        headline = f"{kept} its own promises: {headline}"
    return (EXIT_OK if record["ok"] else EXIT_REJECTED), {
        "ok": record["ok"],
        "headline": headline,
        "reasons": reasons,
        "system": record["system"]["version"],
        "worker": record["worker"]["describe"],
        "plan": record["plan"],
        "recovery": record["recovery"],
        "jobs": {
            key: {name: job[name] for name in ("runs", "completed", "stored")}
            for key, job in record["jobs"].items()
        },
        "scheduled": {
            "tolerance_s": record["scheduled"]["tolerance_s"],
            "on_time": record["scheduled"]["on_time"],
            "jobs": {
                key: {name: job[name] for name in ("due_s", "starts_s", "verdict")}
                for key, job in record["scheduled"]["jobs"].items()
            },
        },
        "workers": {
            worker["name"]: {
                "exit": worker["exit"],
                "exited_within_grace": worker["exited_within_grace"],
                "held_when_killed": worker["held_when_killed"],
            }
            for worker in record["workers"]
        },
        "promises": None
        if promises is None
        else {key: promises[key] for key in ("keeps_its_promises", "verdict", "broken_promises")},
        "timings": record["timings"],
        **(
            {
                "failovers": record["failovers"],
                "restarted_after_exit": record["restarted_after_exit"],
            }
            if "failovers" in record
            else {}
        ),
        **(
            {
                "server_restarts": record["server_restarts"],
                "restarted_after_exit": record["restarted_after_exit"],
            }
            if "server_restarts" in record
            else {}
        ),
        "deploys_report": str(args.output_directory / DEPLOYS_FILE),
        "report": html_report(args.output_directory, args.stderr),
    }


def add_deploys_command(command: Command) -> None:
    sub = command(
        "deploys",
        _deploys,
        "stop workers as a deploy does (a signal, a grace period, then SIGKILL of every"
        " process of its session), each running the library's own worker (System.own_worker) or the"
        " lab's: is any job lost, run twice, or run beside a live holder?",
        database=False,
    )
    add_system(sub)
    sub.add_argument(
        "--workers", type=positive, default=_DEFAULTS.workers, help="worker processes; default 2"
    )
    sub.add_argument(
        "--deploys",
        type=non_negative,
        default=_DEFAULTS.deploys,
        help="rolling deploys, each stopping every worker, --surge at a time; default 2",
    )
    sub.add_argument(
        "--grace-s",
        type=positive_number,
        default=_DEFAULTS.grace_s,
        help="from the stop signal to the SIGKILL of a worker still there; default 1",
    )
    sub.add_argument(
        "--surge",
        type=positive,
        default=_DEFAULTS.surge,
        help="workers stopped at once in a rolling deploy; default 1",
    )
    sub.add_argument(
        "--interval-s",
        type=positive_number,
        default=None,
        help="between one batch's stop signal and the next; default the grace period + 1 s",
    )
    sub.add_argument(
        "--warmup-s",
        type=seconds,
        default=_DEFAULTS.warmup_s,
        help="from the start to the first stop signal (the first workers start, jobs are"
        f" submitted); default {_DEFAULTS.warmup_s:g}",
    )
    sub.add_argument(
        "--submit-until-s",
        type=positive_number,
        default=None,
        help="the jobs not submitted at the start are submitted evenly until then (seconds"
        " from the start, at most the last stop signal; not with server faults); default the"
        " last stop signal, so that one arrives at it (past the last server fault with"
        " --failovers or --server-restarts)",
    )
    sub.add_argument(
        "--submit-at-stops",
        type=non_negative,
        default=0,
        help="this many jobs right after each stop's signals, within"
        f" {AT_STOP_S:g} s of them (a stopped worker may still hold a fetch open); of the"
        " others half at the start, the rest evenly; not with --submit-until-s or server"
        " faults; default 0",
    )
    sub.add_argument(
        "--replace",
        choices=[mode.value for mode in Replace],
        default=_DEFAULTS.replace.value,
        help="start a stopped worker's replacement at once (default) or after it exited",
    )
    sub.add_argument(
        "--stop-when",
        choices=[mode.value for mode in StopWhen],
        default=_DEFAULTS.stop_when.value,
        help="send each stop signal when it falls due (default), or from then on once the"
        " worker it stops holds a job with more than the grace period of its work left"
        " (mid-job), at most one interval later: a worker SIGKILLed mid-job every run, not"
        " only when the schedule meets a long job",
    )
    sub.add_argument(
        "--fleet-restarts",
        type=non_negative,
        default=0,
        help="after the rolling deploys, stop every worker at once this often; default 0",
    )
    sub.add_argument(
        "--signal",
        choices=[mode.value for mode in StopSignal],
        default=_DEFAULTS.signal.value,
        help="the stop signal: SIGTERM (default), SIGINT, SIGQUIT, or SIGTERM-twice (a"
        " second SIGTERM half a grace period after the first)",
    )
    sub.add_argument("--jobs", type=positive, default=_DEFAULTS.jobs, help="default 8")
    sub.add_argument(
        "--long-share",
        type=float,
        default=LONG_SHARE,
        help=f"the share of jobs longer than the grace period; default {LONG_SHARE:g}",
    )
    sub.add_argument(
        "--scheduled",
        type=non_negative,
        default=_DEFAULTS.scheduled,
        help="how many of the jobs are scheduled, due later (through the library's own"
        " scheduling call, or on the lab's queues held by the retry delay), due at seeded"
        " times inside and after the grace windows; each must start once, not before it is"
        " due and within --due-tolerance-s after; default 0",
    )
    sub.add_argument(
        "--due-tolerance-s",
        type=positive_number,
        default=None,
        help="how late a scheduled job may start; default"
        f" {SCHEDULER_POLL_S:g} s (procrastinate's polling interval, the longest a library's"
        " worker takes to notice a due job) + the grace period + the longest job's work",
    )
    sub.add_argument(
        "--lease-s",
        type=positive_number,
        default=None,
        help="the lab's own worker's lease (a system without a worker of its own);"
        f" default {DEFAULT_LEASE_S:g} s where it heartbeats, else longer than the longest job",
    )
    sub.add_argument(
        "--failovers",
        type=non_negative,
        default=0,
        help="failovers of the system's PostgreSQL server, each half an interval after a stop"
        " (or, without deploys, an interval apart): a primary and a streaming standby at"
        " synchronous_commit=on the run starts, the primary killed, the standby promoted, the"
        " clients moved to it; a worker that exits by itself is started again, as a process"
        " manager does",
    )
    sub.add_argument(
        "--promote-after-s",
        type=seconds,
        default=0.0,
        help="--failovers: how long no server answers between the primary's death and the"
        " standby's promotion (an HA manager's time to notice and decide; 0 by default)",
    )
    sub.add_argument(
        "--server-restarts",
        type=non_negative,
        default=0,
        help="crashes of the system's server, each half an interval after a stop (or, without"
        " deploys, an interval apart): every process of the server the run started SIGKILLed"
        " (the RabbitMQ node, for a library on RabbitMQ), then started again on what it kept;"
        " a worker that exits by itself is started again, as a process manager does",
    )
    sub.add_argument(
        "--recovery-wait-s",
        type=seconds,
        default=None,
        help="after the last stop, how long to wait at most for every job to run to"
        " completion; default: the lease or the library's timer (30 s), the longest job,"
        " the system's recovery time and 5 s",
    )
