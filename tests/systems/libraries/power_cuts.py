"""A library on Redis in the power-loss campaign (each case's Redis on the power-loss disk),
at the two persistences its systems name: the append-only file synced on every write must
lose no job Redis answered for; RDB snapshots take back every job since the server started
(no snapshot was due), which Redis documents."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from crashqueuelab.lab.campaign.run import run_campaign


def _power_loss(directory: Path, system: str, crash_points: list[str]) -> dict[str, Any]:
    from crashqueuelab.lab.faults.powerloss.disk import unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    return run_campaign(
        directory,
        seed=3,
        system=system,
        crash_mode="power-loss",
        crash_points=crash_points,
        probes=["idempotent_submit"],
    )


def keeps_every_answered_job(directory: Path, system: str, crash_points: list[str]) -> None:
    """No crash state of ``crash_points`` loses acknowledged work, and every case passes."""
    kept = _power_loss(directory, system, crash_points)
    assert kept["summary"]["states_losing_acknowledged_work"] == 0
    assert all(case["passed"] for case in kept["cases"]), kept["cases"]
    assert kept["promises"]["keeps_its_promises"] is True, kept["promises"]


def loses_the_job_as_rdb_documents(directory: Path, system: str, crash_point: str) -> str:
    """Every crash state of ``crash_point`` loses acknowledged work, explained by Redis's RDB
    snapshots; the case's first anomaly line."""
    lost = _power_loss(directory, system, [crash_point])
    [case] = lost["cases"]
    assert case["states_passed"] == 0
    promises = lost["promises"]
    assert promises["keeps_its_promises"] is True, promises["broken_promises"]
    whats = [entry["what"] for entry in promises["weaker_as_documented"]]
    assert any(what.startswith("RDB snapshots") for what in whats), whats
    first: str = case["anomalies"][0]
    return first
