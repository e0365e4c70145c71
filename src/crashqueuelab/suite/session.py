"""A session that runs the lab's checks: the system resolved and the arguments read before
pytest collects anything, the checks' collector added at the top of the session, the
header line that says what runs, and the server a system lives on (PostgreSQL, Redis),
started as the command line starts one for a run.

Everything the user gave wrong (a system the lab cannot use, a crash mode this machine
cannot make, a node id the lab does not have) stops the session before it starts, as one
line of pytest's usage error (exit 4).
"""

from __future__ import annotations

import os
from collections.abc import Generator, Sequence
from contextlib import ExitStack

import pytest

from crashqueuelab.core.errors import (
    CrashModeUnavailable,
    CrashQueueLabError,
    InvalidInput,
    SystemUnavailable,
)
from crashqueuelab.lab.faults.crashmodes import check_crash_mode
from crashqueuelab.lab.runs.servers import servers_for
from crashqueuelab.servers.postgres import DSN_VARIABLE
from crashqueuelab.suite.checks import LabCheck, lab_checks
from crashqueuelab.suite.items import lab_root
from crashqueuelab.suite.selection import ROOT, split_arguments
from crashqueuelab.systems.registry import check_claims, resolve_system

#: The name the session's plugin is registered under.
PLUGIN_NAME = "crashqueuelab-checks"


class LabSession:
    """The hooks of a session that runs ``checks`` on the system ``spec`` names."""

    def __init__(self, spec: str, checks: Sequence[LabCheck], every: int) -> None:
        self.spec = spec
        self.checks = checks
        self.every = every
        self._servers = ExitStack()
        self._started = False
        self._unavailable: CrashQueueLabError | None = None

    def server_ready(self) -> None:
        """The server the system lives on, if any, started at the first check that runs (a
        session that runs none, as pytest-xdist's controller, starts none): the one
        ``CRASHQUEUELAB_POSTGRES_DSN`` names, else a throwaway one for the session. One
        that cannot start is every check's setup error, never a failure of the system."""
        if not self._started:
            self._started = True
            try:
                self._servers.enter_context(servers_for([self.spec], os.environ.get(DSN_VARIABLE)))
            except CrashQueueLabError as error:
                self._unavailable = error
        if self._unavailable is not None:
            # Raised in a check's setup, so pytest reports an error, not a failure.
            unavailable = self._unavailable
            pytest.fail(f"{type(unavailable).__name__}: {unavailable}", pytrace=False)

    def pytest_sessionfinish(self) -> None:
        self._servers.close()

    @pytest.hookimpl(wrapper=True)
    def pytest_make_collect_report(
        self, collector: pytest.Collector
    ) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
        report = yield
        # Beside what the session collected of the project: collected, and so counted and
        # reported, as pytest collects everything else.
        if isinstance(collector, pytest.Session) and report.passed:
            assert isinstance(report.result, list)
            report.result.append(lab_root(collector, self.checks, self.server_ready))
        return report

    def pytest_report_header(self) -> str:
        return (
            f"crashqueuelab: {len(self.checks)} of {self.every} checks on {self.spec}, node ids"
            f" {ROOT}::kind::name (the argument {ROOT} runs them alone)"
        )


def start(config: pytest.Config, *, spec: str, seed: int, crash_mode: str) -> None:
    """Register the session's plugin, or stop the session with a usage error."""
    try:
        system = resolve_system(spec)
        # The plugin's checks claim through the adapter, as the campaign's workers do.
        check_claims([spec], "pytest", "the pytest plugin")
        # The plugin's crash cases are the campaign's, on servers of their own: no
        # replicated server to fail over.
        check_crash_mode(crash_mode, system, failover=False)
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
