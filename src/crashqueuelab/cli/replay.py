"""``chaos --replay DIR``: a chaos run's recorded parameters and fault schedule, delivered
again. The operating system still decides how the processes interleave, so a replay is the
same schedule, not the same run; the page says so."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from crashqueuelab.lab.faults.deploy import Rollout

#: Each option the replay sets, and the parameter of ``chaos.json`` it comes from.
_FROM_PARAMETERS = {
    "jobs": "jobs",
    "workers": "workers",
    "kills": "kills",
    "pauses": "pauses",
    "lease_ms": "lease_ms",
    "batch": "batch",
    "power_cuts": "power_cuts",
    "server_restarts": "server_restarts",
    "session_kills": "session_kills",
    "poison_jobs": "poison_jobs",
    "long_jobs": "long_jobs",
}
#: Options a run recorded only when it used them (network faults, deploys), and their
#: defaults.
_OPTIONAL_PARAMETERS = {
    "stalls": ("stalls", 0),
    "partitions": ("partitions", 0),
    "lost_replies": ("lost_replies", 0),
    "connection_resets": ("connection_resets", 0),
    "latency_ms": ("latency_ms", 0.0),
    "network_fault_ms": ("window_ms", None),
    "partition_workers": ("partition_workers", None),
    "bandwidth_bytes_s": ("bandwidth_bytes_s", 0),
    "deploys": ("deploys", 0),
    "failovers": ("failovers", 0),
    "held_commits": ("held_commits", 0),
    "grace_s": ("grace_s", Rollout.grace_s),
    "surge": ("surge", Rollout.surge),
    "replace": ("replace", str(Rollout.replace)),
}


def replayed(directory: Path) -> dict[str, Any]:
    """The options that run ``directory``'s chaos run again, schedule included."""
    try:
        report = json.loads((directory / "chaos.json").read_text(encoding="utf-8"))
        parameters = report["parameters"]
        options = {name: parameters[key] for name, key in _FROM_PARAMETERS.items()}
        options |= {
            name: parameters.get(key, default)
            for name, (key, default) in _OPTIONAL_PARAMETERS.items()
        }
        options |= {
            "seed": report["seed"],
            "system": report.get("system_spec", report["system"]["name"]),
            "crash_mode": report["crash_mode"],
            "schedule": report["schedule"],
            "replay_of": str(directory),
        }
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise argparse.ArgumentTypeError(
            f"{directory} holds no chaos run this version can replay ({type(error).__name__}:"
            f" {error})"
        ) from None
    return options


class ReplayAction(argparse.Action):
    """Sets every option of the replayed run; options given after it override them (the
    schedule must still match the fault counts, or the run is refused)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        try:
            options = replayed(Path(str(values)))
        except argparse.ArgumentTypeError as error:
            parser.error(f"--replay: {error}")
        for name, value in options.items():
            setattr(namespace, name, value)
