"""A RabbitMQ failover run from end to end: a queue of one type on a three-node cluster the
run starts (``rabbitcluster``), a steady load through pika (``amqp``), the node hosting the
queue's leader killed under it, and the verdict (``failover.json``), judged from the files
the run kept (``deliveries``).

Each failover strikes once its share of the jobs was confirmed: the node hosting the leader
is killed (SIGKILL), a survivor names a new leader, the queue is read there
(``failover-N/after-the-kill/queues.txt``), and the killed node is started again and
rejoins. At the end the load drains (the producer is done and the queue stays empty), the
queue is read (``final/queues.txt``), and the ledger is held against it.
"""

from __future__ import annotations

import json
import secrets
import shutil
import time
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

from crashqueuelab.core.errors import InvalidInput, ServerUnavailable
from crashqueuelab.lab.failover.amqp import AmqpLoad, declare
from crashqueuelab.lab.failover.deliveries import KINDS, judge_deliveries
from crashqueuelab.lab.failover.promises import rabbit_partition_promise, rabbit_promise
from crashqueuelab.lab.failover.rabbitcluster import (
    MIRRORED,
    PARTITION_HANDLING,
    PROMOTE_ON_FAILURE,
    QUEUE_TYPES,
    QUORUM,
    SYNC_MODES,
    WAIT_S,
    RabbitCluster,
    mirrored_pattern,
    parse_queues,
)
from crashqueuelab.lab.failover.run import (
    LEDGER_FILE,
    RECORD_FILE,
    STOP_TIMEOUT_S,
    _failures,
    _gaps,
)
from crashqueuelab.lab.failover.workload import ENQUEUED, Ledger, read_ledger
from crashqueuelab.lab.runs.kinds import FAILOVER
from crashqueuelab.lab.runs.progress import Progress
from crashqueuelab.lab.runs.records import prepare_output_directory, write_json
from crashqueuelab.servers.base import wait_until

SYSTEM = "rabbitmq"
QUEUES_FILE = "queues.txt"
#: How long the queue must stay empty, read twice, before the load counts as drained (a
#: quorum queue's counts are statistics, emitted every half second here).
EMPTY_FOR_S = 1.0
#: How long each failover takes (the kill, the election, the rejoin; measured 7 to 10 s):
#: the producer goes on meanwhile.
FAILOVER_S = 9.0
#: How long a node of a cluster that failed a run has to answer ``rabbitmqctl ping``
#: before its VM is asked for a crash dump.
PING_S = 15.0


class Shape(NamedTuple):
    """The load and the faults a run makes."""

    failovers: int
    jobs: int
    workers: int
    rate_per_s: float
    seed: int
    deadline_s: float
    nodes_killed: int
    work_ms: int
    #: Seconds each fault cuts the leader's node from the others; 0: the node is killed.
    partition_s: float = 0.0


def check_parameters(
    *,
    queue_type: str,
    sync_mode: str,
    promote_on_failure: str,
    failovers: int,
    jobs: int,
    workers: int,
    partition_handling: str | None = None,
    partition_s: float = 0.0,
) -> None:
    """Refuse what a run could not do, before anything starts."""
    if partition_handling is not None and partition_handling not in PARTITION_HANDLING:
        raise InvalidInput(
            "partition_handling",
            f"one of {', '.join(PARTITION_HANDLING)}, not {partition_handling!r}",
        )
    if partition_s < 0 or (partition_s > 0) != (partition_handling is not None):
        raise InvalidInput(
            "partition_s", "a partition's seconds (> 0) go with its handling, and only with it"
        )
    if queue_type not in QUEUE_TYPES:
        raise InvalidInput("queue_type", f"one of {', '.join(QUEUE_TYPES)}, not {queue_type!r}")
    if sync_mode not in SYNC_MODES:
        raise InvalidInput("ha_sync_mode", f"one of {', '.join(SYNC_MODES)}, not {sync_mode!r}")
    if promote_on_failure not in PROMOTE_ON_FAILURE:
        raise InvalidInput(
            "ha_promote_on_failure",
            f"one of {', '.join(PROMOTE_ON_FAILURE)}, not {promote_on_failure!r}",
        )
    for name, value in (("failovers", failovers), ("jobs", jobs), ("workers", workers)):
        if value < 1:
            raise InvalidInput(name, f"at least 1, not {value}")


