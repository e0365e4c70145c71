"""Sorting a run's anomalies into broken promises and documented weaknesses."""

from __future__ import annotations

from dataclasses import replace

from crashqueuelab.lab.promises import classify
from crashqueuelab.systems import resolve_system
from crashqueuelab.systems.contract import Documented


def test_a_line_no_declared_weakness_explains_is_a_broken_promise() -> None:
    system = replace(
        resolve_system("sqlite"),
        documented=(
            Documented("no fencing", "https://example.org/docs", explains=("probe fence: *",)),
            Documented("not synced", "https://example.org/sync", crash_modes=("power-loss",)),
        ),
    )
    lines = ["probe fence: accepted", "case 01-x: lost", "model workload: job lost"]
    process = classify(system, "process", lines)
    assert process["broken_promises"] == ["case 01-x: lost", "model workload: job lost"]
    assert process["keeps_its_promises"] is False
    assert "breaks its own promise: case 01-x: lost (and 1 more)" in process["verdict"]
    power = classify(system, "power-loss", lines)
    assert power["broken_promises"] == ["model workload: job lost"]
    assert [entry["lines"] for entry in power["weaker_as_documented"]] == [1, 1]
    clean = classify(system, "process", [])
    assert clean["verdict"].endswith("keeps its promises and the lab's contract")
