"""How a chaos page tells network faults: each anomaly's evidence carries the windows that
overlapped it, and the figures say what the proxy saw."""

from __future__ import annotations

from crashqueuelab.lab.chaos.worklog import WorkerLog
from crashqueuelab.lab.pages.chaos import _explain
from crashqueuelab.lab.pages.network import legend, network_rows, network_title


def test_a_duplicated_effect_is_told_beside_the_stall_that_held_its_first_holder() -> None:
    first, second = WorkerLog(), WorkerLog()
    first.add("claim k t1 100.5 100.4\nacking k t1 102.0\nstale k t1 102.1\n")
    second.add("claim k t2 101.2 101.1\nacking k t2 101.3\nack k t2 101.4\n")
    faults = [
        {"kind": "stall", "worker_id": "worker-0.1", "at_s": 0.6, "until_s": 1.95},
        {"kind": "stall", "worker_id": "worker-0.1", "at_s": 9.0, "until_s": 9.5},
        {"kind": "partition", "at_s": 0.1, "until_s": 0.2},
        {"kind": "connection reset", "worker_id": "worker-1.1", "at_s": 1.0},
    ]
    [explained] = _explain(
        ["job k: 2 durable effects in the idempotent ledger"],
        {"worker-0.1": first, "worker-1.1": second},
        100.0,
        faults,
    )
    evidence = explained["evidence"]
    assert evidence[0] == "0.500 s: worker-0.1 claimed it (lease t1)"
    stall = next(line for line in evidence if line.startswith("stalled"))
    assert stall == (
        "stalled worker-0.1 (bytes held both ways, nothing closed) from 0.600 s to 1.950 s"
    )
    # Windows that ended before the first line or began after the last are left out;
    # instants are not windows.
    assert not any("9.000" in line or "cut the server off" in line for line in evidence)
    assert not any("reset" in line for line in evidence)


def test_the_figures_and_the_legend_say_what_the_proxy_saw() -> None:
    report = {
        "network_faults_delivered": {"stall": 2, "partition": 0, "lost replies": 1},
        "network": {
            "plan": {"window_ms": 750.0, "latency_ms": 2.0},
            "paths": {
                "worker-0": {"connections": 3, "lost_replies": 1},
                "maintenance": {"connections": 1, "refused": 2, "reset": 1},
            },
        },
    }
    faults, connections = network_rows(report)
    assert faults[1] == "2 / 0 / 1 / 0"
    assert "each window 750 ms" in faults[2]
    assert "with 2 ms added each way" in faults[2]
    assert connections[1] == "4"
    assert connections[2] == (
        "1 lost an answer and were reset after their window, 1 reset by a fault, 2 found the"
        " server down"
    )
    assert legend(report) == ", stalls shaded (lime), lost replies shaded (magenta)"
    assert network_rows({"network": None}) == []
    assert network_title({"kind": "connection reset", "worker_id": "w", "at_s": 1.5}) == (
        "reset w's connections at 1.50 s"
    )
