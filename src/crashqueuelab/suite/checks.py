"""Every check of the lab on one system, each with its place among the node ids: one per
contract rule (``behaviour.py``), per fencing probe, per crash point (a real child killed
there, its crash state and recovery judged, as the campaign does) and one for the seeded
model workload. A check that needs a capability the system does not declare carries the
reason it is skipped. A check whose every failure a weakness the system documents explains
(``System.documented``, sorted as every run sorts them: ``lab.runs.promises``) is an
expected failure, with the weakness and its link as the reason; anything else it found is a
failure."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from crashqueuelab.judges.findings import Anomaly, Kind
from crashqueuelab.lab.campaign.probes import PROBES
from crashqueuelab.lab.campaign.run import own_server
from crashqueuelab.lab.campaign.verdict import MODEL_LINE
from crashqueuelab.lab.runs.modes import POWER_LOSS
from crashqueuelab.lab.runs.promises import Finding, classify
from crashqueuelab.regression import Outcome, run_crash_point, run_probe
from crashqueuelab.suite.behaviour import CHECKS, Check
from crashqueuelab.suite.harness import Harness
from crashqueuelab.suite.selection import Parts
from crashqueuelab.systems.contract import System
from crashqueuelab.systems.registry import resolve_system


class LabFailure(Exception):
    """What the lab found wrong: its message is the whole report of a failing test."""


class Documented(Exception):
    """What the lab found is what the system documents of itself: its message is the
    reason of an expected failure."""


def judged(system: System, crash_mode: str, lines: list[Finding], report: str) -> Exception:
    """The failure of a check that found ``lines`` (findings, or lines without one):
    ``Documented`` when a weakness the system declares explains each, else ``LabFailure``
    with ``report``."""
    promises = classify(system, crash_mode, lines)
    if not promises["keeps_its_promises"] or not promises["weaker_as_documented"]:
        return LabFailure(report)
    weaknesses = "; ".join(
        f"{entry['what']} ({entry['source']})" for entry in promises["weaker_as_documented"]
    )
    return Documented(f"as {system.version} documents: {weaknesses}")


@dataclass(frozen=True)
class LabCheck:
    """One check: where it sits below the root, what it runs in a scratch directory of its
    own, and why it is skipped (None: it runs)."""

    parts: Parts
    run: Callable[[Path], None]
    skip: str | None = None


def lab_checks(spec: str, system: System, *, seed: int, crash_mode: str) -> list[LabCheck]:
    """Every check of the lab on ``system`` (the one ``spec`` names), in the order they run."""
    checks = [
        LabCheck(
            ("contract", rule.name), _contract(system, rule), rule.not_for(system.capabilities)
        )
        for rule in CHECKS
    ]
    capabilities = system.capabilities.to_json()
    for name, _, needs in PROBES:
        skip = None if needs is None or capabilities[needs] else f"the system declares no {needs}"
        checks.append(LabCheck(("probe", name), _probe(spec, system, name), skip))
    for point in system.crash_points:
        crash = _crash(spec, system, point.name, seed, crash_mode)
        skip = (
            "it runs on a server of its own, in the process crash mode only"
            if crash_mode == POWER_LOSS and own_server(point) is not None
            else None
        )
        checks.append(LabCheck(("crash-point", point.name), crash, skip))
    checks.append(LabCheck(("model-workload",), _model(spec, system, seed)))
    return checks


def _outcome(
    outcome: Outcome, system: System, crash_mode: str = "process", prefix: str = ""
) -> None:
    if not outcome.ok:
        lines = [
            prefix + found if isinstance(found, str) else found.within(prefix)
            for found in outcome.found()
        ]
        raise judged(system, crash_mode, lines, outcome.explain())


def _contract(system: System, check: Check) -> Callable[[Path], None]:
    def run(directory: Path) -> None:
        harness = Harness.open(system, directory / "store")
        try:
            check.run(harness)
        except AssertionError as failed:
            said = what_failed(failed)
            # The lab's words, without the values pytest's rewriting adds below them.
            assertion = said.splitlines()[0]
            finding = Anomaly(
                Kind.CONTRACT_RULE_FAILED,
                f"contract {check.name}: {assertion}",
                point=check.name,
                facts={"assertion": assertion},
            )
            raise judged(
                system,
                "process",
                [finding],
                f"contract check {check.name} failed (evidence in {directory}):\n{said}",
            ) from failed
        finally:
            harness.close()

    return run


def what_failed(failed: AssertionError) -> str:
    """The assertion's message; without one (its module was imported before pytest could
    rewrite its asserts), the statement that failed."""
    if str(failed):
        return str(failed)
    where = traceback.extract_tb(failed.__traceback__)[-1]
    return f"{(where.line or 'assert').strip()} ({Path(where.filename).name}, line {where.lineno})"


def _probe(spec: str, system: System, name: str) -> Callable[[Path], None]:
    return lambda directory: _outcome(run_probe(spec, name, directory), system)


def _crash(
    spec: str, system: System, point: str, seed: int, crash_mode: str
) -> Callable[[Path], None]:
    return lambda directory: _outcome(
        run_crash_point(spec, point, seed=seed, directory=directory, crash_mode=crash_mode),
        system,
        crash_mode,
    )


def _model(spec: str, system: System, seed: int) -> Callable[[Path], None]:
    def run(directory: Path) -> None:
        from crashqueuelab.lab.workloads.model import run_model_workload

        report = run_model_workload(resolve_system(spec), directory / "model", seed=seed)
        outcome = Outcome(
            report["ok"],
            list(report["anomalies"]),
            directory / "model",
            findings=list(report["findings"]),
        )
        _outcome(outcome, system, prefix=MODEL_LINE)

    return run
