"""Planted bugs: each is caught by the evidence docs/mutants.md says catches it, and one that
only a lost page cache would expose is reported as not caught, with the reason."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from crashqueuelab import cli
from crashqueuelab.lab.mutants.catalog import MUTANTS


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    out, err = io.StringIO(), io.StringIO()
    argv = ["mutants", "--seed", "7", "--quiet", "--jobs", "150", "--kills", "6", "--pauses", "1"]
    for name in ("no_fencing", "fence_off_by_one", "torn_tail_is_corruption", "synchronous_normal"):
        argv += ["--mutant", name]
    target = tmp_path_factory.mktemp("mutants") / "run"
    code = cli.main([*argv, "--output-directory", str(target)], stdout=out, stderr=err)
    result: dict[str, object] = json.loads(out.getvalue())
    assert code == cli.EXIT_REJECTED  # synchronous_normal is not caught without power loss
    assert json.loads((target / "mutants.json").read_text())["caught"] == result["caught"]
    return result


def caught_by(report: dict[str, object], name: str) -> dict[str, str]:
    mutants = report["mutants"]
    assert isinstance(mutants, list)
    entry = next(m for m in mutants if m["mutant"] == name)
    return {evidence["by"]: evidence["anomaly"] for evidence in entry["caught_by"]}


def test_an_unfenced_acknowledgement_is_caught_by_the_probes(report: dict[str, object]) -> None:
    anomaly = caught_by(report, "no_fencing")["fencing probes"]
    assert anomaly.startswith("probe stale_holder_after_expiry: job stale-holder")


def test_an_acknowledgement_at_the_deadline_is_caught(report: dict[str, object]) -> None:
    anomaly = caught_by(report, "fence_off_by_one")["fencing probes"]
    assert anomaly.startswith("probe acknowledgement_at_the_deadline: job deadline")


def test_a_torn_tail_refused_as_corruption_fails_recovery(report: dict[str, object]) -> None:
    assert "crash campaign" in caught_by(report, "torn_tail_is_corruption")


def test_what_needs_lost_page_cache_is_reported_not_caught(report: dict[str, object]) -> None:
    assert report["missed"] == ["synchronous_normal"]
    assert report["reasons"] == [
        "mutant synchronous_normal not caught: a power-loss crash mode: a process death keeps"
        " the page cache"
    ]
    assert (report["caught"], report["total"]) == (3, 4)


def test_an_unknown_mutant_is_a_usage_error(tmp_path: Path) -> None:
    out = io.StringIO()
    code = cli.main(["mutants", "--mutant", "nope", "--output-directory", str(tmp_path / "m")],
                    stdout=out, stderr=io.StringIO())  # fmt: skip
    assert code == cli.EXIT_USAGE
    assert "unknown ['nope']" in json.loads(out.getvalue())["error"]["message"]
    assert {m.name for m in MUTANTS} >= {"no_fencing", "synchronous_normal"}
