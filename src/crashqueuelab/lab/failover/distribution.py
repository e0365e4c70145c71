"""The Erlang distribution between the nodes of the lab's RabbitMQ cluster, through the lab's
fault proxy, so that a partition between nodes is a real one: every byte one node sends
another is held, and neither can reach the other again, until the window ends.

A node finds a peer's distribution port by asking its port mapper module. Each node of a
partitionable cluster runs with ``-epmd_module crashqueuelab_epmd`` (``erlang/``, compiled
with the Erlang compiler that comes with RabbitMQ, into the run's directory): Erlang's own
``erl_epmd`` in every call but one, it answers a peer's port with that of the proxy path
from this node to that peer, so that each connection between two nodes, whichever opens it,
goes through one of the two paths between them. ``rabbitmqctl``'s node is not a peer: the
lab's readings reach each node directly, partition or not. The nodes notice a peer gone
after ``net_ticktime`` (lowered to ``TICKTIME_S``, for the nodes and the command line
alike), as RabbitMQ's partitions guide describes.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from importlib.resources import as_file, files
from pathlib import Path
from typing import Self

from crashqueuelab.core.errors import ServerUnavailable
from crashqueuelab.lab.faults.network.proxy import FaultProxy
from crashqueuelab.lab.faults.network.windows import FaultWindow, WindowKind

MODULE = "crashqueuelab_epmd"
#: What a node's port mapper module reads a peer's proxy port from (``port_variable``).
PORT_VARIABLE_PREFIX = "CRASHQUEUELAB_DIST_PORT_"
#: The nodes' ``net_ticktime`` (RabbitMQ's default is 60 s): a peer silent for about this
#: long is down.
TICKTIME_S = 4
#: How long compiling the module may take.
COMPILE_TIMEOUT_S = 60.0


def port_variable(node: str) -> str:
    """The variable naming the proxy port a node dials to reach ``node`` (its name before
    the '@', each '-' written '_', as the module writes it)."""
    return PORT_VARIABLE_PREFIX + node.split("@", 1)[0].replace("-", "_")


def find_erlc(epmd: Path) -> Path | None:
    """The Erlang compiler: beside ``epmd``, on PATH, or in the runtime's own directory."""
    for candidate in (epmd.parent / "erlc", shutil.which("erlc"), Path("/usr/lib/erlang/bin/erlc")):
        if candidate is not None and Path(candidate).is_file():
            return Path(candidate)
    return None


def compile_module(directory: Path, erlc: Path) -> Path:
    """The module compiled into ``directory`` (what ``-pa`` then names)."""
    directory.mkdir(parents=True, exist_ok=True)
    source = files("crashqueuelab.lab.failover") / "erlang" / f"{MODULE}.erl"
    with as_file(source) as path:
        completed = subprocess.run(
            [str(erlc), "-o", str(directory), str(path)],
            capture_output=True,
            text=True,
            timeout=COMPILE_TIMEOUT_S,
            check=False,
        )
    if completed.returncode != 0:
        said = (completed.stdout + completed.stderr).strip()[-400:]
        raise ServerUnavailable(f"erlc could not compile {MODULE}: {said}", "rabbitmq")
    return directory


def node_arguments(module_directory: Path) -> str:
    """The Erlang arguments of a node whose distribution goes through the proxy."""
    return f"-pa {module_directory} -epmd_module {MODULE}"


class DistributionProxy:
    """One proxy path per ordered pair of nodes, to the second's distribution port."""

    def __init__(self, dist_ports: dict[str, int]) -> None:
        """``dist_ports``: each node's name -> the distribution port it listens on."""
        first = next(iter(dist_ports.values()))
        self.proxy = FaultProxy(("127.0.0.1", first))
        self.dist_ports = dict(dist_ports)
        self.ports: dict[str, dict[str, int]] = {node: {} for node in dist_ports}
        for source in dist_ports:
            for target, port in dist_ports.items():
                if target != source:
                    _, through = self.proxy.add_path(path(source, target), ("127.0.0.1", port))
                    self.ports[source][target] = through

    def environment(self, node: str) -> dict[str, str]:
        """What ``node`` is started with: the proxy port of each of its peers."""
        return {port_variable(peer): str(port) for peer, port in self.ports[node].items()}

    def paths_between(self, side: Sequence[str]) -> list[str]:
        """Every path from a node of ``side`` to a node outside it, and back."""
        inside = set(side)
        return [
            path(source, target)
            for source in self.ports
            for target in self.ports[source]
            if (source in inside) != (target in inside)
        ]

    def partition(self, side: Sequence[str], seconds: float) -> FaultWindow:
        """Cut ``side`` from the other nodes for ``seconds`` (from now)."""
        return self.proxy.apply(WindowKind.PARTITION, self.paths_between(side), seconds=seconds)

    def connections(self) -> dict[str, int]:
        """Per path, the connections the proxy accepted on it."""
        return {name: counted["connections"] for name, counted in self.proxy.counts.items()}

    def start(self) -> Self:
        self.proxy.start()
        return self

    def close(self) -> None:
        self.proxy.close()


def path(source: str, target: str) -> str:
    """The proxy path a connection from ``source`` to ``target`` takes."""
    return f"{source}->{target}"
