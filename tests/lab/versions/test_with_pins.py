"""``--with DIST==VERSION`` fixes a dependency's release beside a pinned library (Celery's
bugs here live in kombu), and ``versions --vary DIST`` runs a dependency's releases under one
release of the library: what each names, and bad input refused in one line before anything
is built or written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crashqueuelab.cli.pinned import pins_of
from crashqueuelab.core.errors import InvalidInput
from crashqueuelab.lab.versions.environments import (
    CACHE_VARIABLE,
    PINNED_VARIABLE,
    Pin,
    environment_name,
    parse_with,
)
from tests.conftest import RunCli

CELERY = Pin("celery", "celery", "5.3.1", extras=("redis",))


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "environments"
    monkeypatch.setenv(CACHE_VARIABLE, str(directory))
    return directory


def test_a_pin_with_a_dependency_names_both_and_has_an_environment_of_its_own() -> None:
    [pin] = pins_of(["celery==5.3.1"], ["kombu==5.3.1"])
    assert pin == Pin("celery", "celery", "5.3.1", (("kombu", "5.3.1"),), ("redis",))
    assert pin.label == "celery==5.3.1 with kombu==5.3.1"
    # Celery's Redis transport needs redis-py, which only its extra installs.
    assert pin.requirements == ["celery[redis]==5.3.1", "kombu==5.3.1"]
    assert pin.distributions == ["celery", "kombu"]
    other = parse_with(["kombu==5.3.2"], CELERY)
    assert other is not None
    alone, beside = environment_name(CELERY), environment_name(other)
    assert environment_name(pin).startswith("celery-5.3.1+kombu-5.3.1-py")
    assert len({alone, beside, environment_name(pin)}) == 3


def test_inside_its_environment_a_pin_with_a_dependency_runs_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(PINNED_VARIABLE, "celery==5.3.1 with kombu==5.3.1")
    assert pins_of(["celery==5.3.1"], ["kombu==5.3.1"]) == []
    # Another dependency's release is another environment.
    assert pins_of(["celery==5.3.1"], ["kombu==5.3.2"]) != []


@pytest.mark.parametrize(
    ("fixed", "said"),
    [
        (["kombu"], "'kombu' is not DISTRIBUTION==VERSION, as kombu==5.3.1"),
        (["==5.3.1"], "'==5.3.1' is not DISTRIBUTION==VERSION, as kombu==5.3.1"),
        (["kombu==latest"], "'latest' is not a release number such as 5.3.1"),
        (["celery==5.3.0"], "celery is the pinned library itself: its release is --system's"),
        (["kombu==5.3.1", "Kombu==5.3.2"], "Kombu is named twice"),
    ],
)
def test_a_bad_dependency_pin_is_one_line(fixed: list[str], said: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        parse_with(fixed, CELERY)
    assert raised.value.field == "with"
    assert said in str(raised.value)


def test_a_dependency_pin_without_a_pinned_library_is_refused_and_nothing_is_built(
    tmp_path: Path, empty_cache: Path, run_cli: RunCli
) -> None:
    outcome = run_cli(
        "campaign", "--system", "celery", "--with", "kombu==5.3.1",
        "--output-directory", str(tmp_path / "c"),
    )  # fmt: skip
    assert outcome.code == 2
    assert outcome.result["error"]["field"] == "with"
    assert "pin the system too" in outcome.result["error"]["message"]
    [verdict] = [line for line in outcome.stderr.splitlines() if line.startswith("crashqueuelab:")]
    assert "\n" not in verdict
    assert not empty_cache.exists()
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize(
    ("options", "field", "said"),
    [
        (["--system", "celery==5.3.1"], "system", "the matrix pins each release itself"),
        (["--system", "celery", "--vary", "kombu"], "vary", "pin it, as --system celery==5.3.1"),
        (
            ["--system", "celery==5.3.1", "--vary", "kombu", "--with", "kombu==5.3.0"],
            "with",
            "kombu is named twice",
        ),
    ],
)
def test_a_matrix_over_a_dependency_refuses_what_it_cannot_run_and_builds_nothing(
    tmp_path: Path,
    empty_cache: Path,
    run_cli: RunCli,
    options: list[str],
    field: str,
    said: str,
) -> None:
    outcome = run_cli(
        "versions", *options, "--releases", "5.3.1,5.3.2",
        "--output-directory", str(tmp_path / "v"), "deploys",
    )  # fmt: skip
    assert outcome.code == 2
    assert outcome.result["error"]["field"] == field
    assert said in outcome.result["error"]["message"]
    assert not empty_cache.exists()
    assert not (tmp_path / "v").exists()


def test_a_dependency_release_the_index_lacks_is_named_as_the_dependency_s() -> None:
    from crashqueuelab.lab.versions.environments import _releases_text

    pin = parse_with(["kombu==9.9.9"], CELERY)
    assert pin is not None
    said = _releases_text(pin, "kombu==9.9.9", "5.3.0, 5.3.1, 5.3.2")
    assert said == (
        "the index has no release 9.9.9 of kombu; it has 3, 5.3.0 to 5.3.2,"
        " the newest 5.3.0, 5.3.1, 5.3.2"
    )
    # The library's own release, refused, is still named as the library's.
    assert "no release 5.3.1 of celery" in _releases_text(pin, "celery==5.3.1", "5.3.0")


def _installed_label(redis_release: str | None = None) -> str:
    from importlib.metadata import version

    return f"dramatiq=={version('dramatiq')} with redis=={redis_release or version('redis')}"


def test_a_run_made_with_a_dependency_pinned_is_named_so_and_resolves_only_where_both_are(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from crashqueuelab.cli.pinned import pinned_label
    from crashqueuelab.core.errors import SystemUnavailable
    from crashqueuelab.lab.reproducers.preparation import release_elsewhere
    from crashqueuelab.lab.versions.environments import parse_label
    from crashqueuelab.systems.registry import distribution_of, extras_of, resolve_system

    label = _installed_label()
    base = label.split(" with ")[0]
    redis = label.rsplit("==", 1)[1]
    assert pinned_label(base, [f"redis=={redis}"]) == label
    pin = parse_label(label, distribution_of, extras_of)
    assert pin is not None
    assert (pin.label, pin.also) == (label, (("redis", redis),))
    # Both releases installed here: the system resolves, and a reproducer reruns here.
    assert resolve_system(label).name == "dramatiq"
    assert release_elsewhere(label) is None
    # Another release of the dependency: not this environment's.
    other = _installed_label("0.0.1")
    with pytest.raises(SystemUnavailable, match=f"redis {redis} is installed here, not 0.0.1"):
        resolve_system(other)
    elsewhere = release_elsewhere(other)
    assert elsewhere is not None
    assert elsewhere.also == (("redis", "0.0.1"),)
    # Inside that release's own environment it runs where it is.
    monkeypatch.setenv(PINNED_VARIABLE, other)
    assert release_elsewhere(other) is None


def test_inside_its_environment_a_run_with_a_dependency_pinned_records_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_cli: RunCli
) -> None:
    label = _installed_label()
    base, fixed = label.split(" with ")
    monkeypatch.setenv(PINNED_VARIABLE, label)
    outcome = run_cli(
        "campaign", "--system", base, "--with", fixed, "--crash-point", "enqueue:after",
        "--probe", "idempotent_submit", "--seed", "3", "--shrink-seconds", "0",
        "--output-directory", str(tmp_path / "c"),
    )  # fmt: skip
    assert "error" not in outcome.result, outcome.result
    record = json.loads((tmp_path / "c" / "campaign.json").read_text())
    # Its reruns and reproducers go to this environment, the dependency's release with it.
    assert record["system_spec"] == label
