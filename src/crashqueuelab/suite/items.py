"""The lab's checks as pytest nodes: a ``crashqueuelab`` collector at the top of the
session, beside the project's own, a collector per kind of check below it (``contract``,
``probe``, ``crash-point``), and an item per check. Their node ids are paths of names, so
an id pytest prints can be given back to it (``selection.py``)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from crashqueuelab.suite.checks import Documented, LabCheck, LabFailure
from crashqueuelab.suite.selection import ROOT


class LabItem(pytest.Item):
    """One of the lab's checks on the system, run in a scratch directory of its own."""

    def __init__(self, *, check: LabCheck, ready: Callable[[], None], **kwargs: Any):
        super().__init__(**kwargs)
        self.check = check
        self.ready = ready

    def setup(self) -> None:
        if self.check.skip is not None:
            pytest.skip(self.check.skip)
        # What the check needs and cannot have (the system's server) is its setup's error.
        self.ready()

    def runtest(self) -> None:
        directory = Path(tempfile.mkdtemp(prefix="crashqueuelab-"))
        try:
            self.check.run(directory)
        except Documented as documented:
            pytest.xfail(f"{documented} (evidence in {directory})")
        # Reached only when the check passed: a failure's evidence stays where it says.
        shutil.rmtree(directory, ignore_errors=True)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, LabFailure):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[Path, None, str]:
        # The heading of a failure is the node id, which runs this check alone.
        return self.path, None, self.nodeid


class LabGroup(pytest.Collector):
    """The checks whose node ids share this collector's: the kinds below the root, then
    each check."""

    def __init__(
        self,
        *,
        checks: Sequence[LabCheck],
        depth: int,
        ready: Callable[[], None],
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.checks = checks
        self.depth = depth
        self.ready = ready

    def collect(self) -> list[pytest.Item | pytest.Collector]:
        # In the checks' order: each check that ends here, each group at its first check.
        order: list[LabCheck | str] = []
        below: dict[str, list[LabCheck]] = {}
        for check in self.checks:
            if len(check.parts) == self.depth + 1:
                order.append(check)
                continue
            name = check.parts[self.depth]
            if name not in below:
                order.append(name)
                below[name] = []
            below[name].append(check)
        return [
            LabItem.from_parent(self, name=entry.parts[-1], check=entry, ready=self.ready)
            if isinstance(entry, LabCheck)
            else LabGroup.from_parent(
                self, name=entry, checks=below[entry], depth=self.depth + 1, ready=self.ready
            )
            for entry in order
        ]


def lab_root(
    session: pytest.Session, checks: Sequence[LabCheck], ready: Callable[[], None]
) -> LabGroup:
    """The collector of ``checks``, at the top of the session: its node id is its name.
    ``ready`` readies what a check needs before it runs."""
    root: LabGroup = LabGroup.from_parent(
        session, name=ROOT, nodeid=ROOT, checks=checks, depth=0, ready=ready
    )
    return root
