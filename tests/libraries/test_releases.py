"""A library pinned to a release (``--system huey==3.2.1``) runs in an environment of its own,
built from the package index: the reproduction of huey's unsynced default, and the fix.

The environments are built under the test's own temporary directory, so each run of this
test installs the two releases afresh (pip's own cache makes that a few seconds each).
"""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from crashqueuelab import cli
from crashqueuelab.lab.environments import CACHE_VARIABLE

needs_fuse = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not os.path.exists("/dev/fuse"),
    reason="power loss needs Linux with /dev/fuse; the command exits 4 and says so",
)


def run(argv: list[str]) -> tuple[int, dict[str, Any], str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(argv, stdout=out, stderr=err)
    return code, json.loads(out.getvalue()), err.getvalue()


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "environments"
    monkeypatch.setenv(CACHE_VARIABLE, str(directory))
    return directory


@needs_fuse
def test_huey_before_3_3_loses_acknowledged_enqueues_to_a_power_cut_and_3_3_keeps_them(
    tmp_path: Path, cache: Path
) -> None:
    verdicts = {}
    for release in ("3.2.1", "3.3.0"):
        directory = tmp_path / release
        code, result, err = run(
            [
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
            ]
        )
        assert code in (0, 1), err
        assert result["environment"]["installed"] == {"huey": release}
        report = json.loads((directory / "campaign.json").read_text())
        assert report["system"]["version"] == f"huey {release} (SqliteHuey)"
        verdicts[release] = report
        assert "crashqueuelab: not ok" in err  # the pinned run's own verdict line, passed on
    old, fixed = verdicts["3.2.1"], verdicts["3.3.0"]
    assert old["system"]["durability"].startswith("huey's default: fsync=False")
    assert old["summary"]["states_losing_acknowledged_work"] > 0
    assert any("acknowledged work lost: effect_job" in line for line in old["anomalies"])
    # Lost, but as huey documented its default: not a broken promise.
    assert old["promises"]["keeps_its_promises"] is True
    assert any("fsync=False" in e["what"] for e in old["promises"]["weaker_as_documented"])
    assert fixed["summary"]["failed"] == 0
    assert fixed["summary"]["states_losing_acknowledged_work"] == 0
    assert sorted(path.name.split("-")[1] for path in cache.iterdir() if path.is_dir()) == [
        "3.2.1",
        "3.3.0",
    ]


def test_only_a_released_library_at_a_release_number_can_be_pinned(
    tmp_path: Path, cache: Path
) -> None:
    code, result, _ = run(
        ["campaign", "--system", "walqueue==1.0", "--output-directory", str(tmp_path / "a")]
    )
    assert code == 2
    assert "only a released library can be pinned" in result["error"]["message"]
    code, result, _ = run(
        ["campaign", "--system", "huey==latest", "--output-directory", str(tmp_path / "b")]
    )
    assert code == 2
    assert result["error"]["field"] == "system"
    assert not cache.exists()
    assert not (tmp_path / "a").exists()


def test_a_release_the_index_does_not_have_is_refused_and_leaves_no_environment(
    tmp_path: Path, cache: Path
) -> None:
    code, result, _ = run(
        ["campaign", "--system", "huey==0.0.1", "--output-directory", str(tmp_path / "c")]
    )
    assert code == 2
    error = result["error"]
    assert error["type"] == "SystemUnavailable"
    assert "pip could not install huey==0.0.1" in error["message"]
    assert [path.name for path in cache.iterdir() if not path.name.endswith(".lock")] == []
