"""A library pinned to a release (``--system huey==3.2.1``) runs in an environment of its own,
built from the package index: the reproduction of huey's unsynced default, and the fix.

The environments are built in the cache every run of the suite shares (``release_cache``),
outside the working tree: the first run installs each release, the next ones reuse it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from importlib.metadata import version
from pathlib import Path

import pytest

from crashqueuelab.core.errors import SystemUnavailable
from crashqueuelab.lab.versions import environments
from crashqueuelab.lab.versions.environments import CACHE_VARIABLE, PIP_LOGS
from crashqueuelab.systems import resolve_system
from tests.conftest import RunCli

needs_fuse = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not os.path.exists("/dev/fuse"),
    reason="power loss needs Linux with /dev/fuse; the command exits 4 and says so",
)


@pytest.fixture
def cache(release_cache: Path) -> Path:
    return release_cache


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "environments"
    monkeypatch.setenv(CACHE_VARIABLE, str(directory))
    return directory


@needs_fuse
@pytest.mark.releases
def test_huey_before_3_3_loses_acknowledged_enqueues_to_a_power_cut_and_3_3_keeps_them(
    tmp_path: Path, cache: Path, run_cli: RunCli
) -> None:
    verdicts = {}
    environments = {}
    for release in ("3.2.1", "3.3.0"):
        directory = tmp_path / release
        outcome = run_cli(
            "campaign",
            "--system",
            f"huey=={release}",
            "--crash-mode",
            "power-loss",
            "--crash-point",
            "enqueue:after",
            "--crash-point",
            "execute:after",
            "--seed",
            "3",
            "--shrink-seconds",
            "0",
            "--output-directory",
            str(directory),
        )
        assert outcome.code in (0, 1), outcome.stderr
        assert outcome.result["environment"]["installed"] == {"huey": release}
        environments[release] = Path(outcome.result["environment"]["directory"])
        report = json.loads((directory / "campaign.json").read_text())
        assert report["system"]["version"] == f"huey {release} (SqliteHuey)"
        verdicts[release] = report
        # The pinned run's own verdict line, passed on.
        assert "crashqueuelab: not ok" in outcome.stderr
    old, fixed = verdicts["3.2.1"], verdicts["3.3.0"]
    assert old["system"]["durability"].startswith("huey's default: fsync=False")
    assert old["summary"]["states_losing_acknowledged_work"] > 0
    assert any("acknowledged work lost: effect_job" in line for line in old["anomalies"])
    # Lost, but as huey documented its default: not a broken promise.
    assert old["promises"]["keeps_its_promises"] is True
    assert any("fsync=False" in e["what"] for e in old["promises"]["weaker_as_documented"])
    assert fixed["summary"]["failed"] == 0
    assert fixed["summary"]["states_losing_acknowledged_work"] == 0
    # Each release in an environment of its own, in the cache, named for the release.
    for release, environment in environments.items():
        assert environment.parent == cache
        assert environment.name.startswith(f"huey-{release}-py")
    assert environments["3.2.1"] != environments["3.3.0"]


def test_only_a_released_library_at_a_release_number_can_be_pinned(
    tmp_path: Path, empty_cache: Path, run_cli: RunCli
) -> None:
    outcome = run_cli(
        "campaign", "--system", "walqueue==1.0", "--output-directory", str(tmp_path / "a")
    )
    assert outcome.code == 2
    assert "only a released library can be pinned" in outcome.result["error"]["message"]
    outcome = run_cli(
        "campaign", "--system", "huey==latest", "--output-directory", str(tmp_path / "b")
    )
    assert outcome.code == 2
    assert outcome.result["error"]["field"] == "system"
    assert not empty_cache.exists()
    assert not (tmp_path / "a").exists()


def test_no_release_at_a_time_is_a_usage_error_that_builds_nothing(
    tmp_path: Path, empty_cache: Path, run_cli: RunCli
) -> None:
    for count in ("0", "-1", "two"):
        outcome = run_cli(
            "versions", "--system", "huey", "--releases", "3.2.1,3.3.0", "--at-once", count,
            "--output-directory", str(tmp_path / "v"), "campaign",
        )  # fmt: skip
        assert outcome.code == 2
        assert "--at-once" in outcome.stderr.splitlines()[-1]
    assert not empty_cache.exists()
    assert not (tmp_path / "v").exists()


@pytest.mark.releases
def test_a_release_the_index_does_not_have_is_refused_and_leaves_no_environment(
    tmp_path: Path, empty_cache: Path, run_cli: RunCli
) -> None:
    outcome = run_cli(
        "campaign", "--system", "huey==0.0.1", "--output-directory", str(tmp_path / "c")
    )
    assert outcome.code == 2
    error = outcome.result["error"]
    assert error["type"] == "SystemUnavailable"
    message = error["message"]
    assert message.startswith(
        "system 'huey==0.0.1': pip could not install huey==0.0.1: the index has no release"
    )
    assert "\n" not in message
    assert ", 0.1.0 to " in message  # the releases it has, from its first
    # pip's own words are kept whole in the file the message names, not printed.
    log = Path(message.rsplit("pip's output: ", 1)[1])
    assert "No matching distribution found for huey==0.0.1" in log.read_text()
    assert "No matching distribution" not in message
    left = [path.name for path in empty_cache.iterdir() if not path.name.endswith(".lock")]
    assert left == [PIP_LOGS]  # no environment


#: What pip 24 printed here for ``pip install huey==9.9.9``: about 1,400 characters.
PIP_SAID = (
    "WARNING: Location 'file:///srv/simple/huey/' is ignored: it is neither a file nor a"
    " directory.\nERROR: Could not find a version that satisfies the requirement huey==9.9.9"
    f" (from versions: {', '.join(f'0.{n}.0' for n in range(60))}, 1.0.0, 2.0.0, 3.2.0, 3.2.1,"
    " 3.3.0, 3.4.0, 3.5.0, 3.5.4)\nERROR: No matching distribution found for huey==9.9.9\n"
)


@pytest.fixture
def pip_says(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """pip, answering every install with what the test puts in the list (exit 1), and an
    environment made without building one."""
    said = [PIP_SAID]

    def pip(directory: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(["pip", *arguments], 1, "", said[0])

    monkeypatch.setattr(environments, "_pip", pip)
    monkeypatch.setattr(venv.EnvBuilder, "create", lambda self, directory: None)
    return said


def test_a_release_the_index_lacks_is_one_short_line_naming_the_releases_it_has(
    tmp_path: Path, empty_cache: Path, pip_says: list[str], run_cli: RunCli
) -> None:
    outcome = run_cli(
        "campaign", "--system", "huey==9.9.9", "--output-directory", str(tmp_path / "c")
    )
    assert outcome.code == 2
    message = outcome.result["error"]["message"]
    said, log = message.split("; pip's output: ")
    assert said == (
        "system 'huey==9.9.9': pip could not install huey==9.9.9:"
        " the index has no release 9.9.9 of huey; it has 68,"
        " 0.0.0 to 3.5.4, the newest 3.3.0, 3.4.0, 3.5.0, 3.5.4"
    )
    assert Path(log).read_text() == PIP_SAID
    assert Path(log).parent == empty_cache / PIP_LOGS
    [verdict] = [line for line in outcome.stderr.splitlines() if line.startswith("crashqueuelab:")]
    assert len(verdict) < 400
    assert not (tmp_path / "c").exists()
    # A release between two the index has: those two are named.
    pip_says[0] = PIP_SAID.replace("9.9.9", "3.2.5")
    outcome = run_cli(
        "campaign", "--system", "huey==3.2.5", "--output-directory", str(tmp_path / "d")
    )
    assert (
        "no release 3.2.5 of huey; it has 68, 0.0.0 to 3.5.4, the nearest 3.2.1 and 3.3.0"
        in (outcome.result["error"]["message"])
    )


def test_any_other_pip_failure_is_its_last_error_and_the_file_with_the_rest(
    tmp_path: Path, empty_cache: Path, pip_says: list[str], run_cli: RunCli
) -> None:
    pip_says[0] = "Collecting huey==3.2.1\n" * 40 + "ERROR: could not build wheels for huey\n"
    outcome = run_cli(
        "campaign", "--system", "huey==3.2.1", "--output-directory", str(tmp_path / "c")
    )
    message = outcome.result["error"]["message"]
    assert message.startswith(
        "system 'huey==3.2.1': pip could not install huey==3.2.1:"
        " ERROR: could not build wheels for huey; pip's output: "
    )
    assert Path(message.rsplit(": ", 1)[1]).read_text() == pip_says[0]
    pip_says[0] = "ERROR: " + "x" * 500  # the line is cut, the file holds it whole
    outcome = run_cli(
        "campaign", "--system", "huey==3.2.1", "--output-directory", str(tmp_path / "e")
    )
    assert f"ERROR: {'x' * 150}" in outcome.result["error"]["message"]
    said, _, log = outcome.result["error"]["message"].partition("; pip's output: ")
    assert len(said) < 300  # the line besides the file it names
    assert Path(log).read_text() == pip_says[0]
    pip_says[0] = (
        "ERROR: Could not find a version that satisfies the requirement huey==3.2.1"
        " (from versions: none)"
    )
    outcome = run_cli(
        "campaign", "--system", "huey==3.2.1", "--output-directory", str(tmp_path / "f")
    )
    assert (
        "the index has no release 3.2.1 of huey, nor any other;"
        in (outcome.result["error"]["message"])
    )
    pip_says[0] = ""  # pip said nothing at all
    outcome = run_cli(
        "campaign", "--system", "huey==3.2.1", "--output-directory", str(tmp_path / "d")
    )
    assert (
        "pip could not install huey==3.2.1: pip exited 1, saying nothing;"
        in (outcome.result["error"]["message"])
    )


def test_a_pinned_release_resolves_only_where_it_is_the_one_installed() -> None:
    installed = version("huey")
    assert resolve_system(f"huey=={installed}").version == f"huey {installed} (SqliteHuey)"
    with pytest.raises(SystemUnavailable, match=r"is installed here, not 0\.0\.1"):
        resolve_system("huey==0.0.1")


@pytest.mark.releases
def test_the_release_matrix_runs_each_release_in_its_environment_and_links_its_page(
    tmp_path: Path, cache: Path, run_cli: RunCli
) -> None:
    directory = tmp_path / "matrix"
    outcome = run_cli(
        "versions",
        "--system",
        "huey",
        "--releases",
        "3.3.0,3.2.1",
        "--output-directory",
        str(directory),
        "campaign",
        "--crash-point",
        "enqueue:after",
        "--probe",
        "idempotent_submit",
        "--shrink-seconds",
        "0",
    )
    assert outcome.code == 0, outcome.stderr
    assert [row["release"] for row in outcome.result["rows"]] == ["3.2.1", "3.3.0"]
    assert all(row["passes"] and row["keeps_its_promises"] for row in outcome.result["rows"])
    report = json.loads((directory / "versions.json").read_text())
    assert [row["version"] for row in report["rows"]] == [
        "huey 3.2.1 (SqliteHuey)",
        "huey 3.3.0 (SqliteHuey)",
    ]
    page = (directory / "report.html").read_text()
    assert 'href="3.2.1/report.html"' in page
    assert (directory / "3.2.1" / "report.html").is_file()
    outcome = run_cli(
        "versions",
        "--system",
        "sqlite",
        "--releases",
        "1.0,2.0",
        "--output-directory",
        str(tmp_path / "x"),
        "campaign",
    )
    assert outcome.code == 2
    assert outcome.result["error"]["field"] == "system"
    outcome = run_cli(
        "versions",
        "--system",
        "huey",
        "--releases",
        "1.0,2.0",
        "--output-directory",
        str(tmp_path / "y"),
        "campaign",
        "--system",
        "huey",
    )
    assert outcome.code == 2
    assert "the matrix sets --system" in outcome.result["error"]["message"]
