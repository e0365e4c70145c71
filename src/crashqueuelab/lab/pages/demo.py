"""The page of the effect experiment: a worker killed after its effect committed and
before its acknowledgement, the non-idempotent and the idempotent destination side by
side, each with its store's history."""

from __future__ import annotations

from pathlib import Path

from crashqueuelab.lab.pages.common import Verdict, View, read_json
from crashqueuelab.lab.pages.transitions import store_transitions
from crashqueuelab.lab.workloads.scenario import START_US


def demo_view(run_dir: Path) -> View:
    comparison = read_json(run_dir / "comparison.json")
    sides = []
    for name in ("non_idempotent", "idempotent"):
        scenario = read_json(run_dir / name / "report.json")
        history_file = run_dir / name / "history.json"
        sides.append(
            {
                "name": name.replace("_", "-"),
                "figures": comparison[name],
                "report": scenario,
                "history": store_transitions(read_json(history_file), origin_us=START_US)
                if history_file.is_file()
                else [],
            }
        )
    system = comparison.get("system", {"name": "sqlite", "durability": ""})
    idem, non = comparison["idempotent"], comparison["non_idempotent"]
    ok = idem["invariants_ok"] and non["invariants_ok"]
    verdict = Verdict(
        ok=ok,
        title="effect committed, then a crash before the acknowledgement",
        system=system["name"],
        durability=system.get("durability", ""),
        seed=None,
        duration=None,
        command=f"crashqueuelab demo --system {system['name']} --output-directory {run_dir}",
        reasons=[] if ok else ["a store failed its judge"],
    )
    figures = [
        (
            "crash point",
            comparison["fault_point"],
            "the worker died after its effect, before acknowledging",
        ),
        (
            "attempts (non-idempotent / idempotent)",
            f"{non['attempt_count']} / {idem['attempt_count']}",
            "",
        ),
        (
            "durable effects (non-idempotent / idempotent)",
            f"{non['effect_count']} / {idem['effect_count']}",
            "two executions both times; the idempotent destination keeps one",
        ),
        ("delivery semantics", comparison["queue_delivery_semantics"], ""),
    ]
    return View("demo.html.j2", verdict, figures, {"sides": sides})
