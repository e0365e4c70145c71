"""Writing ``report.html`` for a run directory, whatever kind of run it holds."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from crashqueuelab.core.errors import InvalidInput
from crashqueuelab.lab.pages.heartbeats import heartbeats_view
from crashqueuelab.lab.pages.stopped import stopped_view
from crashqueuelab.lab.pages.versions import versions_view
from crashqueuelab.lab.pages.views import (
    View,
    bench_view,
    campaign_view,
    chaos_view,
    demo_view,
    mutants_view,
    showcase_view,
)

REPORT_FILE = "report.html"
#: The file that says what kind of run a directory holds, and how to view it.
KINDS: tuple[tuple[str, Callable[[Path], View]], ...] = (
    ("showcase.json", showcase_view),
    ("campaign.json", campaign_view),
    ("chaos.json", chaos_view),
    ("bench.json", bench_view),
    ("comparison.json", demo_view),
    ("mutants.json", mutants_view),
    ("versions.json", versions_view),
    ("heartbeats.json", heartbeats_view),
)


def _environment() -> object:
    try:
        import jinja2
    except ImportError:
        raise InvalidInput(
            "report", "HTML reports need Jinja2: pip install 'crashqueuelab[reports]'"
        ) from None
    return jinja2.Environment(
        loader=jinja2.PackageLoader("crashqueuelab.lab.pages", "templates"),
        autoescape=True,  # everything from a store (payloads, ids, errors) is text
        undefined=jinja2.StrictUndefined,
    )


def write_report(run_dir: Path) -> Path:
    """Build ``run_dir/report.html`` from the run's retained files; its path."""
    for marker, view_of in KINDS:
        if (run_dir / marker).is_file():
            try:
                record = json.loads((run_dir / marker).read_text(encoding="utf-8"))
                stopped = isinstance(record, dict) and (
                    record.get("interrupted") or record.get("system_raised")
                )
                view = stopped_view(run_dir, record) if stopped else view_of(run_dir)
            except (KeyError, TypeError, ValueError) as error:
                # Another version's report, or a hand-edited one: say so, never a traceback.
                raise InvalidInput(
                    "directory",
                    f"{run_dir / marker} is not a report this version can read"
                    f" ({type(error).__name__}: {error})",
                ) from None
            break
    else:
        known = ", ".join(marker for marker, _ in KINDS)
        raise InvalidInput("directory", f"{run_dir} holds no run (none of {known})")
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
