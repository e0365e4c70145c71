"""The JSON command line: stdout carries exactly one JSON object, stderr the diagnostics.

An experiment ends with its one-line verdict on stderr, after the JSON, so the verdict is
the last thing a terminal shows. Exit codes are the named constants in ``cli.common`` and
are documented in docs/cli.md. The commands come in two groups, each in its own module:
the experiments (``cli.experiments``) and the operations on one queue database
(``cli.database``).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, TextIO

from crashqueuelab.cli.common import (
    EXIT_OK,
    EXIT_PASSED_WHAT_RAN,
    EXIT_REJECTED,
    EXIT_STORE,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    Handler,
    Parser,
    UsageError,
)
from crashqueuelab.cli.database import add_database_commands, add_database_options
from crashqueuelab.cli.deploys import add_deploys_command
from crashqueuelab.cli.diskfaults import add_disk_faults_command
from crashqueuelab.cli.experiments import (
    RUN_FILES,
    add_experiment_commands,
    add_experiment_options,
    add_report_command,
)
from crashqueuelab.cli.failover import add_failover_command
from crashqueuelab.cli.heartbeats import add_heartbeats_command
from crashqueuelab.cli.pages import html_report
from crashqueuelab.cli.pinned import pinned_label, pins_of, run_pinned
from crashqueuelab.cli.powercut import add_power_cut_command
from crashqueuelab.cli.shrink import add_shrink_command
from crashqueuelab.cli.verdict import verdict_line
from crashqueuelab.cli.versions import add_versions_command
from crashqueuelab.core.errors import (
    CrashModeUnavailable,
    CrashQueueLabError,
    InvalidInput,
    ServerUnavailable,
    StaleLease,
    StoreError,
    SystemUnavailable,
)
from crashqueuelab.lab.runs.interrupts import EXIT_INTERRUPTED, Interrupted, interruptible
from crashqueuelab.lab.runs.records import write_json
from crashqueuelab.lab.runs.servers import servers_for
from crashqueuelab.lab.runs.systemcalls import SystemRaised
from crashqueuelab.systems.registry import check_claims

__all__ = [
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_PASSED_WHAT_RAN",
    "EXIT_REJECTED",
    "EXIT_STORE",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "build_parser",
    "entry_point",
    "main",
]


def _version() -> str:
    from crashqueuelab import __version__

    python = sys.version.split()[0]
    return f"crashqueuelab {__version__} (Python {python}, SQLite {sqlite3.sqlite_version})"


def build_parser() -> argparse.ArgumentParser:
    """The whole command line; every subcommand sets ``handler``."""
    parser = Parser(
        prog="crashqueuelab",
        description="Fault-injection and invariant-testing laboratory for durable job queues.",
        epilog="Exit codes: 0 ok, 1 rejected or inconsistent, 2 bad input, 3 unusable database,"
        " 4 crash mode or server unavailable here, 5 passed what ran (some evidence did not"
        " run here: not_run says what and why), 130 interrupted (docs/cli.md).",
    )
    parser.add_argument("--version", action="version", version=_version())
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    def command(
        name: str, handler: Handler, help_text: str, *, database: bool = True
    ) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(handler=handler)
        if database:
            add_database_options(sub)
        else:
            add_experiment_options(sub)
        return sub

    add_experiment_commands(command)
    add_report_command(commands)
    add_shrink_command(commands)
    add_versions_command(command)
    add_heartbeats_command(command)
    add_deploys_command(command)
    add_disk_faults_command(command)
    add_failover_command(command)
    add_power_cut_command(command)
    add_database_commands(command)
    return parser


def _error(kind: str, message: str, **data: Any) -> dict[str, Any]:
    return {"ok": False, "error": {"type": kind, "message": message, **data}}


def _exit_code(error: CrashQueueLabError) -> int:
    if isinstance(error, CrashModeUnavailable | ServerUnavailable):
        return EXIT_UNAVAILABLE
    if isinstance(error, InvalidInput | SystemUnavailable):
        return EXIT_USAGE
    if isinstance(error, StoreError):
        return EXIT_STORE
    # StaleLease, IdempotencyConflict, JobNotFound: the queue said no.
    return EXIT_REJECTED


def _error_data(error: CrashQueueLabError) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for name in (
        "field",
        "job_id",
        "idempotency_key",
        "path",
        "missing",
        "differing",
        "spec",
        "mode",
        "reason",
        "mismatched_rows",
    ):
        if hasattr(error, name):
            value = getattr(error, name)
            data[name] = list(value) if isinstance(value, tuple) else value
    if isinstance(error, StaleLease):
        data["reason"] = error.reason.value
    return data


def _stopped(
    args: argparse.Namespace,
    stop: Interrupted | SystemRaised,
    started: float,
    err: TextIO,
    arguments: Sequence[str],
) -> dict[str, Any]:
    """The record of an experiment a signal or its system under test stopped, kept in its
    directory and printed: what it had done by then, and why it stopped."""
    seconds = round(time.monotonic() - started, 1)
    if isinstance(stop, Interrupted):
        seconds = round(stop.at - started, 1)
        why: dict[str, Any] = {"interrupted": True, "signal": stop.signal_name}
        reasons = [f"interrupted by {stop.signal_name} after {seconds} s"]
    else:
        why = {"system_raised": stop.to_json()}
        reasons = [stop.reason]
    reasons += stop.partial.pop("reasons", [])
    result: dict[str, Any] = {
        "ok": False,
        **why,
        "command": args.command,
        "arguments": list(arguments),
        "seed": getattr(args, "seed", None),
        "reasons": reasons,
        "stopped_after_s": seconds,
        **stop.partial,
    }
    directory: Path = args.output_directory
    run_file = RUN_FILES[args.command]
    if directory.is_dir():
        result["output_directory"] = str(directory)
        # A run interrupted after it wrote its whole record (while its page was being built)
        # keeps that record: only a run that had none gets this one.
        if not (directory / run_file).is_file():
            write_json(directory / run_file, result)
        result["report"] = html_report(directory, err)
    return result


def _verdict_line(args: argparse.Namespace | None, result: dict[str, Any]) -> str | None:
    """The one line an experiment (or any failed command) ends with on stderr."""
    experiment = args is not None and args.command in RUN_FILES
    record = None
    if args is not None and experiment and not result.get("error"):
        kept = args.output_directory / RUN_FILES[args.command]
        record = kept if kept.is_file() else None
    return verdict_line(result, record=record, experiment=experiment)


def _replicated_postgres() -> AbstractContextManager[Any]:
    """A primary and a streaming standby at ``synchronous_commit=on``, for a run that fails
    its server over (chaos ``--failovers``) or holds its COMMITs open (``--held-commits``)."""
    # Imported for such a run alone: it needs the postgres extra's client.
    from crashqueuelab.lab.failover.cluster import ReplicatedPostgres

    return ReplicatedPostgres("on")


def main(
    argv: Sequence[str] | None = None,
    *,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Run one command; return its exit code. Never raises for bad input."""
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    args: argparse.Namespace | None = None
    started = time.monotonic()
    try:
        args = build_parser().parse_args(argv)
        args.stderr = err
        handler: Handler = args.handler
        systems = getattr(args, "system", None)
        named = [systems] if isinstance(systems, str) else list(systems or ())
        # ``versions`` pins each of its releases itself (its --system may pin the library
        # whose dependency it varies).
        matrix = args.command == "versions"
        fixed = getattr(args, "with_", None) or ()
        if not matrix:
            # Before a pinned release's environment is made: a refusal makes nothing.
            check_claims([name.partition("==")[0] for name in named], args.command)
        pins = [] if matrix else pins_of(named, fixed)
        if not matrix and not pins and fixed and isinstance(systems, str):
            # Inside the pinned environment: the run records its system with what --with
            # fixed beside it, so that its reruns and reproducers go to this environment.
            args.system = pinned_label(systems, fixed)
        if pins:
            # The pinned run prints its own verdict line; this one only passes it on.
            code, result = run_pinned(pins[0], sys.argv[1:] if argv is None else argv, err)
            out.write(json.dumps(_verdict_first(result), indent=2) + "\n")
            out.flush()
            return code
        # A command that starts the servers it needs itself (failover) gets none from here.
        needing = [] if getattr(args, "own_servers", False) else named
        replicated = (
            _replicated_postgres
            if getattr(args, "failovers", 0) or getattr(args, "held_commits", 0)
            else None
        )
        with (
            interruptible(),
            servers_for(needing, getattr(args, "dsn", None), replicated=replicated) as server,
        ):
            args.server = server
            code, result = handler(args)
    except UsageError as error:
        code, result = EXIT_USAGE, _error("UsageError", str(error))
    except CrashQueueLabError as error:
        code, result = _exit_code(error), _error(error.kind, str(error), **_error_data(error))
    except sqlite3.Error as error:
        # Locked past the busy timeout, disk full, I/O error: the store could not serve.
        code, result = EXIT_STORE, _error("SQLiteError", f"{type(error).__name__}: {error}")
    except OSError as error:
        code, result = EXIT_STORE, _error("OSError", str(error))
    except (Interrupted, SystemRaised) as stop:
        code = EXIT_INTERRUPTED if isinstance(stop, Interrupted) else EXIT_REJECTED
        if args is not None and args.command in RUN_FILES:
            arguments = sys.argv[1:] if argv is None else argv
            result = _stopped(args, stop, started, err, arguments)
        else:
            result = _error("Interrupted", str(stop)) | {"interrupted": True}
    out.write(json.dumps(_verdict_first(result), indent=2) + "\n")
    out.flush()
    line = _verdict_line(args, result)
    if line is not None:
        print(line, file=err, flush=True)
    return code


#: What a reader looks for first: the verdict, the page that explains it, the error.
_FIRST_KEYS = ("ok", "passed_what_ran", "headline", "report", "error", "reasons", "not_run")


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _sorted(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_sorted(item) for item in value]
    return value


def _verdict_first(result: dict[str, Any]) -> dict[str, Any]:
    """Keys in sorted order, except that the verdict and its explanations come first."""
    ordered = {key: _sorted(result[key]) for key in _FIRST_KEYS if key in result}
    return ordered | {key: _sorted(result[key]) for key in sorted(result) if key not in ordered}


def entry_point() -> None:
    """The console script."""
    sys.exit(main())
