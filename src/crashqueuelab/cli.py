"""The JSON command line: stdout carries exactly one JSON object, stderr the diagnostics.

Exit codes are the named constants below and are documented in docs/cli.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sqlite3
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

from crashqueuelab.core.clock import MAX_TIME_US, Clock, ManualClock, SystemClock
from crashqueuelab.core.errors import (
    CrashModeUnavailable,
    CrashQueueLabError,
    InvalidInput,
    JobNotFound,
    ServerUnavailable,
    StaleLease,
    StoreError,
    SystemUnavailable,
)
from crashqueuelab.core.models import to_json
from crashqueuelab.core.payloads import parse_payload
from crashqueuelab.core.queue import DurableQueue
from crashqueuelab.core.retry import RetryPolicy
from crashqueuelab.core.upgrade import upgrade_store
from crashqueuelab.judges.invariants import check_database
from crashqueuelab.judges.replay import replay_database
from crashqueuelab.lab.bench.peers import BENCH_PEERS
from crashqueuelab.lab.bench.runner import BENCH_FILE, run_bench, table
from crashqueuelab.lab.campaign import CAMPAIGN_FILE, Progress, run_campaign
from crashqueuelab.lab.chaos.supervisor import CHAOS_FILE, run_chaos
from crashqueuelab.lab.crashmodes import CRASH_MODES, PROCESS
from crashqueuelab.lab.demo import DEFAULT_SEED, run_demo
from crashqueuelab.lab.servers import servers_for
from crashqueuelab.lab.showcase import (
    CAMPAIGN_DIR,
    EFFECT_DIR,
    MUTANTS_DIR,
    POWER_LOSS_DIR,
    run_showcase,
)
from crashqueuelab.systems.registry import DEFAULT_SYSTEM, PEERS, SERVERS, SHIPPED

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

DEFAULT_LEASE_US = 30_000_000


class UsageError(Exception):
    """Raised by the parser instead of printing usage and exiting."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def _time_us(text: str) -> int:
    value = _non_negative(text)
    if value > MAX_TIME_US:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_TIME_US} microseconds")
    return value


