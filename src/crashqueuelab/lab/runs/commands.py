"""The command lines a page prints to run again what it reports.

Pasted into a shell on the machine that made the run, each works as it stands: a system
given as ``module:factory`` that Python finds only because the run was told where to look
(``PYTHONPATH``, a script's directory) gets that directory in front of the command, since a
pasted command no longer has it. A failing crash case or probe gets a command of its own
that runs it alone.
"""

from __future__ import annotations

import importlib.util
import shlex
import site
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import crashqueuelab
from crashqueuelab.lab.runs.modes import FAILOVER, POWER_LOSS


def _installed_roots() -> set[Path]:
    roots = {Path(crashqueuelab.__file__).resolve().parent.parent}
    roots |= {Path(path).resolve() for path in site.getsitepackages()}
    roots.add(Path(site.getusersitepackages()).resolve())
    roots.add(Path(sys.prefix).resolve())
    return roots


def import_path(spec: str) -> str | None:
    """The directory a ``module:factory`` system was imported from, where Python finds it
    only when told (neither the lab's own package nor an installed one); None otherwise."""
    if ":" not in spec:
        return None
    top = spec.split(":", 1)[0].split(".", 1)[0]
    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if found is None or found.origin is None:
        return None
    origin = Path(found.origin).resolve()
    root = origin.parent.parent if origin.name == "__init__.py" else origin.parent
    installed = _installed_roots()
    if root in installed or any(parent in installed for parent in root.parents):
        return None
    return str(root)


def runnable(command: str, report: Mapping[str, Any]) -> str:
    """``command`` with the import path the run's system needed, if any."""
    path = report.get("system_import_path")
    return command if not path else f"PYTHONPATH={shlex.quote(str(path))} {command}"


def campaign_command(
    report: Mapping[str, Any],
    output_directory: str,
    *,
    crash_point: str | None = None,
    probe: str | None = None,
) -> str:
    """The campaign that made ``report`` again, or one of its crash points or probes alone."""
    spec = report.get("system_spec", report["system"]["name"])
    mode = f" --crash-mode {POWER_LOSS}" if report.get("crash_mode") == POWER_LOSS else ""
    if mode and report.get("crash_states_per_case") is not None:
        mode += f" --crash-states {report['crash_states_per_case']}"
    if report.get("crash_mode") == FAILOVER:
        level = report["failover"]["synchronous_commit"]
        mode = f" --crash-mode {FAILOVER} --synchronous-commit {level}"
    only = ""
    if crash_point is not None:
        only = f" --crash-point {shlex.quote(crash_point)}"
    elif probe is not None:
        only = f" --probe {shlex.quote(probe)}"
    return runnable(
        f"crashqueuelab campaign{mode} --system {shlex.quote(spec)} --seed {report['seed']}"
        f"{only} --output-directory {shlex.quote(output_directory)}",
        report,
    )
