"""Does a single RabbitMQ node keep every message it confirmed across a power cut?

One node, its data directory on the power-loss disk (``lab.faults.powerloss.rabbitdisk``),
with two durable queues declared before the power comes on: a classic queue and a quorum
queue (on one node a quorum queue's quorum is that node). A publisher on a channel in
confirm mode publishes persistent messages (delivery mode 2) to each, one at a time, each
returning once RabbitMQ confirmed it (``basic.ack``); then a channel without confirms
publishes a few more to each, which RabbitMQ promised nothing of; then the power is cut.
The publisher is pika's (``PIKA``), or Celery's own ``send_task`` (``celery_publisher``):
with kombu's publisher confirms for the first, at Celery's defaults (none) for the rest.

Each crash state the cut allows (``crashstate.crash_choices``, each distinct one once) is
laid as the data directory of a node of the same name, started as after a reboot, and
read with ``rabbitmqctl list_queues`` (the judges' reader): every queue must hold at least
the messages it confirmed (RabbitMQ sends the confirm of a persistent message to a durable
queue after persisting it to disk: ``promises.CONFIRM_PROMISE``) and at most every message
published to it; a queue gone is every confirmed message lost. A node that refuses to
start on a crash state is reported with its words, never as passed.

A node boots in 6 to 9 s and ``rabbitmqctl`` answers in up to 4 s, so a run starts at most
``states`` nodes on crash states: ``lose-all`` (every unsynced operation lost, the state a
confirm must survive) first, then the state that keeps every pending directory change, the
zeroed tails, the seeded states, and the other subsets in ``crash_choices``'s order; the
record names every choice left unstarted. Measured: 2 states in 27 to 38 s, 12 (of the 37
choices a cut leaves) in 181 and 187 s, on 2 shared cores.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from crashqueuelab.judges.readers.rabbitmq import rabbitmq_queues
from crashqueuelab.lab.failover.amqp import _close, connect, declare
from crashqueuelab.lab.failover.promises import CONFIRM_PROMISE, CONFIRMS, CONFIRMS_LATENCY
from crashqueuelab.lab.faults.powerloss.crashstate import (
    DistinctStates,
    bounded_order,
    crash_choices,
)
from crashqueuelab.lab.faults.powerloss.rabbitdisk import STATISTICS_MS, RabbitOnDisk
from crashqueuelab.lab.faults.powerloss.targets import PlacedState
from crashqueuelab.lab.runs.kinds import POWER_CUT
from crashqueuelab.lab.runs.records import write_json
from crashqueuelab.servers.rabbitmq import CONTROL_VARIABLE

#: The queues every run declares, by name: their type.
QUEUES: Mapping[str, str] = {"classic": "classic", "quorum": "quorum"}
#: The record of a run, in its output directory.
RECORD_FILE = POWER_CUT.record
STATES_DIRECTORY = "crash-states"
#: Reading the queues on a node just started: a quorum queue's counts are statistics
#: (``rabbitdisk.STATISTICS_MS``), so the reading waits two intervals, then is taken again
#: until two readings agree and list every queue, a bounded number of times.
READINGS = 6


def publish(connection: Any, confirmed: int, unconfirmed: int) -> dict[str, dict[str, int]]:
    """``confirmed`` persistent messages to each queue on a channel in confirm mode (each
    publish returns once RabbitMQ confirmed it; a refusal raises), then ``unconfirmed`` more
    on a channel without confirms. What each queue was sent, by kind."""
    import pika

    persistent = pika.BasicProperties(delivery_mode=2)
    sent = {name: {"confirmed": 0, "unconfirmed": 0} for name in QUEUES}
    confirming = connection.channel()
    confirming.confirm_delivery()
    for number in range(confirmed):
        for name in QUEUES:
            # mandatory: a message no queue took is refused, not confirmed.
            body = f"{name}-confirmed-{number}".encode()
            confirming.basic_publish("", name, body, persistent, mandatory=True)
            sent[name]["confirmed"] += 1
    unconfirming = connection.channel()
    for number in range(unconfirmed):
        for name in QUEUES:
            body = f"{name}-unconfirmed-{number}".encode()
            unconfirming.basic_publish("", name, body, persistent)
            sent[name]["unconfirmed"] += 1
    return sent


def pika_declare(url: str) -> None:
    for name, queue_type in QUEUES.items():
        declare([url], name, queue_type)


def pika_publish(url: str, confirmed: int, unconfirmed: int) -> Published:
    connection = connect([url])
    try:
        return publish(connection, confirmed, unconfirmed), partial(_close, connection)
    except BaseException:
        _close(connection)
        raise


#: What a publisher sent to each queue, by kind, and what closes its connections.
Published = tuple[dict[str, dict[str, int]], Callable[[], None]]


@dataclass(frozen=True)
class Publisher:
    """Who declares the run's queues and publishes to them (a node's AMQP URL given)."""

    name: str
    #: How the confirmed and the unconfirmed messages were published, in a run's words.
    words: str
    #: The queues it publishes to and the run judges, by name: their type.
    queues: Mapping[str, str]
    declare: Callable[[str], None]
    #: ``(url, confirmed, unconfirmed)``: what each queue was sent, by kind, and what
    #: closes the publisher's connections, called after the cut (so that what it sent last
    #: may still be in flight when the power goes).
    publish: Callable[[str, int, int], Published]


PIKA = Publisher(
    "pika",
    "pika: persistent messages, the confirmed ones on a channel in confirm mode, the others"
    " on a channel without confirms",
    QUEUES,
    pika_declare,
    pika_publish,
)


def celery_publisher() -> Publisher:
    """Celery's ``send_task`` through kombu's AMQP transport (Celery must be installed)."""
    from importlib.metadata import version

    from crashqueuelab.systems.libraries.celery import publishing

    return Publisher(
        "celery",
        f"Celery {version('celery')} (kombu {version('kombu')}): send_task, persistent by"
        " Celery's default, the confirmed ones with kombu's confirm_publish, the others at"
        " Celery's defaults (no publisher confirms)",
        QUEUES,
        lambda url: publishing.declare(url, QUEUES),
        lambda url, confirmed, unconfirmed: publishing.publish(url, QUEUES, confirmed, unconfirmed),
    )


def dramatiq_publisher() -> Publisher:
    """dramatiq's ``RabbitmqBroker.enqueue`` (dramatiq must be installed): its classic queue
    alone, as dramatiq declares no quorum queue."""
    from importlib.metadata import version

    from crashqueuelab.systems.libraries.dramatiq import publishing

    return Publisher(
        "dramatiq",
        f"dramatiq {version('dramatiq')} (pika {version('pika')}): RabbitmqBroker.enqueue,"
        " persistent, the confirmed ones with confirm_delivery=True, the others at dramatiq's"
        " default confirm_delivery=False (no publisher confirms)",
        {publishing.QUEUE: "classic"},
        publishing.declare,
        publishing.publish,
    )


#: The publishers ``power-cut --publisher`` takes, by name.
PUBLISHERS: Mapping[str, Callable[[], Publisher]] = {
    "pika": lambda: PIKA,
    "celery": celery_publisher,
    "dramatiq": dramatiq_publisher,
}


def read_queues(
    control: str, bindir: Path, names: Sequence[str] = tuple(QUEUES)
) -> tuple[dict[str, int], str | None]:
    """Each queue's messages (ready and unacknowledged) as the node lists them, once two
    readings agree; and why no reading was made, if so."""
    time.sleep(2 * STATISTICS_MS / 1000)
    counts: dict[str, int] = {}
    for _ in range(READINGS):
        try:
            listed = rabbitmq_queues(control, bindir)
        except RuntimeError as refused:
            return counts, str(refused)
        previous = counts
        counts = {queue.name: queue.ready + queue.unacknowledged for queue in listed}
        if counts == previous and set(names) <= set(counts):
            break
        time.sleep(STATISTICS_MS / 1000)
    return counts, None


def judge_queue(found: int | None, sent: Mapping[str, int]) -> dict[str, Any]:
    """One queue on one crash state: every confirmed message there, nothing never sent."""
    confirmed, published = sent["confirmed"], sent["confirmed"] + sent["unconfirmed"]
    if found is None:
        return {"found": None, "lost_confirmed": confirmed, "passed": confirmed == 0,
                "why": "the queue is gone"}  # fmt: skip
    judged: dict[str, Any] = {
        "found": found,
        "lost_confirmed": max(0, confirmed - found),
        "unconfirmed_kept": max(0, min(found, published) - confirmed),
        "passed": confirmed <= found <= published,
    }
    if found > published:
        judged["why"] = f"{found} messages, {published} published"
    elif found < confirmed:
        judged["why"] = f"{confirmed - found} of {confirmed} confirmed messages lost"
    return judged


def judge_placed(
    placed: PlacedState, sent: Mapping[str, Mapping[str, int]], bindir: Path
) -> dict[str, Any]:
    """One crash state, its node started (and named to this process) or refused: a node
    that refused to start, or whose queues could not be read, is reported with its words
    and never passes."""
    record: dict[str, Any] = {**placed.state.summary()}
    if placed.problem is not None:
        return {**record, "passed": False, "refused": placed.problem}
    counts, unread = read_queues(os.environ[CONTROL_VARIABLE], bindir, tuple(sent))
    if unread is not None:
        return {**record, "passed": False, "unread": unread}
    queues = {name: judge_queue(counts.get(name), sent[name]) for name in sent}
    passed = all(queue["passed"] for queue in queues.values())
    return {**record, "listed": counts, "queues": queues, "passed": passed}


def headline(
    node: Mapping[str, Any], verdict: Mapping[str, Mapping[str, int]], judged: list[dict[str, Any]]
) -> str:
    """One line: per queue, the crash states that kept every message it confirmed."""
    if not judged:
        return f"RabbitMQ {node.get('version')}: no crash state was started"
    queues = "; ".join(
        f"{name} queue: {counts['states_kept_every_confirmed']} of {len(judged)} kept every"
        f" one of {counts['confirmed']} confirmed messages,"
        f" {counts['states_losing_confirmed']} lost confirmed messages"
        for name, counts in verdict.items()
    )
    refused = sum(1 for state in judged if "refused" in state)
    unread = sum(1 for state in judged if "unread" in state)
    return (
        f"RabbitMQ {node.get('version')}, one node, a power cut: {queues}; {refused} crash"
        f" state(s) the node refused to start on, {unread} it could not be read on"
    )


def reasons(judged: list[dict[str, Any]]) -> list[str]:
    """Each crash state that did not pass, and why, in the words of its judging."""
    found = []
    for state in judged:
        if "refused" in state:
            found.append(
                f"crash state {state['choice']}: the node refused to start: {state['refused']}"
            )
        elif "unread" in state:
            found.append(
                f"crash state {state['choice']}: the queues could not be read: {state['unread']}"
            )
        else:
            found.extend(
                f"crash state {state['choice']}: {name} queue: {queue['why']}"
                for name, queue in state["queues"].items()
                if not queue["passed"]
            )
    return found


def run_rabbit_power_loss(
    output_dir: Path,
    *,
    confirmed: int = 20,
    unconfirmed: int = 5,
    states: int = 2,
    seed: int = 1,
    publisher: Publisher = PIKA,
) -> dict[str, Any]:
    """One node, one power cut, at most ``states`` crash states started and judged; the
    record is written to ``output_dir/RECORD_FILE`` and returned."""
    started = time.perf_counter()
    output_dir.mkdir(parents=True, exist_ok=True)
    judged: list[dict[str, Any]] = []
    with RabbitOnDisk(output_dir, settle=lambda node: publisher.declare(node.url)) as target:
        node = target.server.describe()
        booted_s = time.perf_counter() - started
        sent, close = publisher.publish(target.server.url, confirmed, unconfirmed)
        try:
            # At once: the unconfirmed messages may still be in flight.
            journal = target.cut()
        finally:
            close()
        cut_s = time.perf_counter() - started
        distinct = DistinctStates(journal)
        choices = bounded_order(crash_choices(journal, seed), journal)
        unstarted: list[str] = []
        for choice in choices:
            if len(judged) >= states:
                if not distinct.repeats(choice):
                    unstarted.append(choice.name)
                continue
            if not distinct.new_fate(choice):
                continue
            state_dir = output_dir / STATES_DIRECTORY / choice.name
            state_dir.mkdir(parents=True)
            state_started = time.perf_counter()
            with target.place(journal, choice, state_dir, distinct) as placed:
                if placed.repeated:
                    continue
                record = judge_placed(placed, sent, target.server.bindir)
                record["seconds"] = round(time.perf_counter() - state_started, 1)
                write_json(state_dir / "state.json", {**record, "fate": placed.state.fate})
                judged.append(record)
    verdict = {
        name: {
            "confirmed": sent[name]["confirmed"],
            "unconfirmed": sent[name]["unconfirmed"],
            "states_kept_every_confirmed": sum(
                1 for state in judged if "queues" in state and state["queues"][name]["passed"]
            ),
            "states_losing_confirmed": sum(
                1
                for state in judged
                if "queues" in state and state["queues"][name]["lost_confirmed"]
            ),
        }
        for name in publisher.queues
    }
    passed = bool(judged) and all(state["passed"] for state in judged)
    report = {
        "ok": passed,
        "headline": headline(node, verdict, judged),
        "reasons": reasons(judged),
        "parameters": {
            "server": "rabbitmq",
            "publisher": publisher.name,
            "confirmed": confirmed,
            "unconfirmed": unconfirmed,
            "states": states,
        },
        "seed": seed,
        "question": (
            "does a single RabbitMQ node keep every message it confirmed (persistent,"
            " durable queue, publisher confirms) across a power cut?"
        ),
        "promise": {"quoted": CONFIRM_PROMISE, "source": CONFIRMS, "latency": CONFIRMS_LATENCY},
        "publisher": {"name": publisher.name, "words": publisher.words},
        "node": node,
        "queues": dict(publisher.queues),
        "sent": sent,
        "power_cut": {
            "pending_writes": len(journal.data),
            "pending_directory_changes": len(journal.names),
            "file_syncs": journal.synced_files,
            "directory_syncs": journal.synced_directories,
            "choices": len(choices),
            "crash_states": len(judged),
            "duplicates_skipped": len(distinct.skipped),
            "left_unstarted": unstarted,
        },
        "crash_states": judged,
        "refused": sum(1 for state in judged if "refused" in state),
        "unread": sum(1 for state in judged if "unread" in state),
        "verdict": verdict,
        "passed": passed,
        "timings": {
            "node_on_disk_s": round(booted_s, 1),
            "cut_s": round(cut_s, 1),
            "wall_s": round(time.perf_counter() - started, 1),
        },
    }
    write_json(output_dir / RECORD_FILE, report)
    return report
