"""The sqlite queue and walqueue under disk errors the file system answers: never told
success for data the disk lost; the command, its record and its page; the planted fsync
retry caught; bad input refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crashqueuelab import cli
from crashqueuelab.cli.versions import EVIDENCE as VERSIONS_EVIDENCE
from crashqueuelab.core.errors import InvalidInput
from crashqueuelab.lab.campaign import diskfaults
from crashqueuelab.lab.campaign.diskfault_told import Told, obligations
from crashqueuelab.lab.campaign.diskfaults import (
    CHECKPOINT,
    FAILED,
    PASSED,
    RECORD_FILE,
    STEPS,
    applicable_steps,
    fault_names,
    run_disk_faults,
)
from crashqueuelab.lab.mutants.catalog import fsync_retried
from crashqueuelab.lab.pages.render import write_report
from crashqueuelab.lab.versions.matrix import cell
from crashqueuelab.systems.registry import resolve_system
from crashqueuelab.systems.sqlite import sqlite_system
from crashqueuelab.systems.walqueue import walqueue_system
from tests.conftest import RunCli
from tests.lab.faults.powerloss.test_mount import needs_fuse

MARKUP = "<script>alert('owned')</script>"

SYSTEMS = {"sqlite": sqlite_system, "walqueue": walqueue_system}
#: The submit, the claim, the failure report and the reopen: one of each kind of write.
SOME_STEPS = (0, 1, 5, 6)


@needs_fuse
@pytest.mark.parametrize("name", sorted(SYSTEMS))
def test_never_told_success_for_what_the_disk_lost(tmp_path: Path, name: str) -> None:
    record = run_disk_faults(
        SYSTEMS[name](), ["eio-fsync", "enospc"], tmp_path / "run", steps=SOME_STEPS
    )
    verdicts = {(case["disk_fault"], case["step"]): case["verdict"] for case in record["cases"]}
    assert verdicts == {
        (fault, STEPS[i]): PASSED for fault in ("eio-fsync", "enospc") for i in SOME_STEPS
    }, record["cases"]
    for case in record["cases"]:
        # A write step that ran into the fault was told so (the reopen may succeed: a
        # walqueue with nothing to write again, or sqlite reading only).
        if case["step"] != "reopen":
            assert "error" in case["told"], case
        assert case["recovered"]["reopen"] == {"opened": True}
        assert (tmp_path / "run" / case["directory"] / "case.json").is_file()
    assert json.loads((tmp_path / "run" / RECORD_FILE).read_text())["ok"] is True


@needs_fuse
def test_the_command_runs_a_fault_over_every_step_and_its_page_says_the_verdict(
    tmp_path: Path, run_cli: RunCli
) -> None:
    """One fault, one failed fsync per call, walqueue: told the failure at every step, so
    every case passes; the one JSON object, the verdict line last, the record and the page
    agree, and ``report`` rebuilds the page from the files alone."""
    target = tmp_path / "run"
    argv = ["disk-faults", "--system", "walqueue", "--disk-fault", "eio-fsync", "--count", "1"]
    outcome = run_cli(*argv, "--seed", "3", "--output-directory", target)
    assert outcome.code == cli.EXIT_OK, outcome.result
    result = outcome.result
    assert (result["ok"], result["disk_faults"]) == (True, ["eio-fsync"])
    assert result["headline"] == f"{len(STEPS)} of {len(STEPS)} cases passed (eio-fsync)"
    assert [case["step"] for case in result["cases"]] == list(STEPS)
    assert all("error" in case["told"] for case in result["cases"])
    lines = outcome.stderr.rstrip().splitlines()
    assert lines[0].startswith(f"disk-faults walqueue: 1/{len(STEPS)} eio-fsync submit-a: passed")
    assert lines[-1] == (
        f"crashqueuelab: passed: {result['headline']}; report: {target / 'report.html'}"
    )
    record = json.loads((target / RECORD_FILE).read_text())
    assert (record["ok"], record["seed"], record["summary"]["passed"]) == (True, 3, len(STEPS))
    # ``versions ... disk-faults`` reads this record for each release, and its row from it.
    assert VERSIONS_EVIDENCE["disk-faults"] == RECORD_FILE
    assert cell("0.1", record, "cases")["passes"] is True
    page = (target / "report.html").read_text()
    assert 'id="verdict" data-ok="true"' in page
    assert f"{len(STEPS)} of {len(STEPS)} cases passed (eio-fsync)" in page
    assert "crashqueuelab disk-faults --system walqueue --disk-fault eio-fsync --count 1" in page
    (target / "report.html").unlink()
    assert run_cli("report", target).code == cli.EXIT_OK
    assert (target / "report.html").read_text() == page
    # Whatever a store or a system says is text on the page, never markup.
    record["cases"][0]["told"] = {"step": "submit-a", "faulted": True, "error": MARKUP}
    record["cases"][0]["recovered"]["live"]["problems"] = [MARKUP]
    record["reasons"] = record["anomalies"] = [f"eio-fsync submit-a: {MARKUP}"]
    record["ok"] = False
    (target / RECORD_FILE).write_text(json.dumps(record))
    html = write_report(target).read_text()
    assert MARKUP not in html
    assert "&lt;script&gt;alert(&#39;owned&#39;)&lt;/script&gt;" in html
    assert 'id="verdict" data-ok="false"' in html


@needs_fuse
def test_walqueue_keeps_what_it_acknowledges_after_a_compaction_the_disk_failed(
    tmp_path: Path,
) -> None:
    """The checkpoint step (walqueue's compaction) under a failed directory sync and a failed
    fsync, each of the first such call: the compaction is told the failure, and a queue
    opened again keeps every acknowledgement through a power cut. Before walqueue synced
    its directory at open, the segment the failed compaction had created stayed newest, the
    reopened queue appended to it, and its name (never durable) took them with it at the
    cut: job-b told succeeded, pending on the disk."""
    record = run_disk_faults(
        walqueue_system(), ["eio-dirsync", "eio-fsync"], tmp_path / "run", count=1,
        steps=(CHECKPOINT,),
    )  # fmt: skip
    cases = [(case["disk_fault"], case["step"], case["verdict"]) for case in record["cases"]]
    assert cases == [
        ("eio-dirsync", "checkpoint", PASSED),
        ("eio-fsync", "checkpoint", PASSED),
    ], record["anomalies"]
    assert all(case["told"]["error"].startswith("OSError") for case in record["cases"])


def test_a_system_whose_checkpoint_does_nothing_durable_gets_no_checkpoint_case() -> None:
    assert applicable_steps(sqlite_system()) == list(range(CHECKPOINT))
    assert applicable_steps(walqueue_system()) == list(range(len(STEPS)))


@needs_fuse
def test_the_planted_fsync_retry_is_caught(tmp_path: Path) -> None:
    """One failed fsync per call: the mutant retries, is told success, and the frame the
    failed fsync dropped is gone after the cut (walqueue as shipped is told the failure:
    the command's test above)."""
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
    assert mutant["anomalies"][0] == (
        "eio-fsync submit-a: cut at once: job-a: told exists (attempts >= 0), the disk holds absent"
    )
    assert mutant["promises"]["keeps_its_promises"] is False


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


@pytest.mark.parametrize(
    ("options", "field"),
    [
        (["--disk-fault", "eio-all"], "disk_fault: 'eio-all' is not one of"),
        (["--disk-fault", "enospc", "--system", "nope"], "nope"),
        (["--disk-fault", "enospc", "--count", "0"], "--count: must be greater than zero"),
        ([], "--disk-fault"),
    ],
)
def test_bad_input_is_one_structured_line_and_writes_nothing(
    tmp_path: Path, run_cli: RunCli, options: list[str], field: str
) -> None:
    target = tmp_path / "run"
    outcome = run_cli("disk-faults", *options, "--output-directory", target)
    assert outcome.code == cli.EXIT_USAGE
    assert field in outcome.result["error"]["message"]
    [line] = outcome.stderr.splitlines()
    assert line.startswith("crashqueuelab: not ok: ")
    assert not target.exists()


def test_all_is_every_fault_once() -> None:
    assert fault_names(["enospc", "all"]) == [
        "enospc", "eio-fsync", "eio-dirsync", "eio-write", "eio-read"
    ]  # fmt: skip
    with pytest.raises(InvalidInput, match="disk_fault: 'eio-all' is not one of"):
        fault_names(["eio-all"])


@needs_fuse
def test_a_finding_a_healthy_disk_gives_too_is_the_systems_own(tmp_path: Path) -> None:
    """huey dequeues (deletes) what it hands out: a cut right after a claim loses the job
    with or without a disk fault, so that finding is huey's, set apart from the fault's."""
    pytest.importorskip("huey")
    record = run_disk_faults(resolve_system("huey"), "enospc", tmp_path / "run", steps=(2,))
    [case] = record["cases"]
    assert case["verdict"] == diskfaults.WITHOUT_THE_FAULT
    assert case["anomalies"] == []
    assert case["found_without_the_fault"] == [
        "cut at once: job-a: told attempted (attempts >= 1), the disk holds absent"
    ]
    assert record["summary"]["fails_without_the_fault"] == 1
    assert record["ok"] is False  # nothing passed: a check that did not pass is not "ok"
