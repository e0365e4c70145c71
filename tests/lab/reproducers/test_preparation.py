"""What a rerun needs around it: the adapter's directory on the path, the server its system
lives on, a pinned release's own environment; and what it says when one is missing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from crashqueuelab.core.errors import SystemUnavailable
from crashqueuelab.lab.reproducers import preparation, rerun
from crashqueuelab.lab.runs.servers import SERVER_VARIABLES
from crashqueuelab.lab.versions.environments import PINNED_VARIABLE, Pin
from crashqueuelab.regression import run_probe
from tests.conftest import EXAMPLES


def test_the_adapter_s_directory_goes_on_the_path_and_its_absence_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "path", [entry for entry in sys.path if entry != str(EXAMPLES)])
    monkeypatch.delitem(sys.modules, "broken_adapters", raising=False)
    system = preparation.prepared("broken_adapters:stale_ack_system", str(EXAMPLES))
    assert system.name == "tinyqueue-unfenced"
    assert sys.path[0] == str(EXAMPLES)
    gone = str(tmp_path / "gone")
    with pytest.raises(SystemUnavailable, match=f"imported from {gone} when the test"):
        preparation.prepared("nowhere_to_be_found:system", gone)
    with pytest.raises(SystemUnavailable, match="cannot import nowhere_to_be_found") as raised:
        preparation.prepared("nowhere_to_be_found:system", str(tmp_path))
    assert "when the test was exported" not in str(raised.value)


def test_only_a_release_that_is_not_installed_here_is_rerun_elsewhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(PINNED_VARIABLE, raising=False)
    assert preparation.release_elsewhere("sqlite") is None
    assert preparation.release_elsewhere("broken_adapters:stale_ack_system") is None
    assert preparation.release_elsewhere(f"huey=={version('huey')}") is None
    assert preparation.release_elsewhere("huey==3.2.1") == Pin("huey", "huey", "3.2.1")
    # Inside the release's own environment: here, whatever is installed.
    monkeypatch.setenv(PINNED_VARIABLE, "huey==3.2.1")
    assert preparation.release_elsewhere("huey==3.2.1") is None


@pytest.mark.parametrize(
    ("stdout", "stderr", "said"),
    [
        ('{"error": "CrashModeUnavailable: no FUSE"}', "", "did not run: CrashModeUnavailable"),
        ("", "Traceback ...\nImportError: no lab", "did not run: exit 1: ImportError: no lab"),
        ("[]", "", "did not run: exit 1: no output"),
    ],
)
def test_a_rerun_elsewhere_that_did_not_run_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stdout: str, stderr: str, said: str
) -> None:
    monkeypatch.setattr(preparation, "ensure_environment", lambda pin: (tmp_path, {}))

    def ran(*args: Any, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(args, 1, stdout, stderr)

    monkeypatch.setattr(subprocess, "run", ran)
    with pytest.raises(SystemUnavailable, match=said):
        preparation.rerun_elsewhere(Pin("huey", "huey", "3.2.1"), "run_probe", {})


def test_a_rerun_elsewhere_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preparation, "ensure_environment", lambda pin: (tmp_path, {}))

    def too_slow(*args: Any, **kwargs: Any) -> None:
        raise subprocess.TimeoutExpired("python", 1)

    monkeypatch.setattr(subprocess, "run", too_slow)
    with pytest.raises(SystemUnavailable, match="ran past"):
        preparation.rerun_elsewhere(Pin("huey", "huey", "3.2.1"), "run_probe", {})


def test_a_rerun_elsewhere_comes_back_as_the_outcome_it_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request a pinned rerun sends, answered here by the same module (python -m)."""
    monkeypatch.delenv(PINNED_VARIABLE, raising=False)
    asked: list[dict[str, Any]] = []

    def answer(pin: Pin, function: str, keywords: dict[str, Any]) -> dict[str, Any]:
        asked.append(keywords)
        request = json.dumps({"function": function, "keywords": {**keywords, "system": "sqlite"}})
        finished = subprocess.run(
            [sys.executable, "-m", preparation.RERUN_MODULE],
            input=request, capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        answered: dict[str, Any] = json.loads(finished.stdout)
        return answered

    monkeypatch.setattr(rerun, "rerun_elsewhere", answer)
    outcome = run_probe("huey==3.2.1", "stale_holder_after_expiry", tmp_path)
    assert asked == [
        {"system": "huey==3.2.1", "probe": "stale_holder_after_expiry", "directory": str(tmp_path)}
    ]
    assert outcome.ok
    assert outcome.directory == tmp_path / "probes"
    code, printed = rerun.main(
        json.dumps({"function": "run_probe", "keywords": {
            "system": "sqlite", "probe": "no_such_probe", "directory": str(tmp_path / "x")}})
    )  # fmt: skip
    assert code == 1
    assert json.loads(printed)["error"].startswith("InvalidInput: ")


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server here")
def test_a_system_on_a_server_gets_one_when_none_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in SERVER_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    outcome = run_probe("rq", "idempotent_submit", tmp_path)
    assert "no Redis server" not in outcome.explain()
    assert outcome.ok, outcome.explain()


def test_every_rerun_of_a_release_not_installed_here_goes_to_its_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from importlib.metadata import PackageNotFoundError

    from crashqueuelab.regression import replay_chaos, replay_model_workload, run_crash_point

    monkeypatch.delenv(PINNED_VARIABLE, raising=False)
    asked: list[str] = []

    def answer(pin: Pin, function: str, keywords: dict[str, Any]) -> dict[str, Any]:
        asked.append(f"{pin.spec} {function}")
        return {"ok": False, "anomalies": ["a"], "directory": keywords["directory"],
                "weaknesses": ["w"], "broken_promises": []}  # fmt: skip

    monkeypatch.setattr(rerun, "rerun_elsewhere", answer)
    outcome = replay_model_workload("huey==3.2.1", {"seed": 1}, tmp_path)
    assert (outcome.ok, outcome.weaknesses, outcome.directory) == (False, ["w"], tmp_path)
    run_crash_point("huey==3.2.1", "enqueue:after", seed=1, directory=tmp_path)
    replay_chaos({"system_spec": "huey==3.2.1", "schedule": []}, tmp_path)

    def not_installed(name: str) -> str:
        raise PackageNotFoundError(name)

    monkeypatch.setattr(preparation, "version", not_installed)
    run_probe("huey==3.3.0", "idempotent_submit", tmp_path)
    assert asked == [
        "huey==3.2.1 replay_model_workload",
        "huey==3.2.1 run_crash_point",
        "huey==3.2.1 replay_chaos",
        "huey==3.3.0 run_probe",
    ]
