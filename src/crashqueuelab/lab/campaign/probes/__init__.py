"""Fencing probes: short scripted races that every queue must refuse, run on every system.

Crashes are not the only way to break a queue: a holder whose lease expired, a worker id
reused after a restart (procrastinate #1518, Oban #862), an acknowledgement landing exactly
at the deadline. Each probe drives the system through its contract on a fresh store and
names the job and what happened when the system accepts what it must refuse. A probe that
needs a capability the system declares it lacks does not apply to it, and the report says
so; a probe the lab could not open the system for did not run (a setup error, never a
finding).

``harness.py`` holds what every probe runs in; the probes are grouped by what they probe
(``leases.py``, ``lifecycle.py``, ``batches.py``, ``reports.py``, ``carried.py``);
``runner.py`` lists them in order and runs them.
"""

from __future__ import annotations

from crashqueuelab.lab.campaign.probes.harness import ProbeFailed
from crashqueuelab.lab.campaign.probes.runner import (
    FAILED,
    NOT_APPLICABLE,
    NOT_RUN,
    PASSED,
    PROBES,
    Probe,
    check_probe_names,
    probe_finding,
    run_probe,
    run_probes,
    status_of,
)

__all__ = [
    "FAILED",
    "NOT_APPLICABLE",
    "NOT_RUN",
    "PASSED",
    "PROBES",
    "Probe",
    "ProbeFailed",
    "check_probe_names",
    "probe_finding",
    "run_probe",
    "run_probes",
    "status_of",
]
