"""What a rerun needs around it, so that an exported test runs wherever pytest runs it.

- A system given as ``module:factory`` that Python found only because the run was told
  where to look: the exported file records that directory, and it goes on Python's path
  (a user's suite, or a pasted command, has not the ``PYTHONPATH`` the run had).
- A system on a server gets a throwaway one when none is named, as the command line starts
  one for its runs.
- A pinned release (``huey==3.2.1``) that is not the one installed here is rerun in the
  release's own environment (``lab.versions.environments``, the one the pinned run used,
  built on first use), as the command line runs a pinned command; the outcome comes back as
  JSON.

What cannot be set up raises (``SystemUnavailable``, ``ServerUnavailable``,
``CrashModeUnavailable``): an exported test makes its rerun in a fixture, so pytest reports
an error, never the failure that says the bug is there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from crashqueuelab.core.errors import SystemUnavailable
from crashqueuelab.lab.runs.servers import servers_for
from crashqueuelab.lab.versions.environments import (
    PINNED_VARIABLE,
    Pin,
    ensure_environment,
    parse_label,
    pinned_environment,
    python_of,
)
from crashqueuelab.servers.postgres import DSN_VARIABLE
from crashqueuelab.servers.redis import SOCKET_VARIABLE
from crashqueuelab.systems.contract import System
from crashqueuelab.systems.registry import distribution_of, extras_of, resolve_system

#: The module a rerun in a release's environment runs (``python -m``).
RERUN_MODULE = "crashqueuelab.lab.reproducers.rerun"
#: A rerun in another environment may replay a chaos schedule three times: bounded all the
#: same.
ELSEWHERE_SECONDS = 3600.0
#: The variable that names each kind of server to a run.
_NAMING = {"postgres": DSN_VARIABLE, "redis": SOCKET_VARIABLE}


def prepared(spec: str, import_path: str | None = None) -> System:
    """The system ``spec`` names, with ``import_path`` (the directory its module was
    imported from when the test was exported) on Python's path when it is a directory."""
    if import_path and Path(import_path).is_dir() and import_path not in sys.path:
        sys.path.insert(0, import_path)
    try:
        return resolve_system(spec)
    except SystemUnavailable as error:
        if not import_path or Path(import_path).is_dir():
            raise
        raise SystemUnavailable(
            spec,
            f"{error.reason} (it was imported from {import_path} when the test was exported,"
            " and that directory is not here)",
        ) from None


@contextmanager
def servers_named(spec: str, system: System) -> Iterator[None]:
    """The server ``system`` needs, named to this process and its children: the one named
    already, else a throwaway one for as long as the block lasts."""
    variable = _NAMING.get(system.server or "")
    if variable is None or os.environ.get(variable):
        yield
        return
    with servers_for([spec], None):
        yield


def release_elsewhere(spec: str) -> Pin | None:
    """The release ``spec`` pins when it is not the one installed here (and this is not the
    release's own environment already); None for anything else."""
    pin = parse_label(spec, distribution_of, extras_of)
    if pin is None or os.environ.get(PINNED_VARIABLE) == pin.label:
        return None
    wanted = [(pin.distribution, pin.version), *pin.also]
    return None if all(_installed(name) == release for name, release in wanted) else pin


def _installed(distribution: str) -> str | None:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def rerun_elsewhere(pin: Pin, function: str, keywords: Mapping[str, Any]) -> dict[str, Any]:
    """``function`` of ``rerun`` called with ``keywords`` (JSON data) in the release's own
    environment: the outcome it printed, as JSON data."""
    directory, _ = ensure_environment(pin)
    request = json.dumps({"function": function, "keywords": dict(keywords)})
    try:
        finished = subprocess.run(
            [str(python_of(directory)), "-m", RERUN_MODULE],
            input=request,
            capture_output=True,
            text=True,
            env=pinned_environment(pin),
            timeout=ELSEWHERE_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise SystemUnavailable(
            pin.spec, f"its rerun in {directory} ran past {ELSEWHERE_SECONDS:g} s"
        ) from None
    try:
        answer = json.loads(finished.stdout)
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or "error" in answer:
        said = answer["error"] if isinstance(answer, dict) else None
        if said is None:
            last = (finished.stderr.strip().splitlines() or ["no output"])[-1]
            said = f"exit {finished.returncode}: {last}"
        raise SystemUnavailable(pin.spec, f"its rerun in {directory} did not run: {said}")
    return answer
