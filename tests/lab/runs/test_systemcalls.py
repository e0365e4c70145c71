"""What a system raises is its failure, named by the call it raised from."""

from __future__ import annotations

from pathlib import Path

import pytest

from crashqueuelab import cli
from crashqueuelab.lab.runs.systemcalls import NamedCalls, SystemRaised
from tests.conftest import EXAMPLES, RunCli


class _Client:
    limit = 3

    def claim(self, worker_id: str, lease_us: int) -> None:
        raise RuntimeError("the queue's claim is broken")

    def recover(self) -> int:
        return 2


def test_a_named_client_says_which_call_raised_and_passes_the_rest_on() -> None:
    named = NamedCalls("tiny", _Client())
    assert named.recover() == 2
    assert named.limit == 3
    with pytest.raises(SystemRaised) as raised:
        named.claim("w", 1)
    assert str(raised.value) == (
        "the system under test (tiny) raised from claim: RuntimeError: the queue's claim is broken"
    )
    with pytest.raises(AttributeError):
        named.no_such_call()


def test_a_crash_child_whose_system_raises_names_the_call(
    tmp_path: Path, run_cli: RunCli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    outcome = run_cli(
        "campaign", "--system", "broken_adapters:raising_system", "--crash-point", "claim:after",
        "--probe", "idempotent_submit", "--seed", "3", "--shrink-seconds", "0",
        "--output-directory", str(tmp_path / "c"),
    )  # fmt: skip
    assert outcome.code == cli.EXIT_REJECTED
    (case,) = [line for line in outcome.result["reasons"] if line.startswith("case ")]
    assert "raised from claim: RuntimeError: the queue's claim is broken" in case
