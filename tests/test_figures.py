"""The campaign figures the README and docs/systems.md quote for the shipped systems, with a
fixed seed, are what a fresh campaign with that seed gives today: crash points passed of
those named, probes passed of those that asked something, probes not applicable, and a
clean model workload. A figure that no longer matches a fresh run fails here, naming the
document, the row and both values. (The showcase's figures: ``test_docs.py``. Figures of
runs that depend on timing, chaos and benchmarks, are quoted with the command and the
machine that measured them; no fresh run can repeat them number for number.)"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import RunCli

ROOT = Path(__file__).resolve().parents[1]
#: The seed both tables name (``campaign (--seed 7)``).
SEED = "7"


def _row(document: Path, system: str) -> list[str]:
    """The cells of the table row of ``system`` in ``document`` (its first cell the name,
    bare or as code)."""
    for line in document.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] in (system, f"`{system}`"):
            return cells
    raise AssertionError(f"{document.name}: no table row for {system}")


def _of(text: str, what: str = "") -> tuple[int, int]:
    found = re.search(rf"(\d+) of (\d+){what}", text)
    assert found is not None, f"no 'N of M{what}' in {text!r}"
    return int(found[1]), int(found[2])


def _quoted(summary: dict[str, Any]) -> dict[str, Any]:
    """What a row says of a campaign, from its summary."""
    asked = summary["probes_passed"] + summary["probes_failed"]
    return {
        "crash points": (summary["passed"], summary["named_fault_points"]),
        "probes": (summary["probes_passed"], asked),
        "not applicable": summary["probes_not_applicable"],
        "model workload clean": bool(summary["model_workload_ok"]),
    }


def _not_applicable(text: str) -> int:
    found = re.search(r"(\d+) not applicable", text)
    return int(found[1]) if found else 0


@pytest.mark.parametrize("system", ["sqlite", "walqueue"])
def test_the_quoted_campaign_figures_are_a_fresh_campaigns(
    tmp_path: Path, run_cli: RunCli, system: str
) -> None:
    outcome = run_cli(
        "campaign", "--system", system, "--seed", SEED, "--shrink-seconds", "0", "--quiet",
        "--output-directory", tmp_path / "c",
    )  # fmt: skip
    assert outcome.code == 0, outcome.result
    fresh = _quoted(outcome.result["summary"])

    readme = _row(ROOT / "README.md", system)[1]
    said = {
        "crash points": _of(readme, " crash points"),
        "probes": _of(readme, " probes"),
        "not applicable": _not_applicable(readme),
        "model workload clean": "the model workload clean" in readme,
    }
    assert said == fresh, f"README.md, the {system} row: quoted {said}, a fresh run {fresh}"

    campaign, probes = _row(ROOT / "docs" / "systems.md", system)[1:3]
    said = {
        "crash points": _of(campaign),
        "probes": _of(probes),
        "not applicable": _not_applicable(probes),
    }
    fresh.pop("model workload clean")
    assert said == fresh, f"docs/systems.md, the {system} row: quoted {said}, a fresh run {fresh}"
