"""``crashqueuelab shrink DIR``: a retained campaign's failures (or a chaos run's schedule)
shrunk to their smallest reruns and exported as pytest files, as a campaign or a chaos run
does at its end unless told not to."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from crashqueuelab.cli.common import (
    EXIT_OK,
    EXIT_PASSED_WHAT_RAN,
    EXIT_REJECTED,
    SYSTEM_HELP,
    seconds,
)
from crashqueuelab.cli.pages import html_report
from crashqueuelab.core.errors import InvalidInput
from crashqueuelab.lab.reproducers.campaign import REPRODUCER_DIRECTORY, SHRINK_SECONDS
from crashqueuelab.lab.reproducers.export import said


def reproducer_lines(shrink: Mapping[str, Any] | None) -> list[str]:
    """One line per reproducer, the bugs first: what it shows (a documented weakness says
    so), how much smaller it is, how often it failed when rerun, and its test file."""
    lines = []
    records = (shrink or {}).get("reproducers", [])
    for record in sorted(records, key=lambda record: bool(record.get("documented"))):
        name = record["name"]
        if record.get("documented"):
            name = f"documented weakness, {name}"
        if not record["shrunk"]:
            lines.append(f"{name}: not shrunk ({record['reason']})")
            continue
        lines.append(
            f"{name}: {record['before']['what']} -> {record['after']['what']};"
            f" failed {record['reproduced']} of {record['confirmations']} reruns;"
            f" {record['test_file']} ({said(record['test_run'])})"
        )
    return lines


def _shrink(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from crashqueuelab.lab.campaign.run import CAMPAIGN_FILE
    from crashqueuelab.lab.chaos.run import CHAOS_FILE
    from crashqueuelab.lab.reproducers.campaign import add_reproducers
    from crashqueuelab.lab.reproducers.chaos import add_chaos_reproducer

    directory: Path = args.directory
    record = next(
        (directory / name for name in (CAMPAIGN_FILE, CHAOS_FILE) if (directory / name).is_file()),
        None,
    )
    if record is None:
        raise InvalidInput(
            "directory",
            f"{directory} holds neither {CAMPAIGN_FILE} nor {CHAOS_FILE}: shrink takes a"
            " campaign's or a chaos run's directory",
        )
    report = json.loads(record.read_text(encoding="utf-8"))
    if report["ok"]:
        return EXIT_OK, {"ok": True, "detail": "the run is ok: nothing to shrink"}
    if report.get("passed_what_ran"):
        # Nothing that ran failed; what did not run is no failure to shrink.
        return EXIT_PASSED_WHAT_RAN, {
            "ok": False,
            "passed_what_ran": True,
            "not_run": report.get("not_run", []),
            "detail": "nothing that ran failed: nothing to shrink",
        }
    if report.get("crash_mode") == "failover":
        raise InvalidInput(
            "directory",
            "a failover campaign is not shrunk: its page gives each failing case the command"
            " that runs its crash point alone",
        )
    existing = directory / REPRODUCER_DIRECTORY
    if existing.exists():
        raise InvalidInput(
            "directory",
            f"{existing} exists: this run was shrunk already (move it aside to shrink again)",
        )
    if record.name == CHAOS_FILE:
        add_chaos_reproducer(directory, report, args.shrink_seconds)
    else:
        add_reproducers(directory, report, args.shrink_seconds, args.correct_system)
    return EXIT_REJECTED, {
        "ok": False,
        "reproducers": reproducer_lines(report["shrink"]),
        "report": html_report(directory),
        "run_report": str(record),
    }


def add_shrink_command(commands: Any) -> None:
    help_text = (
        "shrink a retained campaign's failures to their smallest reruns; export each as a"
        " pytest file under DIR/reproducer"
    )
    sub = commands.add_parser("shrink", help=help_text, description=help_text)
    sub.set_defaults(handler=_shrink)
    sub.add_argument("directory", type=Path, help="a campaign's output directory")
    sub.add_argument(
        "--shrink-seconds",
        type=seconds,
        default=SHRINK_SECONDS,
        help=f"at most this long (default {SHRINK_SECONDS:g})",
    )
    sub.add_argument(
        "--correct-system",
        help=f"also run each exported test against this system, where it must pass: {SYSTEM_HELP}",
    )
