"""What a bench run measures: its lanes (the columns of the matrix) and the cells' axes.

The lanes are the textbook queue (the baseline) and, for every system under test, its
single-job path and (where the system batches) its batched path, then each peer library.
Every lane runs at each worker count and handler cost; a lane of a system with a single
owner runs with one worker only.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crashqueuelab.lab.bench.peers import resolve_peer
from crashqueuelab.systems.registry import DEFAULT_SYSTEM, resolve_system

TEXTBOOK = "textbook"
PEER = "peer"
TEXTBOOK_DESCRIPTION = {
    "name": TEXTBOOK,
    "version": "crashqueuelab.lab.bench.textbook",
    "durability": "WAL, synchronous=FULL; no history, no attempts, no fencing",
}
DEFAULT_WORKERS = (1, 2, 4, 8, 16)
DEFAULT_WORK_MS = (0.0, 1.0)
#: None: each worker of the batched path sizes its own batches (lab/workloads/batching.py).
DEFAULT_BATCH: int | None = None
#: Runs of each cell: one by default.
DEFAULT_REPEAT = 1
#: The default system's lanes, which the targets compare with the textbook queue.
SINGLE = f"{DEFAULT_SYSTEM}-single"
CHAINED = f"{DEFAULT_SYSTEM}-chained"
BATCHED = f"{DEFAULT_SYSTEM}-batched"
BATCHED_CHAINED = f"{DEFAULT_SYSTEM}-batched-chained"
#: The default system's lanes, in the order the targets list them.
PATHS = (SINGLE, CHAINED, BATCHED, BATCHED_CHAINED)


@dataclass(frozen=True)
class Lane:
    """One column of the matrix: the textbook queue, or one path of one system."""

    name: str
    path_kind: str
    system: str
    single_owner: bool
    description: dict[str, Any]


def lanes_for(
    systems: Sequence[str], peers: Sequence[str] = (), scratch: Path | None = None
) -> list[Lane]:
    """The textbook baseline, then each system's single-job path and its batched path, then
    each peer library (described from a store opened in ``scratch``)."""
    lanes = [Lane(TEXTBOOK, TEXTBOOK, "", False, TEXTBOOK_DESCRIPTION)]
    for spec in systems:
        system = resolve_system(spec)
        kinds = (
            "single",
            *(["chained"] if system.capabilities.chained else []),
            *(["batched"] if system.capabilities.batching else []),
            *(
                ["batched-chained"]
                if system.capabilities.batching and system.capabilities.chained
                else []
            ),
        )
        lanes += [
            Lane(
                f"{system.name}-{kind}",
                kind,
                spec,
                system.capabilities.single_owner,
                system.describe(),
            )
            for kind in kinds
        ]
    for name in peers:
        peer = resolve_peer(name)
        where = Path(tempfile.mkdtemp(dir=scratch))
        try:
            description = peer.describe(where)
        finally:
            shutil.rmtree(where)
        lanes.append(Lane(name, PEER, name, False, description))
    return lanes
