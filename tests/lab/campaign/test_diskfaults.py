"""The sqlite queue and walqueue under disk errors the file system answers: never told
success for data the disk lost; the planted fsync retry caught; bad input refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crashqueuelab.core.errors import InvalidInput
from crashqueuelab.lab.campaign import diskfaults
from crashqueuelab.lab.campaign.diskfaults import (
    FAILED,
    PASSED,
    RECORD_FILE,
    STEPS,
    Told,
    obligations,
    run_disk_faults,
)
from crashqueuelab.lab.mutants.fsyncretry import fsync_retried
from crashqueuelab.systems.sqlite import sqlite_system
from crashqueuelab.systems.walqueue import walqueue_system
from tests.lab.faults.powerloss.test_mount import needs_fuse

SYSTEMS = {"sqlite": sqlite_system, "walqueue": walqueue_system}
#: The submit, the claim, the failure report and the reopen: one of each kind of write.
SOME_STEPS = (0, 1, 5, 6)


@needs_fuse
@pytest.mark.parametrize("fault", ["eio-fsync", "enospc"])
@pytest.mark.parametrize("name", sorted(SYSTEMS))
def test_never_told_success_for_what_the_disk_lost(tmp_path: Path, name: str, fault: str) -> None:
    record = run_disk_faults(SYSTEMS[name](), fault, tmp_path / "run", steps=SOME_STEPS)
    verdicts = {case["step"]: case["verdict"] for case in record["cases"]}
    assert verdicts == {STEPS[i]: PASSED for i in SOME_STEPS}, record["cases"]
    for case in record["cases"]:
        # A write step that ran into the fault was told so (the reopen may succeed: a
        # walqueue with nothing to write again, or sqlite reading only).
        if case["step"] != "reopen":
            assert "error" in case["told"], case
        assert case["recovered"]["reopen"] == {"opened": True}
    assert json.loads((tmp_path / "run" / RECORD_FILE).read_text())["ok"] is True


@needs_fuse
def test_the_planted_fsync_retry_is_caught_and_walqueue_passes(tmp_path: Path) -> None:
    """One failed fsync per call: walqueue is told the failure; the mutant retries, is told
    success, and the frame the failed fsync dropped is gone after the cut."""
    shipped = run_disk_faults(
        walqueue_system(), "eio-fsync", tmp_path / "shipped", count=1, steps=(0, 2)
    )
    assert [case["verdict"] for case in shipped["cases"]] == [PASSED, PASSED]
    mutant = run_disk_faults(
        fsync_retried(), "eio-fsync", tmp_path / "mutant", count=1, steps=(0, 2)
    )
    assert [case["verdict"] for case in mutant["cases"]] == [FAILED, FAILED]
    submit, succeed = mutant["cases"]
    assert submit["told"] == {"faulted": True, "step": "submit-a", "value": "job-a"}
    assert (
        "cut at once: job-a: told exists (attempts >= 0), the disk holds absent"
        in submit["anomalies"]
    )
    assert succeed["told"]["value"] == "succeeded"
    assert any("told succeeded" in line for line in succeed["anomalies"])
    assert {f["kind"] for f in succeed["findings"]} == {"acknowledged_work_lost"}


def test_the_promises_are_what_the_callers_were_told() -> None:
    told = [
        Told("submit-a", False, "job-a"),
        Told("claim-a", True, {"claim": "job-a", "attempt": 1}),
        Told("succeed-a", False, error="OSError: disk I/O error"),
        Told("submit-b", False, "job-b"),
        Told("claim-b", False, {"claim": "job-b", "attempt": 1}),
        Told("fail-b", False, "retry"),
        Told("resubmit-job-b", False, "job-b"),
    ]
    assert obligations(told) == {"job-a": ("attempted", 1), "job-b": ("released", 1)}
    told.append(Told("finish-succeed-job-a", False, "succeeded"))
    told.append(Told("resubmit-job-a", False, "job-a"))
    assert obligations(told)["job-a"] == ("succeeded", 1)


def test_bad_input_is_one_structured_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(InvalidInput, match="disk_fault: 'eio-all' is not one of"):
        run_disk_faults(sqlite_system(), "eio-all", tmp_path / "run")
    assert not (tmp_path / "run").exists()
    code = diskfaults.main(
        ["--system", "nope", "--disk-fault", "enospc", "--output-directory", str(tmp_path / "x")]
    )
    [line] = capsys.readouterr().out.splitlines()
    assert code == diskfaults.EXIT_USAGE
    assert json.loads(line)["error"]["type"] == "SystemUnavailable"


@needs_fuse
def test_a_finding_a_healthy_disk_gives_too_is_the_systems_own(tmp_path: Path) -> None:
    """huey dequeues (deletes) what it hands out: a cut right after a claim loses the job
    with or without a disk fault, so that finding is huey's, set apart from the fault's."""
    pytest.importorskip("huey")
    from crashqueuelab.systems.registry import resolve_system

    record = run_disk_faults(resolve_system("huey"), "enospc", tmp_path / "run", steps=(2,))
    [case] = record["cases"]
    assert case["verdict"] == diskfaults.WITHOUT_THE_FAULT
    assert case["anomalies"] == []
    assert case["found_without_the_fault"] == [
        "cut at once: job-a: told attempted (attempts >= 1), the disk holds absent"
    ]
    assert record["summary"]["fails_without_the_fault"] == 1
    assert record["ok"] is False  # nothing passed: a check that did not pass is not "ok"
