"""``crashqueuelab disk-faults``: each step of a small workload made while the disk answers
errors (EIO on fsync, write or read; ENOSPC), then a power cut (``lab.campaign.diskfaults``)."""

from __future__ import annotations

import argparse
from typing import Any

from crashqueuelab.cli.common import (
    EXIT_OK,
    EXIT_REJECTED,
    SYSTEM_HELP,
    Command,
    add_with,
    positive,
)
from crashqueuelab.cli.experiments import library_verdict
from crashqueuelab.cli.pages import html_report
from crashqueuelab.cli.progress import progress_for
from crashqueuelab.lab.campaign.diskfaults import ALL, RECORD_FILE, fault_names, run_disk_faults
from crashqueuelab.lab.faults.powerloss.faults import DISK_FAULTS
from crashqueuelab.systems.registry import DEFAULT_SYSTEM, resolve_system


def _disk_faults(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    # Both checked before the system is built or anything is written.
    faults = fault_names(args.disk_fault)
    system = resolve_system(args.system)
    record = run_disk_faults(
        system,
        faults,
        args.output_directory,
        path=args.path,
        count=args.count,
        seed=args.seed,
        spec=args.system,
        progress=progress_for(args),
    )
    return (EXIT_OK if record["ok"] else EXIT_REJECTED), {
        "ok": record["ok"],
        "headline": record["headline"],
        "reasons": record["reasons"],
        "system": record["system"]["version"],
        "disk_faults": record["disk_faults"],
        "summary": record["summary"],
        "cases": [
            {key: case[key] for key in ("disk_fault", "step", "verdict", "told", "anomalies")}
            for case in record["cases"]
        ],
        "anomalies": record["anomalies"],
        "found_without_the_fault": record["found_without_the_fault"],
        "wall_s": record["wall_s"],
        "disk_faults_report": str(args.output_directory / RECORD_FILE),
        "report": html_report(args.output_directory, args.stderr),
        # A library's users read first whether it kept its own promises.
        **library_verdict(record),
    }


def add_disk_faults_command(command: Command) -> None:
    sub = command(
        "disk-faults",
        _disk_faults,
        "make each step of a small workload while the disk answers an error (EIO on fsync,"
        " write or read; ENOSPC), then cut the power: is the caller ever told success for"
        " what the disk lost? (Linux FUSE; exit 4 where unavailable)",
        database=False,
    )
    sub.add_argument("--system", default=DEFAULT_SYSTEM, help=SYSTEM_HELP)
    add_with(sub)
    sub.add_argument(
        "--disk-fault",
        action="append",
        required=True,
        metavar="FAULT",
        help=f"{', '.join(DISK_FAULTS)}, or {ALL} for every one; repeat for several",
    )
    sub.add_argument(
        "--count",
        type=positive,
        default=None,
        help="fail only the first N matching operations of the faulted call (default: every"
        " one until it returns)",
    )
    sub.add_argument(
        "--path",
        default="*",
        help="a glob of the disk's paths the fault hits, relative to its mount (*.log:"
        " walqueue's segments)",
    )
