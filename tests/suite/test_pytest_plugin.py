"""The pytest plugin: nothing without its option; with it, the lab's checks on the named
system, each failure in the lab's words with where its evidence is kept."""

from __future__ import annotations

import pytest

from crashqueuelab.lab.campaign.probes import PROBES
from crashqueuelab.suite.behaviour import CHECKS
from crashqueuelab.systems.registry import resolve_system
from tests.conftest import EXAMPLES

pytest_plugins = ["pytester"]


@pytest.fixture(autouse=True)
def examples_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))


def test_without_its_option_the_plugin_adds_nothing(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_mine="def test_mine() -> None:\n    pass\n")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_a_correct_system_passes_every_check_that_applies(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_mine="def test_mine() -> None:\n    pass\n")
    result = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", "-rs", "--crashqueuelab-system", "tiny_adapter:tiny_system"
    )
    system = resolve_system("tiny_adapter:tiny_system")
    capabilities = system.capabilities.to_json()
    skipped = sum(check.not_for(system.capabilities) is not None for check in CHECKS)
    skipped += sum(needs is not None and not capabilities[needs] for _, _, needs in PROBES)
    total = len(CHECKS) + len(PROBES) + len(system.crash_points) + 1
    result.assert_outcomes(passed=1 + total - skipped, skipped=skipped)
    result.stdout.fnmatch_lines(["*the system declares no heartbeats*"])


def test_a_broken_system_fails_in_the_lab_s_words(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", "-k", "probe or at_the_deadline",
        "--crashqueuelab-system", "broken_adapters:stale_ack_system",
    )  # fmt: skip
    outcomes = result.parseoutcomes()
    assert outcomes["failed"] == 5, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "*contract check an_acknowledgement_at_the_deadline_is_refused failed (evidence in *",
            "*1 anomaly (evidence in *",
            "*- probe stale_holder_after_expiry: job stale-holder: an acknowledgement after*",
        ],
        consecutive=False,
    )