def _positive(text: str) -> int:
    value = _non_negative(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be greater than zero")
    return value


def _batch_size(text: str) -> int | None:
    if text == "adaptive":
        return None
    try:
        return _positive(text)
    except argparse.ArgumentTypeError as error:
        raise argparse.ArgumentTypeError(
            f"{error}; give a positive integer or 'adaptive'"
        ) from None


Handler = Callable[[argparse.Namespace], tuple[int, dict[str, Any]]]


def _queue(args: argparse.Namespace, *, create: bool = False) -> DurableQueue:
    clock: Clock = ManualClock(args.now_us) if args.now_us is not None else SystemClock()
    retry = RetryPolicy(
        base_delay_us=getattr(args, "retry_base_us", RetryPolicy.base_delay_us),
        max_delay_us=getattr(args, "retry_max_us", RetryPolicy.max_delay_us),
    )
    return DurableQueue(args.database, clock=clock, retry=retry, create=create)


def _submit(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    payload = parse_payload(args.payload)
    with _queue(args, create=True) as queue:
        result = queue.submit(
            idempotency_key=args.idempotency_key,
            job_type=args.job_type,
            payload=payload,
            max_attempts=args.max_attempts,
        )
    return EXIT_OK, {"ok": True, "created": result.created, "job": to_json(result.job)}


def _claim(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    with _queue(args) as queue:
        if args.limit is not None:
            # The batched path: a list of up to --limit leased jobs, one transaction.
            batch = queue.claim_many(
                worker_id=args.worker_id,
                lease_duration_us=args.lease_duration_us,
                limit=args.limit,
            )
            return EXIT_OK, {"ok": True, "claimed": [to_json(job) for job in batch]}
        claimed = queue.claim(worker_id=args.worker_id, lease_duration_us=args.lease_duration_us)
    return EXIT_OK, {"ok": True, "claimed": None if claimed is None else to_json(claimed)}


def _heartbeat(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    with _queue(args) as queue:
        claimed = queue.heartbeat(
            job_id=args.job_id,
            worker_id=args.worker_id,
            lease_token=args.lease_token,
            lease_duration_us=args.lease_duration_us,
        )
    return EXIT_OK, {"ok": True, "claimed": to_json(claimed)}


def _succeed(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    with _queue(args) as queue:
        job = queue.succeed(
            job_id=args.job_id, worker_id=args.worker_id, lease_token=args.lease_token
        )
    return EXIT_OK, {"ok": True, "job": to_json(job)}


def _fail(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    with _queue(args) as queue:
        job = queue.fail(
            job_id=args.job_id,
            worker_id=args.worker_id,
            lease_token=args.lease_token,
            error=args.error,
        )
    return EXIT_OK, {"ok": True, "job": to_json(job)}


def _promote(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    with _queue(args) as queue:
        job_ids = queue.promote_retries()
    return EXIT_OK, {"ok": True, "promoted": job_ids}


def _recover(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    with _queue(args) as queue:
        job_ids = queue.recover_expired()
    return EXIT_OK, {"ok": True, "recovered": job_ids}


def _history(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    with _queue(args) as queue:
        events = queue.history(args.job_id)
    return EXIT_OK, {"ok": True, "job_id": args.job_id, "events": [to_json(e) for e in events]}


def _replay(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    report = replay_database(args.database, job_id=args.job_id)
    if args.job_id is not None and report.jobs_replayed == 0:
        # As `history` says: replaying a job that does not exist is no proof of anything.
        raise JobNotFound(args.job_id)
    return (EXIT_OK if report.ok else EXIT_REJECTED), {"ok": report.ok, "replay": report.to_json()}


def _upgrade(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    result = upgrade_store(args.database)
    return EXIT_OK, {
        "ok": True,
        "upgraded": result.upgraded,
        "from_version": result.from_version,
        "to_version": result.to_version,
        "attempts": result.attempts,
    }


def _check(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    report = check_database(args.database)
    return (EXIT_OK if report.ok else EXIT_REJECTED), {
        "ok": report.ok,
        "check": report.to_json(),
    }


#: Off a terminal, at most one progress line this often (seconds).
PROGRESS_EVERY_S = 5.0
_FRACTION = re.compile(r"(\d[\d,]*)/(\d[\d,]*)")


def _bar(stream: TextIO) -> Progress:
    """On a terminal: each line, with a bar and an estimate of the time left when the line
    says how far along the run is (``12/23``)."""
    started = time.monotonic()

    def show(message: str) -> None:
        found = _FRACTION.search(message)
        if found is None:
            print(message, file=stream, flush=True)
            return
        done, total = (int(part.replace(",", "")) for part in found.groups())
        share = min(1.0, done / total) if total else 1.0
        elapsed = time.monotonic() - started
        left = f", about {elapsed / share - elapsed:.0f} s left" if 0 < share < 1 else ""
        bar = "#" * round(share * 20) + "." * (20 - round(share * 20))
        print(f"[{bar}] {message}{left}", file=stream, flush=True)

    return show


def _progress(args: argparse.Namespace) -> Progress | None:
    """Every progress line on a terminal; one every few seconds into a pipe or a file;
    none with ``--quiet``. Every long command behaves alike."""
    stream: TextIO = args.stderr
    if args.quiet:
        return None
    if stream.isatty():
        return _bar(stream)
    last = [-PROGRESS_EVERY_S]

    def throttled(message: str) -> None:
        now = time.monotonic()
        if now - last[0] >= PROGRESS_EVERY_S:
            last[0] = now
            print(message, file=stream, flush=True)

    return throttled


def _html_report(directory: Path, stderr: TextIO | None = None) -> str | None:
    """Write the run's report.html when Jinja2 is installed (the reports extra); its path.

    The run's evidence is already on disk: a page that cannot be built is said on stderr
    and costs the run nothing (``crashqueuelab report DIR`` can build it again).
    """
    if importlib.util.find_spec("jinja2") is None:
        return None
    from crashqueuelab.lab.pages.render import write_report

    try:
        return str(write_report(directory))
    except Exception as error:
        print(f"crashqueuelab: report.html not written: {error!r}", file=stderr or sys.stderr)
        return None


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
        "report": _html_report(args.output_directory),
        "comparison": comparison,
        "output_directory": str(args.output_directory),
    }


def _campaign(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    report = run_campaign(
        args.output_directory,
        seed=args.seed,
        system=args.system,
        crash_mode=args.crash_mode,
        progress=_progress(args),
        crash_points=args.crash_point,
    )
    return (EXIT_OK if report["ok"] else EXIT_REJECTED), {
        "ok": report["ok"],
        "report": _html_report(args.output_directory),
        "system": report["system"],
        "crash_mode": report["crash_mode"],
        "seed": report["seed"],
        "summary": report["summary"],
        "anomalies": report["anomalies"],
        "reasons": report["anomalies"],
        "campaign_report": str(args.output_directory / CAMPAIGN_FILE),
    }


def _showcase(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    summary = run_showcase(
        args.output_directory,
        seed=args.seed,
        systems=args.system or list(SHIPPED),
        progress=_progress(args),
    )
    sections = [Path(section["artifacts"]["campaign_report"]).parent.parent
                for section in summary["systems"].values()]  # fmt: skip
    if importlib.util.find_spec("jinja2") is not None:
        for section in sections:
            for part in (EFFECT_DIR, CAMPAIGN_DIR, POWER_LOSS_DIR):
                if (section / part).is_dir():
                    _html_report(section / part)
        _html_report(args.output_directory / MUTANTS_DIR)
    report = _html_report(args.output_directory)
    if not args.quiet:
        print(f"crashqueuelab: {summary['mutants']['line']}", file=args.stderr)
    if report is not None:
        print(f"crashqueuelab: {'passed' if summary['ok'] else 'NOT OK'}; report: {report}",
              file=args.stderr)  # fmt: skip
    return (EXIT_OK if summary["ok"] else EXIT_REJECTED), {"report": report, **summary}


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
        restart_server=None if args.server is None else args.server.restart_after_crash,
        progress=_progress(args),
    )
    return (EXIT_OK if report["ok"] else EXIT_REJECTED), {
        key: report[key]
        for key in (
            "ok", "reasons", "system", "crash_mode", "notes", "seed", "parameters",
            "kills_delivered", "pauses_delivered", "power_cuts_delivered",
            "server_restarts_delivered", "session_kills_delivered",
            "pauses_with_takeover", "pauses_fenced", "respawns", "accounting", "anomalies",
            "timings",
        )
    } | {
        "chaos_report": str(args.output_directory / CHAOS_FILE),
        "report": _html_report(args.output_directory),
    }  # fmt: skip


def _mutants(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from crashqueuelab.lab.mutants.runner import MUTANTS_FILE, run_mutants

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
        progress=_progress(args),
    )
    return (EXIT_OK if report["ok"] else EXIT_REJECTED), {
        key: report[key]
        for key in ("ok", "reasons", "caught", "total", "missed", "seeds", "evidence", "mutants")
    } | {"mutants_report": str(args.output_directory / MUTANTS_FILE)}


def _bench(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    report = run_bench(
        args.output_directory,
        jobs=args.jobs,
        workers=args.workers,
        work_ms=args.work_ms,
        systems=args.system or [DEFAULT_SYSTEM],
        batch=args.batch,
        progress=_progress(args),
        peers=args.peer or [],
        repeat=args.repeat,
    )
    args.stderr.write(table(report["cells"]) + "\n")
    return (EXIT_OK if report["ok"] else EXIT_REJECTED), {
        "ok": report["ok"],
        "report": _html_report(args.output_directory),
        "reasons": report["reasons"],
        "systems": report["systems"],
        "disk": report["disk"],
        "targets": report["targets"],
        "bench_report": str(args.output_directory / BENCH_FILE),
    }


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


def _add_experiment(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output-directory", type=Path, required=True, help="a new or empty directory"
    )
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="fixes order and ids")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def _add_database(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--database", required=True, help="path of the queue's SQLite file")
    parser.add_argument(
        "--now-us",
        type=_time_us,
        default=None,
        help="use this time (microseconds) instead of the system clock, for scripted runs",
    )


def _add_lease_holder(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job-id", required=True)
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--lease-token", required=True)


def _add_retry(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--retry-base-us", type=_non_negative, default=RetryPolicy.base_delay_us)
    parser.add_argument("--retry-max-us", type=_non_negative, default=RetryPolicy.max_delay_us)


_Command = Callable[..., argparse.ArgumentParser]


_SYSTEM_HELP = (
    f"{', '.join(sorted(SHIPPED | PEERS | SERVERS))}, or package.module:factory"
    f" (default {DEFAULT_SYSTEM})"
)


def _add_system(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--system", default=DEFAULT_SYSTEM, help=_SYSTEM_HELP)
    _add_dsn(sub)


def _add_dsn(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--dsn",
        default=None,
        help="for --system postgres: a running server to use (libpq connection string);"
        " without it the run starts a throwaway server and removes it at the end",
    )


def _experiment_commands(command: _Command) -> None:
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
        help=f"repeat for several (default: every shipped one): {_SYSTEM_HELP}",
    )
    _add_dsn(sub)
    sub = command(
        "demo",
        _demo,
        "crash after an effect commit, before acknowledgement: idempotent vs not",
        database=False,
    )
    _add_system(sub)
    sub = command(
        "campaign",
        _campaign,
        "kill a child process with os._exit at each crash point of a system; run the probes",
        database=False,
    )
    _add_system(sub)
    _add_crash_mode(sub)
    sub.add_argument(
        "--crash-point",
        action="append",
        help="run only this crash point (repeat for several; default: every one)",
    )
    sub = command(
        "chaos",
        _chaos,
        "SIGKILL and SIGSTOP real worker processes at random; count lost and duplicated work",
        database=False,
    )
    sub.add_argument("--jobs", type=_positive, default=3000)
    sub.add_argument("--workers", type=_positive, default=4)
    sub.add_argument("--kills", type=_non_negative, default=300)
    sub.add_argument("--pauses", type=_non_negative, default=5)
    sub.add_argument("--lease-ms", type=_positive, default=500)
    sub.add_argument("--batch", type=_positive, default=4)
    _add_system(sub)
    _add_crash_mode(sub)
    sub.add_argument(
        "--power-cuts",
        type=_non_negative,
        default=0,
        help="with --crash-mode power-loss: cut the power this often (every process dies)",
    )
    sub.add_argument(
        "--server-restarts",
        type=_non_negative,
        default=0,
        help="stop the system's server with pg_ctl stop -m immediate and start it again this"
        " often (postgres, on the server the run started)",
    )
    sub.add_argument(
        "--session-kills",
        type=_non_negative,
        default=0,
        help="end a worker's database session with pg_terminate_backend this often (postgres)",
    )
    sub = command(
        "mutants",
        _mutants,
        "run planted bugs of the shipped systems through the campaign and chaos; what caught each",
        database=False,
    )
    sub.add_argument("--mutant", action="append", help="only this one (repeatable)")
    sub.add_argument(
        "--seeds", type=_positive, default=2, help="seeds from --seed on; each one must catch"
    )
    sub.add_argument("--jobs", type=_positive, default=300, help="jobs of each chaos run")
    sub.add_argument("--kills", type=_non_negative, default=15)
    sub.add_argument("--pauses", type=_non_negative, default=2)
    sub.add_argument("--power-cuts", type=_non_negative, default=2, help="of each chaos run")
    sub.add_argument(
        "--named-evidence",
        action="store_true",
        help="each mutant only through the evidence the catalog names for it (quick)",
    )
    sub = command(
        "bench",
        _bench,
        "throughput, latency and fairness against a textbook queue, side by side",
        database=False,
    )
    sub.add_argument("--jobs", type=_positive, default=2000)
    sub.add_argument(
        "--repeat",
        type=_positive,
        default=1,
        help="run every cell N times, interleaved; a cell shows its median run and the spread",
    )
    sub.add_argument("--workers", type=_int_list, default=[1, 2, 4, 8, 16])
    sub.add_argument("--work-ms", type=_float_list, default=[0.0, 1.0])
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
        help=f"repeat to put systems side by side with the textbook queue: {_SYSTEM_HELP}",
    )
    sub.add_argument(
        "--peer",
        action="append",
        help="repeat to add a peer library, driven through its own calls (the peers extra):"
        f" {', '.join(BENCH_PEERS)}",
    )
    _add_dsn(sub)


def _report_command(commands: Any) -> None:
    help_text = "(re)build DIR/report.html from a run's retained files (needs the reports extra)"
    sub = commands.add_parser("report", help=help_text, description=help_text)
    sub.set_defaults(handler=_report)
    sub.add_argument(
        "directory", type=Path, help="a showcase, demo, campaign, chaos or bench directory"
    )


def _database_commands(command: _Command) -> None:
    """The operations on one queue database."""
    sub = command("submit", _submit, "submit a job (idempotent by key)")
    sub.add_argument("--idempotency-key", required=True)
    sub.add_argument("--job-type", required=True)
    sub.add_argument("--payload", required=True, help="a JSON object")
    sub.add_argument("--max-attempts", type=_positive, default=3)

    sub = command("claim", _claim, "lease the oldest ready job (or up to --limit jobs)")
    sub.add_argument("--worker-id", required=True)
    sub.add_argument("--lease-duration-us", type=_positive, default=DEFAULT_LEASE_US)
    sub.add_argument(
        "--limit", type=_positive, default=None, help="claim up to this many jobs (prints a list)"
    )

    sub = command("heartbeat", _heartbeat, "extend a live lease")
    _add_lease_holder(sub)
    sub.add_argument("--lease-duration-us", type=_positive, default=DEFAULT_LEASE_US)

    sub = command("succeed", _succeed, "acknowledge a leased job as done")
    _add_lease_holder(sub)

    sub = command("fail", _fail, "record a failed attempt (retry or dead-letter)")
    _add_lease_holder(sub)
    sub.add_argument("--error", required=True)
    _add_retry(sub)

    command("promote", _promote, "move due retries back to QUEUED")
    sub = command("recover", _recover, "end expired leases (retry or dead-letter)")
    _add_retry(sub)

    sub = command("history", _history, "print one job's event history")
    sub.add_argument("--job-id", required=True)

    sub = command("replay", _replay, "replay the history and compare with the rows")
    sub.add_argument("--job-id", default=None)

    command("check", _check, "evaluate every database-wide invariant")
    command(
        "upgrade",
        _upgrade,
        "bring a queue database of schema version 2 to the current version, in place"
        " (stop its workers first)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The whole command line; every subcommand sets ``handler``."""
    parser = _Parser(
        prog="crashqueuelab",
        description="Fault-injection and invariant-testing laboratory for durable job queues.",
        epilog="Exit codes: 0 ok, 1 rejected or inconsistent, 2 bad input, 3 unusable database.",
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def command(
        name: str, handler: Handler, help_text: str, *, database: bool = True
    ) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(handler=handler)
        if database:
            _add_database(sub)
        else:
            _add_experiment(sub)
        return sub

    _experiment_commands(command)
    _report_command(commands)
    _database_commands(command)
    return parser


def _add_crash_mode(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--crash-mode",
        choices=CRASH_MODES,
        default=PROCESS,
        help="process: the page cache survives a death; power-loss: every write, create,"
        " rename and unlink nobody fsynced is lost too (Linux FUSE; exit 4 where unavailable)",
    )


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


def main(
    argv: Sequence[str] | None = None,
    *,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Run one command; return its exit code. Never raises for bad input."""
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    try:
        args = build_parser().parse_args(argv)
        args.stderr = err
        handler: Handler = args.handler
        systems = getattr(args, "system", None)
        named = [systems] if isinstance(systems, str) else list(systems or ())
        with servers_for(named, getattr(args, "dsn", None)) as server:
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
    if not result.get("ok", False):
        reasons = result.get("reasons") or [result.get("error", {}).get("message", "not ok")]
        shown = "; ".join(str(reason) for reason in reasons[:5])
        more = f" (and {len(reasons) - 5} more)" if len(reasons) > 5 else ""
        print(f"crashqueuelab: not ok: {shown}{more}", file=err)
    out.write(json.dumps(_verdict_first(result), indent=2) + "\n")
    out.flush()
    return code


#: What a reader looks for first: the verdict, the page that explains it, the error.
_FIRST_KEYS = ("ok", "report", "error", "reasons")


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
