"""Sorting a run's anomalies into broken promises and documented weaknesses."""

from __future__ import annotations

from dataclasses import replace

from crashqueuelab.lab.runs.promises import classify
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


def test_a_weakness_against_a_fault_explains_the_lines_of_runs_that_delivered_it() -> None:
    system = replace(
        resolve_system("sqlite"),
        documented=(
            Documented("late acks", "https://example.org/a", explains=("job *: late*",)),
            Documented("no snapshot", "https://example.org/b", faults=("server restart",)),
        ),
    )
    lines = ["job a: late acknowledgement accepted", "job b: missing from the store (lost)"]
    without = classify(system, "process", lines, ["SIGKILL"])
    assert without["broken_promises"] == ["job b: missing from the store (lost)"]
    restarted = classify(system, "process", lines, ["SIGKILL", "server restart"])
    assert restarted["broken_promises"] == []
    # The first weakness that explains a line takes it.
    assert [entry["lines"] for entry in restarted["weaker_as_documented"]] == [1, 1]
