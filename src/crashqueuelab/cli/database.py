"""The operations on one queue database: submit, claim, heartbeat, succeed, fail, promote,
recover, history, replay, check, upgrade."""

from __future__ import annotations

import argparse
from typing import Any

from crashqueuelab.cli.common import (
    EXIT_OK,
    EXIT_REJECTED,
    Command,
    non_negative,
    positive,
    time_us,
)
from crashqueuelab.core.clock import Clock, ManualClock, SystemClock
from crashqueuelab.core.errors import JobNotFound
from crashqueuelab.core.models import to_json
from crashqueuelab.core.payloads import parse_payload
from crashqueuelab.core.queue import DurableQueue
from crashqueuelab.core.retry import RetryPolicy
from crashqueuelab.core.upgrade import upgrade_store
from crashqueuelab.judges.invariants import check_database
from crashqueuelab.judges.replay import replay_database

DEFAULT_LEASE_US = 30_000_000


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


def add_database_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--database", required=True, help="path of the queue's SQLite file")
    parser.add_argument(
        "--now-us",
        type=time_us,
        default=None,
        help="use this time (microseconds) instead of the system clock, for scripted runs",
    )


def _add_lease_holder(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job-id", required=True, help="the leased job")
    parser.add_argument("--worker-id", required=True, help="the worker holding the lease")
    parser.add_argument(
        "--lease-token", required=True, help="the token its claim returned (fencing)"
    )


def _add_retry(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--retry-base-us",
        type=non_negative,
        default=RetryPolicy.base_delay_us,
        help="delay before the first retry, doubled at each failure (microseconds)",
    )
    parser.add_argument(
        "--retry-max-us",
        type=non_negative,
        default=RetryPolicy.max_delay_us,
        help="the longest delay between retries (microseconds)",
    )


def add_database_commands(command: Command) -> None:
    """The operations on one queue database."""
    sub = command("submit", _submit, "submit a job (idempotent by key)")
    sub.add_argument(
        "--idempotency-key", required=True, help="the same key never makes a second job"
    )
    sub.add_argument("--job-type", required=True, help="what kind of job (the handler's name)")
    sub.add_argument("--payload", required=True, help="a JSON object")
    sub.add_argument(
        "--max-attempts",
        type=positive,
        default=3,
        help="claims before a job that keeps failing or expiring is dead-lettered",
    )

    sub = command("claim", _claim, "lease the oldest ready job (or up to --limit jobs)")
    sub.add_argument("--worker-id", required=True, help="who takes the lease")
    sub.add_argument(
        "--lease-duration-us",
        type=positive,
        default=DEFAULT_LEASE_US,
        help="how long the lease lasts (microseconds)",
    )
    sub.add_argument(
        "--limit", type=positive, default=None, help="claim up to this many jobs (prints a list)"
    )

    sub = command("heartbeat", _heartbeat, "extend a live lease")
    _add_lease_holder(sub)
    sub.add_argument(
        "--lease-duration-us",
        type=positive,
        default=DEFAULT_LEASE_US,
        help="the new lease's length from now (microseconds)",
    )

    sub = command("succeed", _succeed, "acknowledge a leased job as done")
    _add_lease_holder(sub)

    sub = command("fail", _fail, "record a failed attempt (retry or dead-letter)")
    _add_lease_holder(sub)
    sub.add_argument("--error", required=True, help="what went wrong, kept in the history")
    _add_retry(sub)

    command("promote", _promote, "move due retries back to QUEUED")
    sub = command("recover", _recover, "end expired leases (retry or dead-letter)")
    _add_retry(sub)

    sub = command("history", _history, "print one job's event history")
    sub.add_argument("--job-id", required=True, help="the job whose events to print")

    sub = command("replay", _replay, "replay the history and compare with the rows")
    sub.add_argument("--job-id", default=None, help="only this job (default: every job)")

    command("check", _check, "evaluate every database-wide invariant")
    command(
        "upgrade",
        _upgrade,
        "bring a queue database of schema version 2 to the current version, in place"
        " (stop its workers first)",
    )
