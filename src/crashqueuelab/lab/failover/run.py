"""A failover run from end to end: a system on a replicated server at one replication
setting (``targets``), under a steady load, failovers made while the standby lags, and the
verdict (``failover.json``).

Each failover: the replication link is partitioned (the standby stops receiving WAL; under
a waiting level every commit now waits), the load goes on for ``lag_s``; optionally the
primary restarts while commits wait for the standby (PostgreSQL then marks them committed
on the primary alone); the primary dies, the standby is promoted and read, the clients
move to it, a new standby is made. At the end the load drains, the final primary is read,
and the ledger is held against what the servers kept (``judge``).

Kept in the run's directory: ``ledger.jsonl`` (every answer the queue gave), each
failover's readings (``failover-N/``, the judges' rows), the final reading (``final/``) and
``failover.json``, whose figures all come from those files.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from crashqueuelab.core.errors import InvalidInput
from crashqueuelab.lab.failover.judge import judge_failovers
from crashqueuelab.lab.failover.promises import (
    LAGGING,
    LEVELS,
    MAX_STANDBYS,
    PROMOTIONS,
    REDIS_SETTINGS,
    WAITING_LEVELS,
)
from crashqueuelab.lab.failover.targets import Target, environment
from crashqueuelab.lab.failover.workload import ENQUEUED, Ledger, Load, read_ledger
from crashqueuelab.lab.runs.kinds import FAILOVER
from crashqueuelab.lab.runs.progress import Progress
from crashqueuelab.lab.runs.records import prepare_output_directory, write_json
from crashqueuelab.servers.base import wait_until
from crashqueuelab.systems.contract import JobStatus, QueueClient
from crashqueuelab.systems.registry import resolve_system

RECORD_FILE = FAILOVER.record
LEDGER_FILE = "ledger.jsonl"
STORE_DIRECTORY = "store"
#: How long the restarted primary may take to show a commit waiting for the standby.
WAITING_TIMEOUT_S = 30.0
#: How long the load's threads may take to notice the end (a call may be reconnecting).
STOP_TIMEOUT_S = 90.0


def _reading(directory: Path, store: Path, system: str, where: dict[str, str]) -> dict[str, Any]:
    """The store as the primary ``where`` names holds it, read by the system's independent
    reader (which keeps what it read there, where it keeps anything): each job's status in
    the lab's words, and its attempts."""
    directory.mkdir(parents=True)
    for kept in store.iterdir():
        if kept.is_file():
            shutil.copy(kept, directory / kept.name)
    reader = resolve_system(system).reader
    assert reader is not None, f"{system} has no independent reader"
    with environment(where, os.environ):
        reading = reader(directory)
    return {
        "jobs": {key: [job.status.value, job.attempts] for key, job in reading.jobs.items()},
        "ok": reading.ok,
        "problems": list(reading.problems),
    }


def check_parameters(
    *,
    target: Target,
    failovers: int,
    jobs: int,
    workers: int,
    restart_while_waiting: bool = False,
    terminate_waiting: bool = False,
) -> None:
    """Refuse what a run could not do, before anything starts."""
    if target.setting not in (*LEVELS, *REDIS_SETTINGS):
        known = ", ".join(LEVELS)
        raise InvalidInput("synchronous_commit", f"one of {known}, not {target.setting!r}")
    for name, value in (("failovers", failovers), ("jobs", jobs), ("workers", workers)):
        if value < 1:
            raise InvalidInput(name, f"at least 1, not {value}")
    if not 1 <= target.standbys <= MAX_STANDBYS:
        raise InvalidInput("standbys", f"1 to {MAX_STANDBYS}, not {target.standbys}")
    if target.standbys > 1 and target.setting in REDIS_SETTINGS:
        raise InvalidInput("standbys", f"a PostgreSQL setting: not for {target.system}")
    if target.promote not in PROMOTIONS:
        raise InvalidInput("promote", f"one of {', '.join(PROMOTIONS)}, not {target.promote!r}")
    if target.promote == LAGGING and target.standbys < 2:
        raise InvalidInput("promote", "a choice between standbys: needs two (--standbys 2)")
    for name, asked in (
        ("restart_while_waiting", restart_while_waiting),
        ("terminate_waiting", terminate_waiting),
    ):
        if asked and not target.waits:
            raise InvalidInput(
                name,
                "commits wait for the standby only on PostgreSQL at"
                f" {', '.join(sorted(WAITING_LEVELS))}, not {target.system} at {target.setting}",
            )