def _read(directory: Path, cluster: RabbitCluster) -> str:
    """The queues as a running node lists them, kept as the judges' evidence."""
    directory.mkdir(parents=True, exist_ok=True)
    said = cluster.queues_text()
    (directory / QUEUES_FILE).write_text(said)
    return said


def run_rabbit_failover(
    output_dir: Path,
    *,
    queue_type: str = QUORUM,
    sync_mode: str = "manual",
    promote_on_failure: str = "always",
    failovers: int = 2,
    jobs: int = 600,
    workers: int = 2,
    rate_per_s: float = 100.0,
    seed: int = 0,
    deadline_s: float = 120.0,
    nodes_killed: int = 1,
    work_ms: int = 0,
    partition_handling: str | None = None,
    partition_s: float = 0.0,
    progress: Progress | None = None,
    cluster: RabbitCluster | None = None,
) -> dict[str, Any]:
    """Run the experiment into ``output_dir`` (new or empty); its record. ``cluster``: one
    already running (a test's, shared by several runs), else the run starts its own.
    ``partition_s`` > 0: each fault cuts the leader's node from the others for that long
    instead of killing it, on a cluster with ``partition_handling``."""
    check_parameters(
        queue_type=queue_type,
        sync_mode=sync_mode,
        promote_on_failure=promote_on_failure,
        failovers=failovers,
        jobs=jobs,
        workers=workers,
        partition_handling=partition_handling,
        partition_s=partition_s,
    )
    if nodes_killed not in (1, 2) or (partition_s and nodes_killed != 1):
        raise InvalidInput(
            "nodes_killed", f"1 or 2 of the 3 nodes (1 for a partition), not {nodes_killed}"
        )
    if work_ms < 0:
        raise InvalidInput("work_ms", f"at least 0, not {work_ms}")
    if cluster is not None and partition_s and cluster.partition_handling != partition_handling:
        raise InvalidInput("partition_handling", "not the one the given cluster runs with")
    shape = Shape(
        failovers, jobs, workers, rate_per_s, seed, deadline_s, nodes_killed, work_ms, partition_s
    )
    say = progress or (lambda message: None)
    prepare_output_directory(output_dir)
    if cluster is None:
        with RabbitCluster(partition_handling=partition_handling) as started:
            return _run_said(
                output_dir, started, queue_type, sync_mode, promote_on_failure, shape, say
            )
    return _run_said(output_dir, cluster, queue_type, sync_mode, promote_on_failure, shape, say)


def keep_logs(cluster: RabbitCluster, into: Path) -> list[str]:
    """Each node's logs copied into ``into`` (one directory each: the cluster's own go when
    it closes), and one line per node: whether its VM runs, and its log's last words. A
    node that runs but answers no ``rabbitmqctl ping`` within ``PING_S`` is asked for its
    VM's crash dump (which halts it), kept with its logs: what it was doing."""
    lines = []
    for node in cluster.nodes:
        state = "running" if node.running else "not running"
        if node.running and not node.answers(timeout_s=PING_S):
            dumped = node.dump()
            state += f", answered no ping in {PING_S:g} s: " + (
                f"its VM's crash dump kept ({dumped.name})"
                if dumped is not None
                else "its VM wrote no crash dump"
            )
        if node.logs.is_dir():
            shutil.copytree(node.logs, into / node.node, dirs_exist_ok=True)
        lines.append(f"{node.node} {state}, its log ends: {node.last_words()}")
    return lines


def _run_said(output_dir: Path, cluster: RabbitCluster, *arguments: Any) -> dict[str, Any]:
    """``_run``; should the cluster fail it, with what each node said: the cluster's
    directories go when it closes, so their logs are copied into the run's own."""
    try:
        return _run(output_dir, cluster, *arguments)
    except ServerUnavailable as error:
        kept = output_dir / "nodes"
        said = "; ".join(keep_logs(cluster, kept))
        raise ServerUnavailable(
            f"{error.reason} (the nodes: {said}; their logs: {kept})", "rabbitmq"
        ) from error


