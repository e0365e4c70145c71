"""The chaos command's network faults: how many of each, how long, and the latency
every connection to the server has (``crashqueuelab.lab.faults.network.plan``)."""

from __future__ import annotations

import argparse

from crashqueuelab.cli.common import milliseconds, non_negative, positive
from crashqueuelab.lab.faults.network.plan import WINDOW_LEASES, NetworkPlan


def add_network_faults(sub: argparse.ArgumentParser) -> None:
    group = sub.add_argument_group(
        "network faults (postgres: each process reaches the server through a fault proxy on"
        " 127.0.0.1)"
    )
    group.add_argument(
        "--stalls",
        type=non_negative,
        default=0,
        help="hold one worker's connection this often (bytes kept, nothing closed)",
    )
    group.add_argument(
        "--partitions",
        type=non_negative,
        default=0,
        help="cut the server off from every process (or --partition-workers of them) this"
        " often, both ways",
    )
    group.add_argument(
        "--lost-replies",
        type=non_negative,
        default=0,
        help="drop the server's answers to one worker this often, then reset its connection",
    )
    group.add_argument(
        "--connection-resets",
        type=non_negative,
        default=0,
        help="reset one worker's connections to the server this often",
    )
    group.add_argument(
        "--latency-ms",
        type=milliseconds,
        default=0.0,
        help="delay every byte to and from the server by this many milliseconds, all run long",
    )
    group.add_argument(
        "--partition-workers",
        type=positive,
        default=None,
        help="a partition cuts off this many workers (the scheduled one and the next round the"
        " table) and spares the maintenance process; default: every process",
    )
    group.add_argument(
        "--bandwidth-bytes-s",
        type=non_negative,
        default=0,
        help="limit each direction of every connection to the server to this many bytes a"
        " second, all run long; default 0 (no limit)",
    )
    group.add_argument(
        "--network-fault-ms",
        type=milliseconds,
        default=None,
        help=f"how long each stall, partition and lost-reply window lasts (default:"
        f" {WINDOW_LEASES} leases)",
    )


def network_plan(args: argparse.Namespace) -> NetworkPlan:
    return NetworkPlan(
        stalls=args.stalls,
        partitions=args.partitions,
        lost_replies=args.lost_replies,
        connection_resets=args.connection_resets,
        latency_ms=args.latency_ms,
        window_ms=args.network_fault_ms,
        partition_workers=args.partition_workers,
        bandwidth_bytes_s=float(args.bandwidth_bytes_s),
    )
