"""Writing ``report.html`` for a run directory, whatever kind of run it holds."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from crashqueuelab.core.errors import InvalidInput, install_hint
from crashqueuelab.lab.pages.bench import bench_view
from crashqueuelab.lab.pages.campaign import campaign_view
from crashqueuelab.lab.pages.chaos import chaos_view
from crashqueuelab.lab.pages.common import View
from crashqueuelab.lab.pages.demo import demo_view
from crashqueuelab.lab.pages.deploys import deploys_view
from crashqueuelab.lab.pages.diskfaults import disk_faults_view
from crashqueuelab.lab.pages.failover import failover_view
from crashqueuelab.lab.pages.heartbeats import heartbeats_view
from crashqueuelab.lab.pages.mutants import mutants_view
from crashqueuelab.lab.pages.powercut import power_cut_view
from crashqueuelab.lab.pages.showcase import showcase_view
from crashqueuelab.lab.pages.stopped import stopped_view
from crashqueuelab.lab.pages.versions import versions_view
from crashqueuelab.lab.runs.kinds import (
    BENCH,
    CAMPAIGN,
    CHAOS,
    DEMO,
    DEPLOYS,
    DISK_FAULTS,
    FAILOVER,
    HEARTBEATS,
    KINDS,
    MUTANTS,
    POWER_CUT,
    SHOWCASE,
    VERSIONS,
    RunKind,
    kind_of,
)

REPORT_FILE = "report.html"
#: How each kind of run is viewed (``lab.runs.kinds`` says how a directory's kind is known).
VIEWS: dict[RunKind, Callable[[Path], View]] = {
    SHOWCASE: showcase_view,
    CAMPAIGN: campaign_view,
    CHAOS: chaos_view,
    BENCH: bench_view,
    DEMO: demo_view,
    MUTANTS: mutants_view,
    VERSIONS: versions_view,
    HEARTBEATS: heartbeats_view,
    DEPLOYS: deploys_view,
    DISK_FAULTS: disk_faults_view,
    FAILOVER: failover_view,
    POWER_CUT: power_cut_view,
}


def _environment() -> object:
    try:
        import jinja2
    except ImportError:
        raise InvalidInput(
            "report", f"HTML reports need Jinja2: {install_hint('reports')}"
        ) from None
    return jinja2.Environment(
        loader=jinja2.PackageLoader("crashqueuelab.lab.pages", "templates"),
        autoescape=True,  # everything from a store (payloads, ids, errors) is text
        undefined=jinja2.StrictUndefined,
    )


def _write_finished_parts(run_dir: Path, record: dict[str, Any]) -> None:
    """Each part a stopped composed run (a showcase) had finished gets its page, so the
    run's page links it: the signal may land after a part's record and before its page."""
    for entry in record.get("parts", []):
        part = run_dir / entry["directory"]
        if not (part / REPORT_FILE).is_file() and kind_of(part) is not None:
            try:
                write_report(part)
            except InvalidInput:
                continue  # its page says how to build it (stopped.html.j2)


def write_report(run_dir: Path) -> Path:
    """Build ``run_dir/report.html`` from the run's retained files; its path."""
    kind = kind_of(run_dir)
    if kind is None:
        known = ", ".join(kind.record for kind in KINDS)
        raise InvalidInput("directory", f"{run_dir} holds no run (none of {known})")
    marker = run_dir / kind.record
    try:
        record = json.loads(marker.read_text(encoding="utf-8"))
        stopped = isinstance(record, dict) and (
            record.get("interrupted") or record.get("system_raised")
        )
        if stopped:
            _write_finished_parts(run_dir, record)
        view = stopped_view(run_dir, record) if stopped else VIEWS[kind](run_dir)
    except (KeyError, TypeError, ValueError) as error:
        # Another version's report, or a hand-edited one: say so, never a traceback.
        raise InvalidInput(
            "directory",
            f"{marker} is not a report this version can read ({type(error).__name__}: {error})",
        ) from None
    environment = _environment()
    template = environment.get_template(view.template)  # type: ignore[attr-defined]
    html = template.render(verdict=view.verdict, figures=view.figures, data=view.data)
    target = run_dir / REPORT_FILE
    temporary = target.with_name(REPORT_FILE + ".tmp")
    temporary.write_text(html, encoding="utf-8")
    with temporary.open("rb") as handle:
        os.fsync(handle.fileno())
    temporary.replace(target)
    return target