def _run(
    output_dir: Path,
    cluster: RabbitCluster,
    queue_type: str,
    sync_mode: str,
    promote_on_failure: str,
    shape: Shape,
    say: Progress,
) -> dict[str, Any]:
    failovers, jobs, workers, rate_per_s, seed, deadline_s, nodes_killed, work_ms, cut_s = shape
    started = time.monotonic()
    keys = [f"failover-{index:06d}" for index in range(jobs)]
    queue = f"crashqueuelab-{queue_type}-{secrets.token_hex(3)}"
    server = cluster.describe()
    if queue_type == MIRRORED:
        server["policy"] = cluster.set_mirroring(
            mirrored_pattern(queue), sync_mode, promote_on_failure
        )
    first = cluster.nodes[0].node
    declare(cluster.urls(first), queue, queue_type)
    if not wait_until(lambda: _replicated(cluster.queue(queue), len(cluster.nodes)), WAIT_S, 0.1):
        raise InvalidInput("queue", f"{queue} was not replicated to every node in time")
    server["queue"] = queue
    server["clients"] = (
        "pika, publisher confirms and manual acknowledgements; each client connects to the"
        " node hosting the leader first and reconnects through every node in turn"
    )
    leader = {"name": first}
    ledger = Ledger(started)
    load = AmqpLoad(
        lambda: cluster.urls(leader["name"]),
        cluster.port_names(),
        queue,
        keys,
        workers,
        rate_per_s,
        ledger,
        work_s=work_ms / 1000,
    )
    records: list[dict[str, Any]] = []
    gaps = _gaps(jobs, failovers, seed, rate_per_s * max(FAILOVER_S, cut_s + FAILOVER_S))
    load.start()
    try:
        for index in range(failovers):
            if records:
                records[-1] |= cluster.rejoin(queue)
            due = min(jobs, ledger.count(ENQUEUED) + gaps[index])
            wait_until(partial(_confirmed, ledger, load, due), 120.0, 0.01)
            record: dict[str, Any] = {"index": index}
            struck = time.monotonic()
            record["cut_at_s"] = round(struck - started, 6)
            record["producer_running"] = not load.submitted_all.is_set()
            directory = output_dir / f"failover-{index + 1}"
            if cut_s:
                record |= cluster.partition_leader(
                    queue, cut_s, partial(_read, directory / "during-the-partition", cluster)
                )
            else:
                record |= cluster.kill_leader(
                    queue, partial(_read, directory / "after-the-kill", cluster), nodes_killed
                )
            record["killed_at_s"] = round(struck - started + record["primary_killed_s"], 6)
            # A message confirmed on either side until the cluster is whole again may be
            # given up by this partition's healing: it belongs to this fault.
            ended = record["rejoined_s"] if cut_s else record["promoted_s"]
            record["promoted_at_s"] = round(struck - started + ended, 6)
            leader["name"] = record["new_leader"]
            records.append(record)
            struck_what = (
                f"{', '.join(record['partitioned'])} cut off for {cut_s:g} s"
                if cut_s
                else f"{', '.join(record['killed'])} killed"
            )
            say(
                f"failover {index + 1} of {failovers}: {struck_what},"
                f" {record['new_leader']} leads after {record['promoted_s']:.2f} s"
            )
        drained = _drain(cluster, queue, load, started + deadline_s)
        if records:
            records[-1] |= cluster.rejoin(queue)
    finally:
        still_running = load.stop(STOP_TIMEOUT_S)
    _read(output_dir / "final", cluster)
    ledger.write(output_dir / LEDGER_FILE)
    write_json(output_dir / "failovers.json", records)
    return _record(
        output_dir,
        queue=queue,
        promise=(
            rabbit_partition_promise(queue_type, sync_mode, promote_on_failure, cluster_handling)
            if (cluster_handling := cluster.partition_handling) is not None and cut_s
            else rabbit_promise(queue_type, sync_mode, promote_on_failure)
        ),
        server=server,
        parameters={
            "queue_type": queue_type,
            "ha_sync_mode": sync_mode if queue_type == MIRRORED else None,
            "ha_promote_on_failure": promote_on_failure if queue_type == MIRRORED else None,
            "failovers": failovers,
            "jobs": jobs,
            "workers": workers,
            "rate_per_s": rate_per_s,
            "seed": seed,
            "enqueues_before_each_failover": gaps,
            "deadline_s": deadline_s,
            "nodes_killed": 0 if cut_s else nodes_killed,
            "work_ms": work_ms,
            "fault": "partition" if cut_s else "kill",
            "partition_s": cut_s or None,
            "partition_handling": cluster.partition_handling,
        },
        keys=keys,
        drained=drained,
        problems=[*load.crashed, *(f"{name}: still running at the end" for name in still_running)],
        wall_s=time.monotonic() - started,
    )


