"""What every run kind's page is made of: the ``View`` a template renders (its
``Verdict``, its figures, its data), and the helpers several kinds' views share: reading
a retained file, the shrunk reproducers with their chains of events, how a system and its
own promises are named, and the lanes' colours."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crashqueuelab.lab.pages.chains import observation_chain
from crashqueuelab.lab.reproducers.export import said

#: Twelve colors, so a bench with ten lanes (ours, the textbook queue, six peers) repeats none.
PALETTE = (
    "#1a73e8",
    "#188038",
    "#9334e6",
    "#e37400",
    "#d01884",
    "#007b83",
    "#5f6368",
    "#795548",
    "#12b5cb",
    "#f9ab00",
    "#3949ab",
    "#7cb342",
)


@dataclass
class Verdict:
    #: Nothing that ran failed. With ``not_run`` the page says "Passed what ran", never
    #: "Passed", and marks the run not ok (``data-ok``), as its JSON does.
    ok: bool
    title: str
    system: str
    durability: str
    seed: int | None
    duration: float | None
    command: str
    reasons: list[str] = field(default_factory=list)
    #: Evidence that did not run, and why: shown beside the verdict, never as passed.
    not_run: list[str] = field(default_factory=list)
    interrupted: bool = False
    #: What the page says above ``command``.
    command_label: str = "Reproduce this run:"
    #: What the page calls ``system`` in the verdict's line (nothing: ``system`` says it).
    system_heading: str = "system"

    @property
    def passed(self) -> bool:
        """Everything asked for ran and passed."""
        return self.ok and not self.not_run and not self.interrupted

    @property
    def word(self) -> str:
        if self.interrupted:
            return "INTERRUPTED"
        if not self.ok:
            return "FAILED"
        return "Passed what ran" if self.not_run else "Passed"


@dataclass
class View:
    template: str
    verdict: Verdict
    figures: list[tuple[str, str, str]]
    data: dict[str, Any]


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def reproducers(run_dir: Path, report: dict[str, Any]) -> list[dict[str, Any]]:
    """The shrunk reproducers of a not-ok run, the bugs before the weaknesses the system
    documents; each model one with its chain of events read from its first rerun's
    retained log, each test run in the words the terminal uses."""
    shown = []
    for record in (report.get("shrink") or {}).get("reproducers", []):
        chain: list[dict[str, Any]] = []
        if record.get("chain"):
            rerun = (run_dir / record["chain"]).parent
            model = read_json(rerun / "model.json") if (rerun / "model.json").is_file() else {}
            chain = observation_chain(run_dir / record["chain"], model.get("store"))
            for row in chain:
                row["involved"] = bool(row["key"]) and row["key"] in record["anomaly"]
        runs = {
            f"{name}_said": said(record[name])
            for name in ("test_run", "test_run_on_correct_system")
            if record.get(name)
        }
        shown.append(record | {"chain_rows": chain} | runs)
    return sorted(shown, key=lambda record: bool(record.get("documented")))


def system_label(system: dict[str, Any]) -> str:
    """The system as the page names it: a released library by its release."""
    return str(system["version"]) if system.get("documented") else str(system["name"])


def promises_of(report: dict[str, Any]) -> dict[str, Any] | None:
    """The page's account of a library's own promises: every weakness it declares, with
    the failures each explains in this run; None for a system that declares none."""
    promises = report.get("promises")
    if not promises or not promises["declared"]:
        return None
    seen = {entry["what"]: entry for entry in promises["weaker_as_documented"]}
    rows = [
        seen.get(declared["what"], declared | {"lines": 0, "first": None})
        for declared in promises["declared"]
    ]
    text = promises["verdict"]
    if not promises["keeps_its_promises"]:
        text = f"{text}. Shown first below: the failures no documented weakness explains."
    shown: dict[str, Any] = promises | {"rows": rows, "verdict_text": text}
    return shown
