"""One failing piece of the lab's evidence run again, against a system named as
``package.module:factory`` (or the name of a system the lab ships, or a pinned release such
as ``huey==3.2.1``): a crash point, a probe, a model workload's recorded schedule, a chaos
run's fault schedule. The shrinker calls these while it makes a failure small; an exported
reproducer calls them through ``crashqueuelab.regression``, their public face.

Each rerun is judged twice: by the lab's contract (``ok``, ``anomalies``) and against the
system's own promises (``broken_promises``, ``weaknesses``: ``lab.runs.promises``), so that a
test can tell a bug from a weakness the system documents. What the rerun needs around it
(the adapter's directory on the path, a server, a release's environment) is
``preparation``'s; run as ``python -m`` it makes one rerun a JSON request on stdin asks for
(what a pinned release's rerun runs in the release's environment).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crashqueuelab.core.errors import CrashQueueLabError
from crashqueuelab.judges.findings import Anomaly, restored
from crashqueuelab.lab.campaign.probes import probe_finding, run_probes
from crashqueuelab.lab.campaign.run import run_campaign
from crashqueuelab.lab.campaign.verdict import MODEL_LINE
from crashqueuelab.lab.chaos.longjobs import DEFAULT_LONG_JOBS
from crashqueuelab.lab.chaos.poison import DEFAULT_POISON_JOBS
from crashqueuelab.lab.chaos.run import run_chaos
from crashqueuelab.lab.faults.deploy import Replace, Rollout
from crashqueuelab.lab.faults.network.plan import NetworkPlan
from crashqueuelab.lab.reproducers.preparation import (
    prepared,
    release_elsewhere,
    rerun_elsewhere,
    servers_named,
)
from crashqueuelab.lab.runs.modes import PROCESS
from crashqueuelab.lab.runs.promises import classify
from crashqueuelab.lab.workloads.model import run_model_workload


class DocumentedWeakness(AssertionError):
    """The rerun failed the lab's contract only in ways the system documents: what the
    exported test of a documented weakness expects (``pytest.mark.xfail(raises=...)``)."""


@dataclass(frozen=True)
class Outcome:
    """What the rerun found: ``ok`` is False while the system still fails."""

    ok: bool
    anomalies: list[str]
    #: Where the rerun's store, logs and report are kept.
    directory: Path
    #: What each weakness the system documents that showed in this rerun says
    #: (``Documented.what``).
    weaknesses: list[str] = field(default_factory=list)
    #: The anomalies no documented weakness explains: the system's bugs.
    broken_promises: list[str] = field(default_factory=list)
    #: The findings of the anomalies, as records keep them (``judges.findings``).
    findings: list[dict[str, Any]] = field(default_factory=list)

    def found(self) -> list[Anomaly | str]:
        """Each anomaly as its finding, or as its line where the rerun kept none."""
        return restored(self.anomalies, self.findings)

    def explain(self) -> str:
        """The anomalies, one per line, and where the evidence lies: an assertion message."""
        if self.ok:
            return f"no anomaly (evidence in {self.directory})"
        return self._listed(self.anomalies, "")

    def _listed(self, lines: list[str], what: str) -> str:
        lines_text = "\n".join(f"- {line}" for line in lines)
        count = f"{len(lines)} anomal{'y' if len(lines) == 1 else 'ies'}{what}"
        return f"{count} (evidence in {self.directory}):\n{lines_text}"

    def assert_documented(self, weakness: str) -> None:
        """For the test of a weakness the system documents (``weakness``: its ``what``):
        an AssertionError naming the anomalies no documented weakness explains, if any (a
        bug); else DocumentedWeakness while ``weakness`` shows; nothing once it does not."""
        if self.broken_promises:
            raise AssertionError(
                self._listed(self.broken_promises, " that no documented weakness explains")
            )
        if weakness in self.weaknesses:
            raise DocumentedWeakness(f"as documented: {weakness}\n{self.explain()}")

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "anomalies": self.anomalies,
            "directory": str(self.directory),
            "weaknesses": self.weaknesses,
            "broken_promises": self.broken_promises,
            "findings": self.findings,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Outcome:
        return cls(
            bool(data["ok"]),
            list(data["anomalies"]),
            Path(data["directory"]),
            list(data["weaknesses"]),
            list(data["broken_promises"]),
            list(data.get("findings", [])),
        )


def _judged(
    ok: bool,
    anomalies: list[str],
    directory: Path,
    promises: Mapping[str, Any],
    findings: list[dict[str, Any]] | None = None,
) -> Outcome:
    """An outcome with its anomalies sorted as ``promises`` (``classify``'s) sorts them."""
    return Outcome(
        ok,
        anomalies,
        directory,
        [entry["what"] for entry in promises["weaker_as_documented"]],
        list(promises["broken_promises"]),
        list(findings or []),
    )


def _elsewhere(function: str, **keywords: Any) -> Outcome | None:
    """The outcome of ``function``'s rerun made in the release's environment, when its
    ``system`` (or its run's ``system_spec``) pins a release that is not installed here;
    None when the rerun is made here."""
    spec = keywords["run"]["system_spec"] if "run" in keywords else keywords["system"]
    pin = release_elsewhere(str(spec))
    if pin is None:
        return None
    request = {name: str(value) if isinstance(value, Path) else value
               for name, value in keywords.items()}  # fmt: skip
    return Outcome.from_json(rerun_elsewhere(pin, function, request))


def replay_model_workload(
    system: str, schedule: Mapping[str, Any], directory: Path, *, import_path: str | None = None
) -> Outcome:
    """The model-driven workload, making exactly the choices of ``schedule`` (its ``seed``
    and ``choices``), judged against the store afterwards. ``import_path``: the directory
    the system's module was imported from when the test was exported."""
    elsewhere = _elsewhere(
        "replay_model_workload", system=system, schedule=schedule, directory=directory
    )
    if elsewhere is not None:
        return elsewhere
    chosen = prepared(system, import_path)
    run = Path(directory) / "model"
    with servers_named(system, chosen):
        report = run_model_workload(
            chosen, run, seed=int(schedule["seed"]), schedule=dict(schedule)
        )
    anomalies, findings = list(report["anomalies"]), list(report["findings"])
    lines = [
        f"{MODEL_LINE}{line}" if isinstance(line, str) else line.within(MODEL_LINE)
        for line in restored(anomalies, findings)
    ]
    return _judged(report["ok"], anomalies, run, classify(chosen, PROCESS, lines), findings)


def run_crash_point(
    system: str,
    crash_point: str,
    *,
    seed: int,
    directory: Path,
    crash_mode: str = PROCESS,
    import_path: str | None = None,
    crash_states: int | None = None,
) -> Outcome:
    """One crash point of the campaign: a child dies there (or the power is cut, with
    ``crash_mode="power-loss"``, judging at most ``crash_states`` crash states as the
    campaign did), and the crash state and the recovery are judged. It passes when nothing
    it judged failed: the choices a bound leaves unjudged are the campaign's to say."""
    bounded = {} if crash_states is None else {"crash_states": crash_states}
    elsewhere = _elsewhere(
        "run_crash_point", system=system, crash_point=crash_point, seed=seed,
        directory=directory, crash_mode=crash_mode, **bounded,
    )  # fmt: skip
    if elsewhere is not None:
        return elsewhere
    chosen = prepared(system, import_path)
    run = Path(directory) / "campaign"
    with servers_named(system, chosen):
        report = run_campaign(
            run,
            seed=seed,
            system=system,
            crash_mode=crash_mode,
            crash_points=[crash_point],
            probes=[],
            crash_states=crash_states,
        )
    return _judged(
        report["passed_what_ran"],
        list(report["anomalies"]),
        run,
        report["promises"],
        report["findings"],
    )


def run_probe(
    system: str, probe: str, directory: Path, *, import_path: str | None = None
) -> Outcome:
    """One fencing probe, on a fresh store."""
    elsewhere = _elsewhere("run_probe", system=system, probe=probe, directory=directory)
    if elsewhere is not None:
        return elsewhere
    chosen = prepared(system, import_path)
    run = Path(directory) / "probes"
    with servers_named(system, chosen):
        results = run_probes(chosen, run, only=[probe])
    # A probe that does not apply to the system (ok null) asks nothing of it.
    failed = [probe_finding(result) for result in results if result["ok"] is False]
    lines = [line if isinstance(line, str) else line.text for line in failed]
    findings = [line.to_json() for line in failed if isinstance(line, Anomaly)]
    return _judged(not failed, lines, run, classify(chosen, PROCESS, failed), findings)


def replay_chaos(
    run: Mapping[str, Any], directory: Path, *, attempts: int = 3, import_path: str | None = None
) -> Outcome:
    """A chaos run delivering ``run``'s fault schedule (``run`` names the system as
    ``system_spec``, its ``seed``, ``crash_mode``, ``parameters`` and ``schedule``, as
    ``chaos.json`` does), up to ``attempts`` times: the operating system decides how the
    processes interleave, so the first run that fails is the outcome, else the last."""
    system = str(run["system_spec"])
    elsewhere = _elsewhere("replay_chaos", run=run, directory=directory, attempts=attempts)
    if elsewhere is not None:
        return elsewhere
    chosen = prepared(system, import_path)
    with servers_named(system, chosen):
        return _replay_chaos(run, Path(directory), attempts)


def _replay_chaos(run: Mapping[str, Any], directory: Path, attempts: int) -> Outcome:
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
            deploys=counts["deploy"],
            rollout=Rollout(
                grace_s=float(sizes.get("grace_s", Rollout.grace_s)),
                surge=int(sizes.get("surge", Rollout.surge)),
                replace=Replace(sizes.get("replace", Rollout.replace)),
            ),
        )
        outcome = _judged(report["ok"], list(report["reasons"]), target, report["promises"])
        if not outcome.ok:
            break
    return outcome


#: What a request to ``python -m crashqueuelab.lab.reproducers.rerun`` may ask for.
REQUESTS: dict[str, Callable[..., Outcome]] = {
    "replay_model_workload": replay_model_workload,
    "run_crash_point": run_crash_point,
    "run_probe": run_probe,
    "replay_chaos": replay_chaos,
}


def main(request: str) -> tuple[int, str]:
    """One rerun, as the JSON ``request`` (``function``, ``keywords``) asks: the exit code
    and the JSON printed (the outcome, or the lab's error that stopped it)."""
    asked = json.loads(request)
    try:
        outcome = REQUESTS[asked["function"]](**asked["keywords"])
    except CrashQueueLabError as error:
        return 1, json.dumps({"error": f"{error.kind}: {error}"})
    return 0, json.dumps(outcome.to_json())


if __name__ == "__main__":
    code, printed = main(sys.stdin.read())
    print(printed)
    raise SystemExit(code)
