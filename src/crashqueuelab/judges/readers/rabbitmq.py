"""An independent reader of a RabbitMQ node's queues, for every library on RabbitMQ
(dramatiq's broker, Celery's): ``rabbitmqctl list_queues``, which reads the node's own
counters; it imports no AMQP client and moves no message (no delivery, no redelivered flag
set)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

#: How long ``rabbitmqctl`` may take to answer.
RABBITMQCTL_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class QueueCounts:
    """A RabbitMQ queue as ``rabbitmqctl list_queues`` says it now."""

    name: str
    ready: int
    unacknowledged: int


def rabbitmq_queues(
    control: str, bindir: Path = Path("/usr/lib/rabbitmq/bin")
) -> Sequence[QueueCounts]:
    """Every queue of the node ``control`` names ("node,epmd-port,cookie-file", as the
    server gives it to a run's children), with its ready and unacknowledged messages:
    ``rabbitmqctl list_queues``, which reads the node's own counters and moves no message
    (no delivery, no redelivered flag set)."""
    node, port, cookie = control.split(",", 2)
    environment = {
        key: value for key, value in os.environ.items() if not key.startswith(("RABBITMQ_", "ERL_"))
    }
    environment.update(HOME=str(Path(cookie).parent), ERL_EPMD_PORT=port)
    completed = subprocess.run(
        [
            str(bindir / "rabbitmqctl"),
            "-n",
            node,
            "-q",
            "list_queues",
            "--no-table-headers",
            "name",
            "messages_ready",
            "messages_unacknowledged",
        ],
        env=environment,
        capture_output=True,
        text=True,
        timeout=RABBITMQCTL_TIMEOUT_S,
        check=False,
    )
    if completed.returncode != 0:
        said = (completed.stdout + completed.stderr).strip()[-300:]
        raise RuntimeError(f"rabbitmqctl list_queues failed (exit {completed.returncode}): {said}")
    counts = []
    for line in completed.stdout.splitlines():
        fields = line.split("\t")
        if len(fields) == 3 and fields[1].isdigit() and fields[2].isdigit():
            counts.append(QueueCounts(fields[0], int(fields[1]), int(fields[2])))
    return tuple(counts)
