"""The tests the pytest plugin (``crashqueuelab_pytest``) adds to a session given
``--crashqueuelab-system package.module:factory``: the lab's checks on that system.

One test per contract check
(``behaviour.py``), per fencing probe, per crash point (a real child killed there, its crash
state and recovery judged, as the campaign does) and one for the seeded model workload. A
check or probe that needs a capability the system does not declare is skipped with the
reason. Each test keeps its evidence in a directory of its own under the system temp
directory and names it when it fails.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from crashqueuelab.lab.campaign.probes import PROBES
from crashqueuelab.regression import Outcome, run_crash_point, run_probe
from crashqueuelab.suite.behaviour import CHECKS, Check
from crashqueuelab.suite.harness import Harness
from crashqueuelab.systems.contract import System
from crashqueuelab.systems.registry import resolve_system


class LabFailure(Exception):
    """What the lab found wrong: its message is the whole report of a failing test."""


def _outcome(outcome: Outcome) -> None:
    if not outcome.ok:
        raise LabFailure(outcome.explain())


class LabItem(pytest.Item):
    """One of the lab's checks on the system, run in a scratch directory of its own."""

    def __init__(self, *, run: Callable[[Path], None], skip: str | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.run = run
        self.skip = skip

    def runtest(self) -> None:
        if self.skip is not None:
            pytest.skip(self.skip)
        directory = Path(tempfile.mkdtemp(prefix="crashqueuelab-"))
        self.run(directory)
        # Reached only when the check passed: a failure's evidence stays where it says.
        shutil.rmtree(directory, ignore_errors=True)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, LabFailure):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, 0, self.name


class LabChecks(pytest.Collector):
    """Every check of the lab on one system."""

    def __init__(self, *, spec: str, seed: int, crash_mode: str, **kwargs: Any):
        super().__init__(**kwargs)
        self.spec, self.seed, self.crash_mode = spec, seed, crash_mode

    def _item(self, name: str, run: Callable[[Path], None], skip: str | None = None) -> LabItem:
        item: LabItem = LabItem.from_parent(self, name=name, run=run, skip=skip)
        return item

    def collect(self) -> list[pytest.Item | pytest.Collector]:
        system = resolve_system(self.spec)
        items: list[pytest.Item | pytest.Collector] = []
        for check in CHECKS:
            items.append(
                self._item(f"contract::{check.name}", _contract(system, check),
                           check.not_for(system.capabilities))
            )  # fmt: skip
        capabilities = system.capabilities.to_json()
        for name, _, needs in PROBES:
            skip = (
                None if needs is None or capabilities[needs] else f"the system declares no {needs}"
            )
            items.append(self._item(f"probe::{name}", self._probe(name), skip))
        for point in system.crash_points:
            items.append(self._item(f"crash-point::{point.name}", self._crash(point.name)))
        items.append(self._item("model-workload", self._model))
        return items

    def _probe(self, name: str) -> Callable[[Path], None]:
        return lambda directory: _outcome(run_probe(self.spec, name, directory))

    def _crash(self, point: str) -> Callable[[Path], None]:
        return lambda directory: _outcome(
            run_crash_point(
                self.spec, point, seed=self.seed, directory=directory, crash_mode=self.crash_mode
            )
        )

    def _model(self, directory: Path) -> None:
        from crashqueuelab.lab.workloads.model import run_model_workload

        report = run_model_workload(resolve_system(self.spec), directory / "model", seed=self.seed)
        _outcome(Outcome(report["ok"], list(report["anomalies"]), directory / "model"))


def _contract(system: System, check: Check) -> Callable[[Path], None]:
    def run(directory: Path) -> None:
        harness = Harness.open(system, directory / "store")
        try:
            check.run(harness)
        except AssertionError as failed:
            raise LabFailure(
                f"contract check {check.name} failed (evidence in {directory}):\n{failed}"
            ) from failed
        finally:
            harness.close()

    return run


def add_checks(
    session: pytest.Session, items: list[pytest.Item], *, spec: str, seed: int, crash_mode: str
) -> None:
    """Append every check of the lab on the system ``spec`` names to the session's items."""
    checks = LabChecks.from_parent(
        session, name=f"crashqueuelab[{spec}]", spec=spec, seed=seed, crash_mode=crash_mode
    )
    items.extend(item for item in checks.collect() if isinstance(item, pytest.Item))
