"""Every system under the same contract tests: the reference queue and every adapter.

A defect the lab has measured in a third-party queue is marked as an expected failure with
the measurement as its reason (strict: if the queue gets fixed, the test says so).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from crashqueuelab.suite.harness import LEASE_US, RETRY, Harness, open_client
from crashqueuelab.systems import System, resolve_system
from crashqueuelab.systems.contract import Capabilities
from tests.conftest import EXAMPLES
from tests.systems.contract.model import reference_system

__all__ = ["LEASE_US", "RETRY", "Harness", "open_client"]

NO_EXPIRY = "measured: persist-queue has no lease expiry; a task returns only on reopen"
NO_FENCING = "measured: persist-queue accepts any acknowledgement of a task id"
NO_DELAY = "measured: persist-queue's nack makes a task ready at once (no retry delay)"
RESUMES_ALL = "measured: reopening persist-queue resumes every unacknowledged task"
#: (system, contract check or test) -> why the lab expects it to fail.
EXPECTED_DEFECTS = {
    ("persist-queue", "an_expired_holder_is_refused_and_the_job_goes_to_another"): NO_EXPIRY,
    ("persist-queue", "an_acknowledgement_at_the_deadline_is_refused"): NO_FENCING,
    ("persist-queue", "the_live_holder_acknowledges_once"): NO_FENCING,
    ("persist-queue", "a_failure_waits_its_delay_then_the_dead_letter_takes_it"): NO_DELAY,
    ("persist-queue", "a_reopened_store_keeps_every_job_and_lease"): RESUMES_ALL,
    ("persist-queue", "test_the_state_machine_agrees_with_the_reference"): NO_EXPIRY,
}


def _tinyqueue() -> System:
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    return resolve_system("tiny_adapter:tiny_system")


FACTORIES: dict[str, Callable[[], System]] = {
    "reference": reference_system,
    "sqlite": lambda: resolve_system("sqlite"),
    "postgres": lambda: resolve_system("postgres"),
    "walqueue": lambda: resolve_system("walqueue"),
    "persist-queue": lambda: resolve_system("persist-queue"),
    "tinyqueue": _tinyqueue,
}


def capabilities_of(name: str) -> Capabilities:
    # Collection must not need a server: the PostgreSQL system's capabilities are static.
    if name == "postgres":
        from crashqueuelab.systems.postgres import CAPABILITIES

        return CAPABILITIES
    return FACTORIES[name]().capabilities


@pytest.fixture
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    name = request.param
    check = getattr(request.node, "callspec", None) and request.node.callspec.params.get("check")
    reason = EXPECTED_DEFECTS.get((name, check.name if check else request.node.originalname))
    if reason is not None:
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))
    if name == "postgres":
        request.getfixturevalue("postgres_dsn")
    harness = Harness.open(FACTORIES[name](), tmp_path / "store")
    try:
        yield harness
    finally:
        harness.close()
