"""The commands a page prints work when pasted into a shell, the system's import path
included, and a failing crash case or probe can be run alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from crashqueuelab.lab.runs.commands import campaign_command, import_path, runnable
from tests.conftest import EXAMPLES


def test_only_a_system_python_finds_when_told_needs_its_import_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert import_path("sqlite") is None
    assert import_path("crashqueuelab.lab.mutants.catalog:no_fencing") is None
    assert import_path("no_such_module_anywhere:factory") is None
    assert import_path(".relative:factory") is None
    monkeypatch.syspath_prepend(str(EXAMPLES))
    assert import_path("tiny_adapter:tiny_system") == str(EXAMPLES.resolve())


def test_a_campaign_command_names_its_mode_and_what_it_runs_alone() -> None:
    report = {"system": {"name": "tinyqueue"}, "system_spec": "tiny_adapter:tiny_system",
              "seed": 7, "crash_mode": "process", "system_import_path": "/some where"}  # fmt: skip
    assert campaign_command(report, "out") == (
        "PYTHONPATH='/some where' crashqueuelab campaign --system tiny_adapter:tiny_system"
        " --seed 7 --output-directory out"
    )
    report |= {"crash_mode": "power-loss", "system_import_path": None}
    assert campaign_command(report, "d/x", crash_point="claim:after") == (
        "crashqueuelab campaign --crash-mode power-loss --system tiny_adapter:tiny_system"
        " --seed 7 --crash-point claim:after --output-directory d/x"
    )
    assert campaign_command(report, "d", probe="idempotent_submit").endswith(
        "--seed 7 --probe idempotent_submit --output-directory d"
    )
    assert runnable("crashqueuelab demo", {}) == "crashqueuelab demo"


def test_a_failing_probes_command_pasted_into_a_shell_runs_it_alone(tmp_path: Path) -> None:
    """The broken adapter lives in examples/: the command carries its import path."""
    report = {"system": {"name": "tinyqueue-stale-ack"},
              "system_spec": "broken_adapters:stale_ack_system", "seed": 3,
              "crash_mode": "process", "system_import_path": str(EXAMPLES)}  # fmt: skip
    command = campaign_command(report, str(tmp_path / "rerun"), probe="stale_holder_after_expiry")
    environment = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    environment.pop("PYTHONPATH", None)
    finished = subprocess.run(
        ["bash", "-c", command], env=environment, capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert finished.returncode == 1, finished.stderr[-2000:]
    result = json.loads(finished.stdout[: finished.stdout.rindex("}") + 1])
    [line] = result["anomalies"]
    assert line.startswith("probe stale_holder_after_expiry: job stale-holder:")
    report_file = json.loads((tmp_path / "rerun" / "campaign.json").read_text())
    assert [probe["name"] for probe in report_file["probes"]] == ["stale_holder_after_expiry"]
    assert report_file["cases"] == []


def test_a_failing_crash_case_has_its_own_command_on_the_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from crashqueuelab.lab.campaign.run import run_campaign
    from crashqueuelab.lab.pages.render import write_report

    monkeypatch.syspath_prepend(str(EXAMPLES))
    report = run_campaign(
        tmp_path / "c", seed=3, system="broken_adapters:losing_system",
        crash_points=["claim:after", "ack:after"],
    )  # fmt: skip
    assert report["system_import_path"] == str(EXAMPLES.resolve())
    failed = [case for case in report["cases"] if not case["passed"]]
    assert [case["fault_point"] for case in failed] == ["claim:after"]
    html = write_report(tmp_path / "c").read_text()
    assert "Run this crash point alone:" in html
    assert (
        f"PYTHONPATH={EXAMPLES.resolve()} crashqueuelab campaign --system"
        f" broken_adapters:losing_system --seed 3 --crash-point claim:after --output-directory"
        f" {tmp_path / 'c' / 'reruns' / failed[0]['case_id']}"
    ) in html
    assert html.count("Run this crash point alone:") == 1  # the passing case has none


def test_a_campaign_refuses_a_probe_that_does_not_exist(tmp_path: Path) -> None:
    from crashqueuelab.core.errors import InvalidInput
    from crashqueuelab.lab.campaign.run import run_campaign

    with pytest.raises(InvalidInput, match="no_such_probe: no such probe"):
        run_campaign(tmp_path / "c", seed=3, probes=["no_such_probe"])
    assert not (tmp_path / "c").exists()  # refused before anything was written
