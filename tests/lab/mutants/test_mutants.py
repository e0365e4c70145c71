"""Planted bugs: each is caught by the evidence docs/mutants.md says catches it, and one that
only a lost page cache would expose is reported as not caught, with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crashqueuelab import cli
from crashqueuelab.lab.faults.powerloss.disk import unavailable_reason
from crashqueuelab.lab.mutants.catalog import MUTANTS
from tests.conftest import DOCS, RunCli, invoke_cli

#: The mutants whose tests also say which evidence did NOT catch them: they run through
#: every kind of evidence here (the full matrix is ``crashqueuelab mutants``).
THROUGH_EVERYTHING = ("synchronous_normal", "wal_without_fsync", "current_without_directory_sync")


@pytest.fixture(scope="module")
def report(showcase_run: tuple[int, dict[str, object], Path]) -> dict[str, object]:
    """The showcase's mutant pass: every mutant through the evidence the catalog names."""
    _, _, target = showcase_run
    kept: dict[str, object] = json.loads((target / "mutants" / "mutants.json").read_text())
    return kept


@pytest.fixture(scope="module")
def everything(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """A few mutants through every kind of evidence: the campaign in both crash modes with
    its probes and model workload, and a chaos run with power cuts."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    argv = ["mutants", "--seed", "7", "--seeds", "1", "--quiet", "--jobs", "150", "--kills", "6"]
    argv += [part for name in THROUGH_EVERYTHING for part in ("--mutant", name)]
    target = tmp_path_factory.mktemp("mutants") / "run"
    outcome = invoke_cli(*argv, "--pauses", "1", "--output-directory", str(target))
    assert outcome.code == cli.EXIT_OK, outcome.result["reasons"]
    assert json.loads((target / "mutants.json").read_text())["caught"] == outcome.result["caught"]
    return outcome.result


def caught_by(report: dict[str, object], name: str) -> dict[str, str]:
    mutants = report["mutants"]
    assert isinstance(mutants, list)
    entry = next(m for m in mutants if m["mutant"] == name)
    return {evidence["by"]: evidence["anomaly"] for evidence in entry["caught_by"]}


def test_every_mutant_is_caught_by_the_evidence_the_catalog_names(
    report: dict[str, object],
) -> None:
    not_run = report.get("not_run", [])
    assert isinstance(not_run, list)
    if unavailable_reason() is None:
        assert not_run == []
    else:  # only the mutants a power cut catches, named as not run, never as caught
        assert {m["mutant"] for m in not_run} == {m.name for m in MUTANTS if m.needs_power_loss}
    ran = [mutant for mutant in MUTANTS if mutant.name not in {m["mutant"] for m in not_run}]
    assert (report["caught"], report["total"]) == (len(ran), len(MUTANTS))
    for mutant in ran:
        assert mutant.evidence in caught_by(report, mutant.name), mutant.name
    docs = (DOCS / "mutants.md").read_text()
    for mutant in MUTANTS:
        assert f"| `{mutant.name}` |" in docs, f"docs/mutants.md does not list {mutant.name}"


@pytest.mark.slow
@pytest.mark.early
def test_a_few_mutants_through_every_kind_of_evidence(everything: dict[str, object]) -> None:
    assert (everything["caught"], everything["total"]) == (3, 3)
    assert everything["evidence"] == "all"


def test_an_unfenced_acknowledgement_is_caught_by_the_probes(report: dict[str, object]) -> None:
    anomaly = caught_by(report, "no_fencing")["fencing probes"]
    assert anomaly.startswith("probe stale_holder_after_expiry: job stale-holder")


def test_an_acknowledgement_at_the_deadline_is_caught(report: dict[str, object]) -> None:
    anomaly = caught_by(report, "fence_off_by_one")["fencing probes"]
    assert anomaly.startswith("probe acknowledgement_at_the_deadline: job deadline")


@pytest.mark.slow
def test_a_commit_that_was_never_synced_is_named_as_lost_work(
    everything: dict[str, object],
) -> None:
    anomaly = caught_by(everything, "synchronous_normal")["power-loss campaign"]
    assert "lose-all: acknowledged work lost: effect_job: promised" in anomaly
    # Process deaths keep the page cache: only the power cut sees these.
    assert "crash campaign" not in caught_by(everything, "synchronous_normal")
    assert "crash campaign" not in caught_by(everything, "wal_without_fsync")


@pytest.mark.slow
def test_only_power_loss_catches_an_unsynced_directory(everything: dict[str, object]) -> None:
    evidence = caught_by(everything, "current_without_directory_sync")
    assert set(evidence) == {"power-loss campaign"}
    assert evidence["power-loss campaign"].startswith("case ")


def test_a_catch_must_hold_for_every_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    from crashqueuelab.lab.mutants import runner

    results = iter([("s", [{"by": "chaos", "anomaly": "a", "count": "1"}], None), ("s", [], None)])
    monkeypatch.setattr(runner, "_one_seed", lambda *args, **kwargs: next(results))
    result = runner.run_mutant(Path("unused"), MUTANTS[0], seeds=[1, 2], jobs=1, kills=0, pauses=0)
    assert not result["caught"]
    assert result["caught_by_some_seeds_only"] == ["chaos"]
    assert result["not_caught_because"] == "only some seeds caught it (chaos)"


def test_an_unknown_mutant_is_a_usage_error(tmp_path: Path, run_cli: RunCli) -> None:
    outcome = run_cli("mutants", "--mutant", "nope", "--output-directory", str(tmp_path / "m"))
    assert outcome.code == cli.EXIT_USAGE
    assert "unknown ['nope']" in outcome.result["error"]["message"]
    assert {m.name for m in MUTANTS} >= {"no_fencing", "synchronous_normal"}
