"""What every queue must do for the lab (``crashqueuelab.suite.behaviour``), tried on every
system under test: the same checks the pytest plugin runs on a user's system."""

from __future__ import annotations

import pytest

from crashqueuelab.suite.behaviour import CHECKS, Check
from tests.systems.contract.conftest import FACTORIES, Harness, capabilities_of

PAIRS = [
    (name, check)
    for check in CHECKS
    for name in FACTORIES
    if check.not_for(capabilities_of(name)) is None
]
CASES = [pytest.param(name, check, id=f"{check.name}-{name}") for name, check in PAIRS]


@pytest.mark.parametrize(("harness", "check"), CASES, indirect=["harness"])
def test_every_system_keeps_the_contract(harness: Harness, check: Check) -> None:
    check.run(harness)


def test_every_check_applies_to_some_shipped_system() -> None:
    applied = {check.name for _, check in PAIRS}
    assert applied == {check.name for check in CHECKS}
