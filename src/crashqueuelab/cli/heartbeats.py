"""``crashqueuelab heartbeats``: does a live worker keep the job it is running, under the
library's own worker loop (``lab.heartbeats``)?"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from crashqueuelab.cli.common import (
    EXIT_OK,
    EXIT_REJECTED,
    Command,
    add_system,
    milliseconds,
    non_negative,
    positive,
    positive_number,
    timers,
)
from crashqueuelab.cli.pages import html_report
from crashqueuelab.cli.progress import progress_for
from crashqueuelab.lab.faults.network.plan import NetworkPlan
from crashqueuelab.lab.heartbeats.faults import STRIKE_AFTER_TIMERS, WINDOW_TIMERS
from crashqueuelab.lab.heartbeats.run import (
    DEFAULT_JOBS,
    DEFAULT_WORK_TIMERS,
    DEFAULT_WORKERS,
    HEARTBEATS_FILE,
    run_heartbeats,
)


def _heartbeats(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:

    record = run_heartbeats(
        args.output_directory,
        system=args.system,
        jobs=args.jobs,
        workers=args.workers,
        work_timers=args.work_timers,
        retry_after_s=args.retry_timer_s,
        network=NetworkPlan(
            stalls=args.stalls,
            partitions=args.partitions,
            latency_ms=args.latency_ms,
            window_ms=args.network_fault_ms,
        ),
        strike_after_timers=args.network_fault_after_timers,
        pauses_then_stops=args.pauses_then_stops,
        after=args.after_run,
        progress=progress_for(args),
    )
    reasons = list(record["anomalies"])
    if record["error"]:
        reasons.insert(0, f"{record['error']['type']}: {record['error']['message']}")
    return (EXIT_OK if record["ok"] else EXIT_REJECTED), {
        "ok": record["ok"],
        "reasons": reasons,
        "system": record["system"]["version"],
        "library_worker": record["library_worker"],
        "parameters": record["parameters"],
        "jobs": record["jobs"],
        "promises": None
        if record["promises"] is None
        else {
            key: record["promises"][key]
            for key in ("keeps_its_promises", "verdict", "broken_promises")
        },
        "pauses_delivered": len((record["pauses"] or {}).get("delivered", [])),
        "network_faults_delivered": [
            entry["kind"] for entry in (record["network"] or {}).get("delivered", [])
        ],
        "upgrade": None
        if record["upgrade"] is None
        else {key: record["upgrade"][key] for key in ("from", "exercised", "left", "left_jobs")},
        "timings": record["timings"],
        "heartbeats_report": str(args.output_directory / HEARTBEATS_FILE),
        "report": html_report(args.output_directory, args.stderr),
    }


def add_heartbeats_command(command: Command) -> None:
    sub = command(
        "heartbeats",
        _heartbeats,
        "run long jobs on the library's own worker loop, no worker harmed: is any job handed"
        " out again while its live holder runs it? (any system with a library_worker:"
        " pgqueuer's and dramatiq's are shipped)",
        database=False,
    )
    add_system(sub)
    sub.add_argument("--jobs", type=positive, default=DEFAULT_JOBS, help=f"default {DEFAULT_JOBS}")
    sub.add_argument(
        "--workers",
        type=positive,
        default=DEFAULT_WORKERS,
        help=f"worker processes, each running the library's loop; default {DEFAULT_WORKERS}",
    )
    sub.add_argument(
        "--work-timers",
        type=positive_number,
        default=DEFAULT_WORK_TIMERS,
        help="how long each job works, in the library's retry timers;"
        f" default {DEFAULT_WORK_TIMERS:g}",
    )
    sub.add_argument(
        "--retry-timer-s",
        type=positive_number,
        default=None,
        help="the library's retry timer (pgqueuer: the entrypoint's retry_timer before 1.0,"
        " run's heartbeat_timeout from 1.0), in seconds; default: the lab's setting for the"
        " library (pgqueuer: 1)",
    )
    sub.add_argument(
        "--pauses-then-stops",
        type=non_negative,
        default=0,
        help="freeze (SIGSTOP) the worker running the oldest job for the fault window, then"
        " thaw it and stop it (SIGTERM, as a deploy does), this often; one at a time, once a"
        " job has worked --network-fault-after-timers; default 0",
    )
    sub.add_argument(
        "--after-run",
        type=Path,
        default=None,
        metavar="DIR",
        help="run on the store the heartbeat run in DIR left (a system on a Redis server:"
        " the same server, which the run that started both keeps, and the same queue); this"
        " run's jobs are numbered after that run's, and what that run left in the store is"
        " read first and named as its own (versions --upgrade-from passes it)",
    )
    group = sub.add_argument_group(
        "network faults (postgres: each worker reaches the server through a fault proxy on"
        " 127.0.0.1; one fault at a time, once a job has worked half a retry timer)"
    )
    group.add_argument(
        "--stalls",
        type=non_negative,
        default=0,
        help="hold the connection of the worker running the oldest job this often (bytes"
        " kept, nothing closed); default 0",
    )
    group.add_argument(
        "--partitions",
        type=non_negative,
        default=0,
        help="hold every worker's connection, new ones hanging, this often; default 0",
    )
    group.add_argument(
        "--latency-ms",
        type=milliseconds,
        default=0.0,
        help="delay every byte to and from the server by this many milliseconds; default 0",
    )
    group.add_argument(
        "--network-fault-ms",
        type=milliseconds,
        default=None,
        help=f"how long each stall or partition lasts (default: {WINDOW_TIMERS:g} retry timers)",
    )
    group.add_argument(
        "--network-fault-after-timers",
        type=timers,
        default=STRIKE_AFTER_TIMERS,
        help="how long a job has worked, in retry timers, before a fault strikes its worker;"
        f" default {STRIKE_AFTER_TIMERS:g}",
    )
