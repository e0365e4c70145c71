"""``crashqueuelab power-cut``: a broker's data directory on the power-loss disk, messages
confirmed to it, the power cut, and every crash state the cut allows started and read
(``lab.failover.rabbitpower``; RabbitMQ today)."""

from __future__ import annotations

import argparse
from importlib.util import find_spec
from typing import Any

from crashqueuelab.cli.common import EXIT_OK, EXIT_REJECTED, Command, non_negative, positive
from crashqueuelab.cli.pages import html_report
from crashqueuelab.core.errors import ServerUnavailable, SystemUnavailable, install_hint
from crashqueuelab.lab.faults.powerloss.disk import require_power_loss
from crashqueuelab.lab.runs.kinds import POWER_CUT
from crashqueuelab.servers.rabbitmq import find_binaries


def _power_cut(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    # Both refusals come before anything is made: a machine without FUSE or without the
    # server's binaries cannot run this at all (exit 4).
    require_power_loss()
    if find_binaries() is None:
        raise ServerUnavailable("rabbitmq", "rabbitmq-server is not installed here")
    from crashqueuelab.lab.failover.rabbitpower import PUBLISHERS, run_rabbit_power_loss

    needs = {
        "pika": ("pika", "dramatiq"),
        "celery": ("celery", "celery"),
        "dramatiq": ("dramatiq", "dramatiq"),
    }[args.publisher]
    if find_spec(needs[0]) is None:
        raise SystemUnavailable(
            args.publisher, f"{needs[0]} is not installed: {install_hint(needs[1])}"
        )
    record = run_rabbit_power_loss(
        args.output_directory,
        confirmed=args.confirmed,
        unconfirmed=args.unconfirmed,
        states=args.states,
        seed=args.seed,
        publisher=PUBLISHERS[args.publisher](),
    )
    return (EXIT_OK if record["ok"] else EXIT_REJECTED), {
        "ok": record["ok"],
        "headline": record["headline"],
        "reasons": record["reasons"],
        "node": record["node"],
        "promise": record["promise"]["quoted"],
        "publisher": record["publisher"],
        "sent": record["sent"],
        "verdict": record["verdict"],
        "power_cut": record["power_cut"],
        "refused": record["refused"],
        "unread": record["unread"],
        "wall_s": record["timings"]["wall_s"],
        "power_cut_report": str(args.output_directory / POWER_CUT.record),
        "report": html_report(args.output_directory, args.stderr),
    }


def add_power_cut_command(command: Command) -> None:
    sub = command(
        POWER_CUT.command,
        _power_cut,
        "a RabbitMQ node with its data directory on the power-loss disk: persistent messages"
        " confirmed to a durable classic queue and a quorum queue, a few more unconfirmed, the"
        " power cut, then a node started on each crash state the cut allows and its queues"
        " read with rabbitmqctl: does every queue still hold what it confirmed? (exit 1 when a"
        " state lost a confirmed message or the node refused it, 4 without FUSE or"
        " rabbitmq-server)",
        database=False,
    )
    sub.set_defaults(own_servers=True)
    sub.add_argument(
        "--server",
        # The command line keeps args.server for the servers it starts for a command.
        dest="broker",
        choices=("rabbitmq",),
        default="rabbitmq",
        help="the server whose data directory the power cut takes",
    )
    sub.add_argument(
        "--publisher",
        choices=("pika", "celery", "dramatiq"),
        default="pika",
        help="who publishes: pika, the confirmed messages on a channel in confirm mode and the"
        " others on one without; or Celery's own send_task, the confirmed ones with kombu's"
        " confirm_publish and the others at Celery's defaults (no confirms; needs the celery"
        " extra); or dramatiq's RabbitmqBroker.enqueue to its classic queue alone, the confirmed"
        " ones with confirm_delivery=True and the others at its default (False)",
    )
    sub.add_argument(
        "--confirmed",
        type=positive,
        default=20,
        help="persistent messages published to each queue on a channel in confirm mode, each"
        " returning once the broker confirmed it",
    )
    sub.add_argument(
        "--unconfirmed",
        type=non_negative,
        default=5,
        help="persistent messages then published to each queue without confirms (the broker"
        " promised nothing of them)",
    )
    sub.add_argument(
        "--states",
        type=positive,
        default=2,
        help="crash states started and read, at most (a node boots in 6 to 9 s): lose-all"
        " first, then every pending directory change kept, the zeroed tails, the seeded"
        " states; the record names those left unstarted",
    )
