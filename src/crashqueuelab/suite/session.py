"""A session that runs the lab's checks: the system resolved and the arguments read before
pytest collects anything, the checks' collector added at the top of the session, and the
header line that says what runs.

Everything the user gave wrong (a system the lab cannot use, a crash mode this machine
cannot make, a node id the lab does not have) stops the session before it starts, as one
line of pytest's usage error (exit 4).
"""

from __future__ import annotations

from collections.abc import Generator, Sequence

import pytest

from crashqueuelab.core.errors import CrashModeUnavailable, InvalidInput, SystemUnavailable
from crashqueuelab.lab.faults.crashmodes import check_crash_mode
from crashqueuelab.suite.checks import LabCheck, lab_checks
from crashqueuelab.suite.items import lab_root
from crashqueuelab.suite.selection import ROOT, split_arguments
from crashqueuelab.systems.registry import resolve_system

#: The name the session's plugin is registered under.
PLUGIN_NAME = "crashqueuelab-checks"


class LabSession:
    """The hooks of a session that runs ``checks`` on the system ``spec`` names."""

    def __init__(self, spec: str, checks: Sequence[LabCheck], every: int) -> None:
        self.spec = spec
        self.checks = checks
        self.every = every

    @pytest.hookimpl(wrapper=True)
    def pytest_make_collect_report(
        self, collector: pytest.Collector
    ) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
        report = yield
        # Beside what the session collected of the project: collected, and so counted and
        # reported, as pytest collects everything else.
        if isinstance(collector, pytest.Session) and report.passed:
            assert isinstance(report.result, list)
            report.result.append(lab_root(collector, self.checks))
        return report

    def pytest_report_header(self) -> str:
        return (
            f"crashqueuelab: {len(self.checks)} of the lab's {self.every} checks on"
            f" {self.spec}, under {ROOT}:: (the argument {ROOT} runs them alone)"
        )


def start(config: pytest.Config, *, spec: str, seed: int, crash_mode: str) -> None:
    """Register the session's plugin, or stop the session with a usage error."""
    try:
        system = resolve_system(spec)
        check_crash_mode(crash_mode, system)
    except SystemUnavailable as error:
        raise pytest.UsageError(str(error)) from None
    except (InvalidInput, CrashModeUnavailable) as error:
        raise pytest.UsageError(
            f"--crashqueuelab-crash-mode {crash_mode}: {error.reason}"
        ) from None
    checks = lab_checks(spec, system, seed=seed, crash_mode=crash_mode)
    selection, rest = split_arguments(config.args)
    unmatched = selection.unmatched([check.parts for check in checks])
    if unmatched:
        raise pytest.UsageError(f"not found: {unmatched[0]} (the lab has no such check on {spec})")
    config.args = rest
    chosen = [check for check in checks if selection.selects(check.parts)]
    config.pluginmanager.register(LabSession(spec, chosen, len(checks)), PLUGIN_NAME)
