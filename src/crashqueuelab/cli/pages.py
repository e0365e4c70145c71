"""The page every run gets: written after its evidence, never at its cost."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import TextIO


def html_report(directory: Path, stderr: TextIO | None = None) -> str | None:
    """Write the run's report.html when Jinja2 is installed (the reports extra); its path.

    The run's evidence is already on disk: a page that cannot be built is said on stderr
    and costs the run nothing (``crashqueuelab report DIR`` can build it again).
    """
    if importlib.util.find_spec("jinja2") is None:
        return None
    from crashqueuelab.lab.pages.render import write_report

    try:
        return str(write_report(directory))
    except Exception as error:
        print(f"crashqueuelab: report.html not written: {error!r}", file=stderr or sys.stderr)
        return None
