"""A user's system that names its distribution is pinned as a shipped library is
(``--system package.module:factory==1.7.2``): its release in an environment of its own, the
adapter carried there from where it was imported."""

from __future__ import annotations

import json
from importlib.metadata import version
from pathlib import Path

import pytest

from crashqueuelab.core.errors import SystemUnavailable
from crashqueuelab.lab.versions.environments import Pin, adapter_code, parse_pin
from crashqueuelab.systems import resolve_system
from crashqueuelab.systems.registry import distribution_of
from tests.conftest import RunCli

HERE = "tests.lab.versions.user_adapter"


def test_a_user_system_names_the_distribution_it_pins() -> None:
    assert distribution_of(f"{HERE}:my_huey") == "huey"
    assert distribution_of("huey") == "huey"
    assert distribution_of("sqlite") is None
    assert parse_pin(f"{HERE}:my_huey==3.3.0", distribution_of) == Pin(
        f"{HERE}:my_huey", "huey", "3.3.0"
    )
    with pytest.raises(SystemUnavailable, match="names it on the package index"):
        parse_pin(f"{HERE}:unreleased==1.0", distribution_of)


def test_a_pinned_user_system_resolves_only_where_its_release_is_installed() -> None:
    installed = version("huey")
    assert resolve_system(f"{HERE}:my_huey=={installed}").name == "my-huey"
    with pytest.raises(SystemUnavailable, match=r"huey nothing is installed|not 0\.0\.1"):
        resolve_system(f"{HERE}:my_huey==0.0.1")
    with pytest.raises(SystemUnavailable, match="names no distribution"):
        resolve_system(f"{HERE}:unreleased==1.0")


def test_the_adapter_is_carried_alone_and_a_library_s_own_module_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRASHQUEUELAB_CACHE", str(tmp_path / "cache"))
    carried = adapter_code(Pin(f"{HERE}:my_huey", "huey", "3.3.0"))
    assert carried is not None
    (link,) = carried.iterdir()
    assert link.name == "tests"
    assert link.resolve() == Path(__file__).resolve().parents[2]
    # Asked again, the same directory.
    assert adapter_code(Pin(f"{HERE}:my_huey", "huey", "3.3.0")) == carried
    # An adapter inside the pinned library comes with its release; a shipped system has none.
    assert adapter_code(Pin("huey.contrib.sql_huey:SqlHuey", "huey", "3.3.0")) is None
    assert adapter_code(Pin("huey", "huey", "3.3.0")) is None


@pytest.mark.releases
def test_a_user_system_runs_pinned_in_its_release_s_environment(
    tmp_path: Path, release_cache: Path, run_cli: RunCli
) -> None:
    outcome = run_cli(
        "campaign", "--system", f"{HERE}:my_huey==3.3.0", "--crash-point", "enqueue:after",
        "--probe", "idempotent_submit", "--seed", "3", "--shrink-seconds", "0",
        "--output-directory", str(tmp_path / "c"),
    )  # fmt: skip
    assert outcome.result["environment"]["installed"] == {"huey": "3.3.0"}, outcome.stderr
    assert outcome.code == 0, outcome.result
    report = json.loads((tmp_path / "c" / "campaign.json").read_text())
    assert report["system"]["name"] == "my-huey"
    assert report["system"]["version"] == "huey 3.3.0 (SqliteHuey)"
    assert report["cases"][0]["died_at_fault_point"] is True