def _confirmed(ledger: Ledger, load: AmqpLoad, due: int) -> bool:
    """Whether ``due`` jobs were confirmed, or the producer is done."""
    return ledger.count(ENQUEUED) >= due or load.submitted_all.is_set()


def _replicated(entry: dict[str, Any], nodes: int) -> bool:
    if entry.get("type") == "quorum":
        return len(entry.get("online", [])) == nodes
    return len(entry.get("synchronised_mirrors", [])) == nodes - 1


def _drain(cluster: RabbitCluster, queue: str, load: AmqpLoad, deadline: float) -> bool:
    """Wait until every job was submitted and the queue read empty twice, ``EMPTY_FOR_S``
    apart; False at the deadline."""
    empty_since: list[float] = []

    def drained() -> bool:
        try:
            messages = cluster.queue(queue).get("messages")
        except ServerUnavailable:  # a reading that failed says nothing: asked again
            messages = None
        if not load.submitted_all.is_set() or messages != 0:
            empty_since.clear()
            return False
        empty_since.append(time.monotonic())
        return empty_since[-1] - empty_since[0] >= EMPTY_FOR_S

    return wait_until(drained, max(0.0, deadline - time.monotonic()), poll_s=0.25)


def _record(
    output_dir: Path,
    *,
    queue: str,
    promise: dict[str, Any],
    server: dict[str, Any],
    parameters: dict[str, Any],
    keys: list[str],
    drained: bool,
    problems: list[str],
    wall_s: float,
) -> dict[str, Any]:
    """The record, every figure computed from the files the run kept."""
    events = read_ledger(output_dir / LEDGER_FILE)
    failovers = json.loads((output_dir / "failovers.json").read_text())
    final = parse_queues((output_dir / "final" / QUEUES_FILE).read_text()).get(queue, {})
    findings = judge_deliveries(
        promise=promise,
        keys=keys,
        events=events,
        failovers=failovers,
        messages_left=final.get("messages"),
    )
    reasons = list(problems)
    if not final:
        reasons.append(f"the final reading does not list {queue}")
    counts = findings["counts"]
    if counts["undelivered"]:
        reasons.append(
            f"{counts['undelivered']} confirmed jobs never delivered with"
            f" {findings['messages_left']} messages left in the queue: not judged lost"
        )
    ran = not reasons
    what = ", ".join(f"{counts[kind]} {kind.replace('_', ' ')}" for kind in KINDS)
    setting = promise["setting"]
    faults = (
        f"{len(failovers)} partitions of the leader's node"
        if parameters.get("fault") == "partition"
        else f"{len(failovers)} leader kills"
    )
    if not ran:
        headline = f"not judged: {reasons[0]}"
    elif findings["broken_promises"]:
        headline = f"broken promise: {what} over {faults} of a {setting}"
    elif findings["documented"]:
        headline = (
            f"as documented: {what} over {faults} of a {setting} (the"
            " lab's contract, no acknowledged work lost or brought back, does not hold there)"
        )
    else:
        headline = f"no acknowledged job lost or brought back over {faults} of a {setting}"
    if not drained:
        headline += f"; the queue had not drained at the {parameters['deadline_s']:.0f} s deadline"
    record = {
        "kind": FAILOVER.command,
        "ok": ran and findings["contract_held"],
        "keeps_its_promises": ran and findings["ok"],
        "judged": ran,
        "headline": headline,
        "reasons": reasons,
        "system": SYSTEM,
        "setting": parameters["queue_type"],
        "server": server,
        "parameters": parameters,
        "failovers": failovers,
        "findings": findings,
        "callers_told_failure": _failures(events),
        "final_store": {
            "ok": bool(final) and final.get("messages") == 0,
            "problems": [] if final.get("messages") == 0 else [f"the queue as read: {final}"],
            "queue": final,
        },
        "drained": drained,
        "active_at_the_end": findings["undelivered"],
        "wall_s": round(wall_s, 3),
        "evidence": {
            "ledger": LEDGER_FILE,
            "failovers": "failovers.json",
            "readings": sorted(
                str(path.relative_to(output_dir)) for path in output_dir.glob(f"**/{QUEUES_FILE}")
            ),
        },
    }
    write_json(output_dir / RECORD_FILE, record)
    return record
