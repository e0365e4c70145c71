"""An exported reproducer runs as the docs say, and says only what it proved.

From any directory, with nothing on ``PYTHONPATH``, the file finds the adapter it was
exported from; a system it cannot set up is a pytest error (never the failure that means
"the bug is there"); a weakness the system documents is pinned as an expected failure with
the documentation's words and link, shown after the bugs, never offered as a bug to fix; a
pinned release's reproducer runs in that release's environment, with pytest there too.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from crashqueuelab.lab.campaign.run import run_campaign
from crashqueuelab.lab.reproducers import export
from crashqueuelab.lab.reproducers.campaign import shrink_if_failed
from crashqueuelab.lab.reproducers.export import SYSTEM_VARIABLE
from crashqueuelab.lab.runs.servers import SERVER_VARIABLES
from crashqueuelab.lab.versions.environments import PINNED_VARIABLE, lab_requirements
from crashqueuelab.regression import DocumentedWeakness, Outcome, run_probe
from tests.conftest import EXAMPLES, SHRINK_BUDGET_S, RunCli
from tests.lab.reproducers.documented import WEAKNESS

BROKEN = "broken_adapters:stale_ack_system"
CORRECT = "tiny_adapter:tiny_system"
DOCUMENTED = "tests.lab.reproducers.documented:documented_no_fencing"
PYTEST_SECONDS = 300
needs_fuse = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not os.path.exists("/dev/fuse"),
    reason="power loss needs Linux with /dev/fuse",
)


def run_pytest(target: Path, cwd: Path, **variables: str) -> subprocess.CompletedProcess[str]:
    """``python -m pytest target`` as a user runs it: from ``cwd``, with neither the lab's
    ``PYTHONPATH`` nor its server variables."""
    left_out = {"PYTHONPATH", SYSTEM_VARIABLE, PINNED_VARIABLE, *SERVER_VARIABLES}
    env = {name: value for name, value in os.environ.items() if name not in left_out}
    env.update(variables)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", str(target)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=PYTEST_SECONDS, check=False,
    )  # fmt: skip


def counts(output: str) -> dict[str, int]:
    """pytest's closing line as counts: ``{"failed": 1, "xfailed": 1}``."""
    last = output.strip().splitlines()[-1]
    return {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", last)}


@pytest.fixture(scope="module")
def unfenced(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The unfenced example's stale-holder probe, shrunk and exported."""
    target = tmp_path_factory.mktemp("unfenced") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(EXAMPLES))
        report = run_campaign(target, seed=3, system=BROKEN, probes=["stale_holder_after_expiry"])
        shrink_if_failed(target, report, SHRINK_BUDGET_S, correct_system=CORRECT)
    return target, report


def test_an_exported_test_finds_its_adapter_from_any_directory(
    unfenced: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    target, report = unfenced
    (record,) = report["shrink"]["reproducers"]
    # The lab ran it as a user would: without the adapter's directory on PYTHONPATH.
    assert record["test_run"]["outcome"] == "failed", record["test_run"]
    assert record["test_run"]["failed"] is True
    assert record["test_run_on_correct_system"]["outcome"] == "passed"
    finished = run_pytest(target / "reproducer", tmp_path)
    assert counts(finished.stdout) == {"failed": 1}, finished.stdout
    assert "it must be refused" in finished.stdout
    assert "SystemUnavailable" not in finished.stdout
    text = (target / record["test_file"]).read_text()
    assert f"IMPORT_PATH = {json.dumps(str(EXAMPLES))}" in text
    assert record["test_command"] == f"python -m pytest {target / record['test_file']}"


def test_a_system_that_cannot_be_set_up_is_an_error_never_a_failure(
    unfenced: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    target, report = unfenced
    path = target / report["shrink"]["reproducers"][0]["test_file"]
    finished = run_pytest(path, tmp_path, CRASHQUEUELAB_SYSTEM="nowhere_to_be_found:system")
    assert counts(finished.stdout) == {"error": 1}, finished.stdout
    assert "cannot import nowhere_to_be_found" in finished.stdout
    run = export.run_test(path, import_path=None, system="nowhere_to_be_found:system")
    assert (run["outcome"], run["failed"]) == ("error", None)
    assert "cannot import nowhere_to_be_found" in run["detail"]
    assert export.said(run).startswith("ERROR as exported, the system was not set up: ")
    # Moved to a machine where the adapter's directory is not: the error says where it was.
    moved = tmp_path / "moved" / path.name
    moved.parent.mkdir()
    text = path.read_text().replace(json.dumps(str(EXAMPLES)), json.dumps(str(tmp_path / "gone")))
    moved.write_text(text)
    finished = run_pytest(moved, tmp_path)
    assert counts(finished.stdout) == {"error": 1}, finished.stdout
    assert f"imported from {tmp_path / 'gone'} when the test was exported" in finished.stdout


@pytest.fixture(scope="module")
def documented(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A campaign of two probes on a system that documents one of the two failures."""
    target = tmp_path_factory.mktemp("documented") / "run"
    probes = ["stale_holder_after_expiry", "worker_id_reused_after_restart"]
    report = run_campaign(target, seed=3, system=DOCUMENTED, probes=probes)
    assert [line.split(":")[0] for line in report["promises"]["broken_promises"]] == [
        "probe worker_id_reused_after_restart"
    ]
    shrink_if_failed(target, report, SHRINK_BUDGET_S)
    return target, report


def test_a_documented_weakness_is_pinned_as_such_after_the_bugs(
    documented: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    target, report = documented
    bug, weakness = report["shrink"]["reproducers"]
    # The bug first, though its probe ran second.
    assert (bug["name"], bug["documented"]) == ("probe worker_id_reused_after_restart", None)
    assert weakness["name"] == "probe stale_holder_after_expiry"
    assert weakness["documented"] == {"what": WEAKNESS.what, "source": WEAKNESS.source}
    assert bug["test_run"]["outcome"] == "failed"
    assert weakness["test_run"]["outcome"] == "expected failure", weakness["test_run"]
    pinned = (target / weakness["test_file"]).read_text()
    assert "pytest.mark.xfail(" in pinned
    assert "strict=True" in pinned
    assert WEAKNESS.source in pinned
    assert "fails while the system has the bug" not in pinned
    assert "xfail" not in (target / bug["test_file"]).read_text()
    finished = run_pytest(target / "reproducer", tmp_path)
    assert counts(finished.stdout) == {"failed": 1, "xfailed": 1}, finished.stdout
    # Where the weakness no longer shows, the pinned test says so by failing.
    fixed = run_pytest(target / weakness["test_file"], tmp_path, CRASHQUEUELAB_SYSTEM="sqlite")
    assert counts(fixed.stdout) == {"failed": 1}, fixed.stdout
    assert "XPASS(strict)" in fixed.stdout


def test_the_page_shows_the_bugs_first_and_each_status_once(
    documented: tuple[Path, dict[str, Any]],
) -> None:
    from crashqueuelab.lab.pages.render import write_report

    target, report = documented
    page = write_report(target).read_text()
    bugs = page.index("Smallest failing runs (1)")
    pinned = page.index("Documented weaknesses, pinned (1)")
    assert bugs < page.index("probe worker_id_reused_after_restart</h3>") < pinned
    assert pinned < page.index("probe stale_holder_after_expiry</h3>")
    assert page.count(WEAKNESS.source) >= 2  # the promises' table and the reproducer
    for record in report["shrink"]["reproducers"]:
        words = export.said(record["test_run"])
        assert page.count(words) == 1, words
        assert page.count(record["test_run"]["detail"]) <= 1


def test_a_rerun_sorts_its_anomalies_into_documented_weaknesses_and_bugs(tmp_path: Path) -> None:
    documented = run_probe(DOCUMENTED, "stale_holder_after_expiry", tmp_path / "one")
    assert not documented.ok
    assert (documented.weaknesses, documented.broken_promises) == ([WEAKNESS.what], [])
    with pytest.raises(DocumentedWeakness, match="no fencing after expiry"):
        documented.assert_documented(WEAKNESS.what)
    bug = run_probe(DOCUMENTED, "worker_id_reused_after_restart", tmp_path / "two")
    assert bug.broken_promises == bug.anomalies
    with pytest.raises(AssertionError) as raised:
        bug.assert_documented(WEAKNESS.what)
    assert not isinstance(raised.value, DocumentedWeakness)
    assert "no documented weakness explains" in str(raised.value)
    # The weakness gone: nothing is raised, and the xfail's strictness fails the test.
    Outcome(True, [], tmp_path).assert_documented(WEAKNESS.what)


def test_a_release_environment_has_the_lab_s_pytest() -> None:
    from importlib.metadata import version

    assert f"pytest=={version('pytest')}" in lab_requirements()


@needs_fuse
@pytest.mark.releases
def test_a_pinned_release_s_reproducers_run_in_its_environment(
    tmp_path: Path, release_cache: Path, run_cli: RunCli
) -> None:
    directory = tmp_path / "huey"
    outcome = run_cli(
        "campaign", "--system", "huey==3.2.1", "--crash-mode", "power-loss",
        "--crash-point", "enqueue:after", "--probe", "acknowledgement_at_the_deadline",
        "--output-directory", str(directory),
    )  # fmt: skip
    assert outcome.code == 1, outcome.stderr
    records = json.loads((directory / "campaign.json").read_text())["shrink"]["reproducers"]
    assert sorted(record["name"] for record in records) == [
        "crash point enqueue:after",
        "probe acknowledgement_at_the_deadline",
    ]
    for record in records:
        # huey documents both: pinned, and run by the pytest of the release's environment.
        assert record["documented"]["source"].startswith("https://huey.readthedocs.io/")
        assert record["test_run"]["outcome"] == "expected failure", record["test_run"]
        assert "pytest is not installed" not in json.dumps(record)
    assert all(line.startswith("documented weakness, ") for line in outcome.result["reproducers"])
    # Run from the lab's environment, where another huey is installed, as the docs say.
    finished = run_pytest(directory / "reproducer", tmp_path)
    assert counts(finished.stdout) == {"xfailed": 2}, finished.stdout
    rerun = run_probe("huey==3.2.1", "acknowledgement_at_the_deadline", tmp_path / "probe")
    assert not rerun.ok
    assert rerun.broken_promises == []
    assert any(weakness.startswith("no leases") for weakness in rerun.weaknesses)


@pytest.mark.parametrize(
    ("code", "stdout", "outcome", "words"),
    [
        (1, "F\n1 failed in 1.0s", "failed", "fails as exported"),
        (0, ".\n1 passed in 1.0s", "passed", "PASSES as exported"),
        (0, "x\n1 xfailed in 1.0s", "expected failure", "fails as documented"),
        (1, "[XPASS(strict)] documented: x\n1 failed in 1.0s", "unexpected pass", "no longer"),
        (1, "E   a.b.SystemUnavailable: system 'x': gone\n1 error in 1.0s", "error", "gone"),
        (0, "s\n1 skipped in 1.0s", "skipped", "skipped as exported"),
        (0, "1 warning in 1.0s", None, "1 warning"),
        (4, "ERROR: file or directory not found", None, "pytest exited 4"),
    ],
)
def test_what_pytest_said_of_an_exported_test_is_read_from_its_closing_lines(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    code: int,
    stdout: str,
    outcome: str,
    words: str,
) -> None:
    path = export.write_test(tmp_path, "test_x", "def test_x() -> None:\n    pass\n")

    def ran(*args: Any, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(args, code, stdout, "")

    monkeypatch.setattr(subprocess, "run", ran)
    run = export.run_test(path, import_path=str(tmp_path))
    assert run["outcome"] == outcome
    assert run["failed"] is {"failed": True, "passed": False}.get(outcome)
    assert words in export.said(run)
    if outcome == "error":
        assert run["detail"] == "SystemUnavailable: system 'x': gone"


def test_a_documented_weakness_is_labelled_wherever_a_reproducer_is_named() -> None:
    from crashqueuelab.cli.shrink import reproducer_lines
    from crashqueuelab.lab.reproducers.chaos import _documented

    long = "a weakness the library documents in more words than one line holds, " * 3
    shrunk = {
        "shrunk": True, "system": "x:y", "summary": "s", "anomaly": "probe p: no",
        "before": {"what": "the campaign"}, "after": {"what": "one probe"},
        "confirmations": 3, "reproduced": 3, "test_file": "reproducer/test_p.py",
        "test_run": {"outcome": "expected failure", "failed": None, "detail": "1 xfailed"},
    }  # fmt: skip
    documented = {**shrunk, "name": "probe p", "documented": {"what": long, "source": "https://d"}}
    bug = {**shrunk, "name": "probe q", "documented": None,
           "test_run": {"failed": True, "detail": "1 failed"}}  # fmt: skip
    late = {"name": "probe r", "shrunk": False, "reason": "no time", "documented": {"what": "w"}}
    lines = reproducer_lines({"reproducers": [documented, late, bug]})
    assert lines[0].startswith("probe q: ")
    assert lines[0].endswith("(fails as exported)")
    assert lines[1].startswith("documented weakness, probe p: ")
    assert "(fails as documented (an expected failure))" in lines[1]
    assert lines[2] == "documented weakness, probe r: not shrunk (no time)"
    text = export.render(
        name="test_p", function="run_probe", call="run_probe(SYSTEM)", record=documented,
        import_path=None,
    )  # fmt: skip
    assert "IMPORT_PATH = None" in text
    assert f"WEAKNESS = {json.dumps(long)}" in text
    assert max(len(line) for line in text.split('"""')[1].splitlines()[6:12]) <= 88
    compile(text, "test_p.py", "exec")
    # A chaos run is pinned only when its system documents every anomaly it shows.
    shown = [{"what": "w", "source": "https://d"}]
    assert _documented(None) is None
    assert _documented({"keeps_its_promises": False, "weaker_as_documented": shown}) is None
    assert _documented({"keeps_its_promises": True, "weaker_as_documented": []}) is None
    assert _documented({"keeps_its_promises": True, "weaker_as_documented": shown}) == shown[0]