def run_failover(
    output_dir: Path,
    *,
    target: Target,
    failovers: int = 2,
    jobs: int = 200,
    workers: int = 2,
    rate_per_s: float = 100.0,
    lag_s: float = 0.5,
    lease_ms: int = 1000,
    seed: int = 0,
    restart_while_waiting: bool = False,
    terminate_waiting: bool = False,
    deadline_s: float = 300.0,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Run the experiment into ``output_dir`` (new or empty); its record."""
    check_parameters(
        target=target,
        failovers=failovers,
        jobs=jobs,
        workers=workers,
        restart_while_waiting=restart_while_waiting,
        terminate_waiting=terminate_waiting,
    )
    say = progress or (lambda message: None)
    prepare_output_directory(output_dir)
    store = (output_dir / STORE_DIRECTORY).absolute()
    keys = [f"failover-{index:06d}" for index in range(jobs)]
    started = time.monotonic()
    records: list[dict[str, Any]] = []
    with target.cluster() as cluster, environment(cluster.client_environment(), os.environ):
        server = cluster.describe()

        def open_client() -> QueueClient:
            return target.opener(cluster, store)

        open_client().close()  # the store, before any fault
        ledger = Ledger(started)
        load = Load(
            open_client, keys, workers, rate_per_s, lease_ms * 1000, ledger, reopen=target.reopens
        )
        load.start()
        # Each failover's lag (twice with a restart) and about a second to promote.
        lags = 1 + restart_while_waiting + terminate_waiting
        during_each = rate_per_s * (lag_s * lags + 1.0)
        gaps = _gaps(jobs, failovers, seed, during_each)
        try:
            for index in range(failovers):
                records.append(
                    _one_failover(
                        cluster,
                        ledger,
                        index=index,
                        due=min(jobs, ledger.count(ENQUEUED) + gaps[index]),
                        submitted_all=load.submitted_all,
                        lag_s=lag_s,
                        restart_while_waiting=restart_while_waiting,
                        terminate_waiting=terminate_waiting,
                        directory=output_dir / f"failover-{index + 1}",
                        store=store,
                        system=target.system,
                        stopping=load.stopping,
                        started=started,
                    )
                )
                say(f"failover {index + 1} of {failovers}: {_said(records[-1])}")
            drained = _drain(open_client, load, started + deadline_s)
        finally:
            still_running = load.stop(STOP_TIMEOUT_S)
        final = _reading(output_dir / "final", store, target.system, cluster.reading_environment())
    ledger.write(output_dir / LEDGER_FILE)
    write_json(output_dir / "failovers.json", records)
    return _record(
        output_dir,
        target=target,
        server=server,
        parameters={
            "failovers": failovers,
            "jobs": jobs,
            "workers": workers,
            "rate_per_s": rate_per_s,
            "lag_s": lag_s,
            "lease_ms": lease_ms,
            "seed": seed,
            "enqueues_before_each_failover": gaps,
            "restart_while_waiting": restart_while_waiting,
            "terminate_waiting": terminate_waiting,
            "deadline_s": deadline_s,
            "standbys": target.standbys,
            "promote": target.promote,
        },
        keys=keys,
        final=final,
        drained=drained,
        problems=[*load.crashed, *(f"{name}: still running at the end" for name in still_running)],
        wall_s=time.monotonic() - started,
    )


def _failures(events: list[dict[str, Any]]) -> dict[str, int]:
    """How often each call was told failure, by the error's type (from the ledger)."""
    told: dict[str, int] = {}
    for event in events:
        if "error" in event:
            name = f"{event.get('call', 'submit')}: {event['error'].split(':', 1)[0]}"
            told[name] = told.get(name, 0) + 1
    return dict(sorted(told.items()))


def _gaps(jobs: int, failovers: int, seed: int, during_each: float) -> list[int]:
    """How many more acknowledged enqueues each failover waits for after the one before
    it ended (counting from the start would make a failover that held the load up strike
    the next at once): what the ``failovers`` leave of the jobs, ``during_each`` submitted
    in each one's lag and promotion, in even shares (half the jobs at least: with too few,
    the last failovers strike a load that only drains, and their records say so), moved by
    up to a quarter either way."""
    chooser = random.Random(seed)
    share = max(
        1.0, jobs / (2 * (failovers + 1)), (jobs - failovers * during_each) / (failovers + 1)
    )
    spread = int(share / 4)
    return [max(1, round(share) + chooser.randint(-spread, spread)) for _ in range(failovers)]


def _said(record: Mapping[str, Any]) -> str:
    lag = record["before"].get("lag_bytes")
    waiting = record["before"].get("commits_waiting_for_the_standby")
    restarted = " after a restart of the primary" if "restarted_at_s" in record else ""
    behind = "its standby not connected" if lag is None else f"{lag} bytes ahead of its standby"
    held = "" if waiting is None else f" ({waiting} commits waiting for it)"
    return f"the primary died{restarted} {behind}{held}; promoted in {record['promoted_s']:.2f} s"


def _one_failover(
    cluster: Any,
    ledger: Ledger,
    *,
    index: int,
    due: int,
    lag_s: float,
    restart_while_waiting: bool,
    terminate_waiting: bool,
    directory: Path,
    store: Path,
    system: str,
    submitted_all: threading.Event,
    stopping: threading.Event,
    started: float,
) -> dict[str, Any]:
    # The failover strikes under load: once its share of the jobs was acknowledged.
    wait_until(
        lambda: ledger.count(ENQUEUED) >= due or submitted_all.is_set() or stopping.is_set(),
        120.0,
        poll_s=0.01,
    )
    record: dict[str, Any] = {"index": index}
    record["cut_at_s"] = round(time.monotonic() - started, 6)
    # A failover after the last submission strikes a load that only drains: said, not hidden.
    record["producer_running"] = not submitted_all.is_set()
    cluster.cut_replication()
    stopping.wait(lag_s)
    if terminate_waiting:
        _commits_waiting(cluster)
        record["terminated_at_s"] = round(time.monotonic() - started, 6)
        record["sessions_terminated_while_waiting"] = cluster.terminate_waiting()
        stopping.wait(lag_s)  # their clients ask the primary what became of their commits
    if restart_while_waiting:
        _commits_waiting(cluster)
        record["waiting_before_the_restart"] = cluster.lag()["commits_waiting_for_the_standby"]
        record["restarted_at_s"] = round(time.monotonic() - started, 6)
        cluster.restart_primary()
        shown = _reading(
            directory / "restarted-primary", store, system, cluster.reading_environment()
        )
        record["restarted_primary_showed"] = shown["jobs"]
        stopping.wait(lag_s)  # clients go on against the restarted primary
    failing = time.monotonic()

    def read_promoted() -> None:
        promoted = _reading(
            directory / "promoted-standby", store, system, cluster.reading_environment()
        )
        record["snapshot"] = promoted["jobs"]
        record["snapshot_problems"] = promoted["problems"]

    record |= cluster.failover(read_promoted)
    record["killed_at_s"] = round(failing - started + record["primary_killed_s"], 6)
    # An answer the old primary gave just before the kill may be written down just after
    # it; none can come from the standby before it is promoted.
    record["promoted_at_s"] = round(failing - started + record["promoted_s"], 6)
    return record


def _commits_waiting(cluster: Any) -> None:
    wait_until(
        lambda: cluster.lag()["commits_waiting_for_the_standby"] > 0,
        WAITING_TIMEOUT_S,
        poll_s=0.01,
    )


def _drain(open_client: Callable[[], QueueClient], load: Load, deadline: float) -> bool:
    """Wait until every job was submitted and none is left to run; False at the deadline."""
    monitor = open_client()
    try:
        return wait_until(
            lambda: load.submitted_all.is_set() and monitor.active_count() == 0,
            max(0.0, deadline - time.monotonic()),
            poll_s=0.1,
        )
    finally:
        monitor.close()


def _record(
    output_dir: Path,
    *,
    target: Target,
    server: dict[str, Any],
    parameters: dict[str, Any],
    keys: list[str],
    final: dict[str, Any],
    drained: bool,
    problems: list[str],
    wall_s: float,
) -> dict[str, Any]:
    """The record, every figure computed from the files the run kept."""
    events = read_ledger(output_dir / LEDGER_FILE)
    failovers = json.loads((output_dir / "failovers.json").read_text())
    findings = judge_failovers(
        level=target.setting,
        keys=keys,
        events=events,
        failovers=failovers,
        final=final["jobs"],
        standbys=target.standbys,
        promote=target.promote,
    )
    setting = findings["promise"]["setting"]
    reasons = list(problems)
    if not final["ok"]:
        reasons.append("the final store broke the judges' replay or invariants")
    ran = not reasons
    counts = findings["counts"]
    what = (
        f"{counts['lost_enqueues']} lost enqueues, {counts['resurrected_completions']}"
        f" resurrected completions, {counts['leases_came_back']} leases back,"
        f" {counts['duplicate_effects']} duplicate effects"
    )
    if "lost_from_the_old_primary_after_the_fault" in counts:
        what += (
            f" ({counts['lost_from_the_old_primary_after_the_fault']} of the lost"
            " enqueues acknowledged by the old primary after it was paused or cut off, before"
            " it was demoted)"
        )
    if not ran:
        headline = f"not judged: {reasons[0]}"
    elif findings["broken_promises"]:
        headline = (
            f"broken promise: {what} over {len(failovers)} failovers at"
            f" {setting}, which promises none"
        )
    elif findings["documented"]:
        why = findings["promise"].get("why_allowed", "")
        headline = (
            f"as documented: {target.system} at {setting} lets a failover lose what the"
            f" promoted standby had not received{f' (the lagging one: {why})' if why else ''}:"
            f" {what} over"
            f" {len(failovers)} failovers (the lab's contract, no acknowledged work lost,"
            " does not hold there)"
        )
    else:
        headline = (
            f"no acknowledged job lost or brought back over {len(failovers)} failovers of"
            f" {target.system} at {setting}"
        )
    active = sorted(
        key
        for key, row in final["jobs"].items()
        if row[0] not in (JobStatus.SUCCEEDED, JobStatus.DEAD)
    )
    if not drained:
        # Judged as the jobs stand: one acknowledged done and still active is counted.
        headline += (
            f"; {len(active)} jobs still active at the {parameters['deadline_s']:.0f} s deadline"
        )
    record = {
        "kind": FAILOVER.command,
        # The lab's contract: no acknowledged work lost or brought back. A loss the setting
        # documents is not a broken promise (``keeps_its_promises``), and still not ok.
        "ok": ran and findings["contract_held"],
        "keeps_its_promises": ran and findings["ok"],
        "judged": ran,
        "headline": headline,
        "reasons": reasons,
        "system": target.system,
        "setting": setting,
        "server": server,
        "parameters": parameters,
        "failovers": [
            {
                key: value
                for key, value in one.items()
                if key not in ("snapshot", "restarted_primary_showed")
            }
            | {"jobs_on_the_promoted_standby": len(one.get("snapshot", {}))}
            for one in failovers
        ],
        "findings": findings,
        "callers_told_failure": _failures(events),
        "final_store": {"ok": final["ok"], "problems": final["problems"]},
        "drained": drained,
        "active_at_the_end": active,
        "wall_s": round(wall_s, 3),
        "evidence": {
            "ledger": LEDGER_FILE,
            "failovers": "failovers.json",
            "readings": sorted(
                str(path.relative_to(output_dir))
                for path in [*output_dir.glob("*/*/"), output_dir / "final"]
                if path.is_dir() and path.name != STORE_DIRECTORY
            ),
        },
    }
    write_json(output_dir / RECORD_FILE, record)
    return record
