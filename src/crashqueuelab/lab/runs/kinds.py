"""The one registry of run kinds: the command that makes each, and the record file its
directory holds. The command line keeps an interrupted run's record under this name; the
pages tell a directory's kind by it (each kind has its view in ``lab.pages``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunKind:
    #: The command that makes a run of this kind (``crashqueuelab COMMAND``).
    command: str
    #: The record a run of this kind writes into its output directory.
    record: str


SHOWCASE = RunKind("showcase", "showcase.json")
CAMPAIGN = RunKind("campaign", "campaign.json")
CHAOS = RunKind("chaos", "chaos.json")
BENCH = RunKind("bench", "bench.json")
DEMO = RunKind("demo", "comparison.json")
MUTANTS = RunKind("mutants", "mutants.json")
VERSIONS = RunKind("versions", "versions.json")
HEARTBEATS = RunKind("heartbeats", "heartbeats.json")
DEPLOYS = RunKind("deploys", "deploys.json")
DISK_FAULTS = RunKind("disk-faults", "disk-faults.json")
FAILOVER = RunKind("failover", "failover.json")
POWER_CUT = RunKind("power-cut", "power-cut.json")

#: Every kind, in the order a directory is recognised by.
KINDS: tuple[RunKind, ...] = (
    SHOWCASE,
    CAMPAIGN,
    CHAOS,
    BENCH,
    DEMO,
    MUTANTS,
    VERSIONS,
    HEARTBEATS,
    DEPLOYS,
    DISK_FAULTS,
    FAILOVER,
    POWER_CUT,
)
BY_COMMAND = {kind.command: kind for kind in KINDS}


def kind_of(directory: Path) -> RunKind | None:
    """The kind of run ``directory`` holds (by its record), or None."""
    return next((kind for kind in KINDS if (directory / kind.record).is_file()), None)
