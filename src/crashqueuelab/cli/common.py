"""What every command group shares: exit codes, the parser that raises instead of exiting,
argument types, and the options several commands take."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from crashqueuelab.core.clock import MAX_TIME_US
from crashqueuelab.lab.reproducers.campaign import SHRINK_SECONDS
from crashqueuelab.lab.runs.modes import CRASH_MODES, FAILOVER, PROCESS
from crashqueuelab.systems.registry import DEFAULT_SYSTEM, DISTRIBUTIONS, PEERS, SERVERS, SHIPPED

#: The command did what was asked, or the judged database passed.
EXIT_OK = 0
#: The queue refused the operation (stale lease, idempotency conflict, unknown job), or a
#: judge found the database inconsistent.
EXIT_REJECTED = 1
#: The command line or an argument was malformed; nothing was touched.
EXIT_USAGE = 2
#: The database cannot serve: missing, not SQLite, another schema, unprotected history.
EXIT_STORE = 3
#: This machine cannot provide the crash mode asked for (power loss needs Linux FUSE: the
#: message says what is missing); nothing was run.
EXIT_UNAVAILABLE = 4
#: Everything that ran passed, and some of the evidence asked for did not run (named in
#: ``not_run``, with why): never counted as passed, so never exit 0.
EXIT_PASSED_WHAT_RAN = 5

#: What a command's handler returns: its exit code and its JSON answer.
Handler = Callable[[argparse.Namespace], tuple[int, dict[str, Any]]]
#: Adds a subcommand: ``command(name, handler, help, database=...)``.
Command = Callable[..., argparse.ArgumentParser]


class UsageError(Exception):
    """Raised by the parser instead of printing usage and exiting."""


class HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default, unless it names one itself or has none."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or default is None
            or default is argparse.SUPPRESS
            or isinstance(default, bool)
            or action.required
            or not action.option_strings
        ):
            return text
        shown = ",".join(map(str, default)) if isinstance(default, list) else default
        return f"{text} (default: {shown})"


class Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def time_us(text: str) -> int:
    value = non_negative(text)
    if value > MAX_TIME_US:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_TIME_US} microseconds")
    return value


def _finite_non_negative(text: str, unit: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of {unit}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a finite, non-negative number")
    return value


def seconds(text: str) -> float:
    """A non-negative number of seconds."""
    return _finite_non_negative(text, "seconds")


def milliseconds(text: str) -> float:
    """A non-negative number of milliseconds."""
    return _finite_non_negative(text, "milliseconds")


def timers(text: str) -> float:
    """A non-negative number of a library's retry timers."""
    return _finite_non_negative(text, "timers")


def positive_number(text: str) -> float:
    """A finite number above zero (a multiple, a number of seconds)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number above zero")
    return value


def add_shrink_seconds(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--shrink-seconds",
        type=seconds,
        default=SHRINK_SECONDS,
        help="shrink each distinct failure (each mutant's, for mutants) to its smallest rerun"
        " and export it as a pytest file, for at most this long each time (default"
        f" {SHRINK_SECONDS:g}; 0: do not shrink)",
    )


def positive(text: str) -> int:
    value = non_negative(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be greater than zero")
    return value


SYSTEM_HELP = (
    f"{', '.join(sorted(SHIPPED | PEERS | SERVERS))}, or package.module:factory"
    f" (default {DEFAULT_SYSTEM}); a library at one release: NAME==VERSION"
    f" ({', '.join(sorted(DISTRIBUTIONS))}, or package.module:factory whose System names"
    " its distribution), run in an environment of its own"
)


def add_dsn(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--dsn",
        default=None,
        help="for --system postgres: a running server to use (libpq connection string);"
        " without it the run starts a throwaway server and removes it at the end",
    )


def add_with(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--with",
        dest="with_",
        action="append",
        default=[],
        metavar="DIST==VERSION",
        help="with --system NAME==VERSION: install this release of one of the library's"
        " dependencies beside it (repeat for several), as in --system celery==5.3.1 --with"
        " kombu==5.3.1; by default none",
    )


def add_system(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--system", default=DEFAULT_SYSTEM, help=SYSTEM_HELP)
    add_with(sub)
    add_dsn(sub)


def add_crash_mode(sub: argparse.ArgumentParser, modes: Sequence[str] = CRASH_MODES) -> None:
    failover = (
        f"; {FAILOVER}: the primary dies too and its standby is promoted (a system on"
        " PostgreSQL; --synchronous-commit)"
        if FAILOVER in modes
        else ""
    )
    sub.add_argument(
        "--crash-mode",
        choices=modes,
        default=PROCESS,
        help="process: the page cache survives a death; power-loss: every write, create,"
        " rename and unlink nobody fsynced is lost too (Linux FUSE; exit 4 where unavailable)"
        + failover,
    )
