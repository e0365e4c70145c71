"""One failing piece of the lab's evidence run again, against a system named as
``package.module:factory`` (or the name of a system the lab ships): a crash point, a probe,
a model workload's recorded schedule, a chaos run's fault schedule. The shrinker calls
these while it makes a failure small; an exported reproducer calls them through
``crashqueuelab.regression``, their public face."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crashqueuelab.lab.campaign.probes import run_probes
from crashqueuelab.lab.campaign.run import run_campaign
from crashqueuelab.lab.chaos.longjobs import DEFAULT_LONG_JOBS
from crashqueuelab.lab.chaos.poison import DEFAULT_POISON_JOBS
from crashqueuelab.lab.chaos.run import run_chaos
from crashqueuelab.lab.faults.network.plan import NetworkPlan
from crashqueuelab.lab.runs.modes import PROCESS
from crashqueuelab.lab.workloads.model import run_model_workload
from crashqueuelab.systems.registry import resolve_system


@dataclass(frozen=True)
class Outcome:
    """What the rerun found: ``ok`` is False while the system still fails."""

    ok: bool
    anomalies: list[str]
    #: Where the rerun's store, logs and report are kept.
    directory: Path

    def explain(self) -> str:
        """The anomalies, one per line, and where the evidence lies: an assertion message."""
        if self.ok:
            return f"no anomaly (evidence in {self.directory})"
        lines = "\n".join(f"- {anomaly}" for anomaly in self.anomalies)
        count = f"{len(self.anomalies)} anomal{'y' if len(self.anomalies) == 1 else 'ies'}"
        return f"{count} (evidence in {self.directory}):\n{lines}"


def replay_model_workload(system: str, schedule: Mapping[str, Any], directory: Path) -> Outcome:
    """The model-driven workload, making exactly the choices of ``schedule`` (its ``seed``
    and ``choices``), judged against the store afterwards."""
    run = Path(directory) / "model"
    report = run_model_workload(
        resolve_system(system), run, seed=int(schedule["seed"]), schedule=dict(schedule)
    )
    return Outcome(report["ok"], list(report["anomalies"]), run)


def run_crash_point(
    system: str, crash_point: str, *, seed: int, directory: Path, crash_mode: str = PROCESS
) -> Outcome:
    """One crash point of the campaign: a child dies there (or the power is cut, with
    ``crash_mode="power-loss"``), and the crash state and the recovery are judged."""
    run = Path(directory) / "campaign"
    report = run_campaign(
        run,
        seed=seed,
        system=system,
        crash_mode=crash_mode,
        crash_points=[crash_point],
        probes=[],
    )
    return Outcome(report["ok"], list(report["anomalies"]), run)


def run_probe(system: str, probe: str, directory: Path) -> Outcome:
    """One fencing probe, on a fresh store."""
    run = Path(directory) / "probes"
    results = run_probes(resolve_system(system), run, only=[probe])
    anomalies = [f"probe {result['name']}: {result['detail']}" for result in results]
    # A probe that does not apply to the system (ok null) asks nothing of it.
    failed = [
        line for line, result in zip(anomalies, results, strict=True) if result["ok"] is False
    ]
    return Outcome(not failed, failed, run)


def replay_chaos(run: Mapping[str, Any], directory: Path, *, attempts: int = 3) -> Outcome:
    """A chaos run delivering ``run``'s fault schedule (``run`` names the system as
    ``system_spec``, its ``seed``, ``crash_mode``, ``parameters`` and ``schedule``, as
    ``chaos.json`` does), up to ``attempts`` times: the operating system decides how the
    processes interleave, so the first run that fails is the outcome, else the last."""
    counts = Counter(fault["kind"] for fault in run["schedule"])
    sizes = run["parameters"]
    network = NetworkPlan.from_json(sizes)
    network = NetworkPlan(
        stalls=counts["stall"],
        partitions=counts["partition"],
        lost_replies=counts["lost replies"],
        connection_resets=counts["connection reset"],
        latency_ms=network.latency_ms,
        window_ms=network.window_ms,
    )
    outcome = Outcome(True, [], Path(directory))
    for attempt in range(attempts):
        target = Path(directory) / f"chaos-{attempt + 1}"
        report = run_chaos(
            target,
            seed=int(run["seed"]),
            jobs=sizes["jobs"],
            workers=sizes["workers"],
            kills=counts["SIGKILL"],
            pauses=counts["SIGSTOP"],
            lease_ms=sizes["lease_ms"],
            batch=sizes["batch"],
            system=run["system_spec"],
            crash_mode=run.get("crash_mode", PROCESS),
            power_cuts=counts["power cut"],
            poison_count=sizes.get("poison_jobs", DEFAULT_POISON_JOBS),
            long_count=sizes.get("long_jobs", DEFAULT_LONG_JOBS),
            schedule=run["schedule"],
            network=network,
        )
        outcome = Outcome(report["ok"], list(report["reasons"]), target)
        if not outcome.ok:
            break
    return outcome
