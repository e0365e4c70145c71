"""Crash children: spawning one with a bounded wait, its last words, and its death.

A child is ``python -m crashqueuelab.lab.campaign.child`` in a case directory. Before it dies at
its crash point it writes and syncs a tiny JSON file naming the point (its last words), so
the parent can prove where it died even where two points leave the same durable state.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

#: The exit status of a child killed at its crash point.
CRASH_EXIT_CODE = 86
#: A child that has not died after this long is killed and recorded as a timeout.
CHILD_TIMEOUT_S = 60.0
#: The file a dying child names its crash point in, inside its case directory.
LAST_WORDS_FILE = "crash-point.json"
#: The crash points a child that did not die at its own passed, in order (a JSON list).
POINTS_REACHED_FILE = "points-reached.json"
CHILD_STDERR = "child.stderr"
#: What the ``crashqueuelab`` console script imports. multiprocessing re-runs a main script
#: in every child it starts (``python -m`` it skips), so fork servers preload this module.
CLI_MODULE = "crashqueuelab.cli"


def die_with_last_words(point: str, last_words: str | None) -> NoReturn:
    """Write (and sync) the last words, if asked, then end the process at once."""
    if last_words is not None:
        path = Path(last_words)
        data = json.dumps({"fault_point": point, "pid": os.getpid()}).encode()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    os._exit(CRASH_EXIT_CODE)


def read_last_words(case_dir: Path) -> str | None:
    """The crash point a dead child named, or None when it left no (readable) words."""
    path = case_dir / LAST_WORDS_FILE
    try:
        point = json.loads(path.read_text()).get("fault_point")
    except (OSError, ValueError, AttributeError):
        return None
    return point if isinstance(point, str) else None


def read_points_reached(case_dir: Path) -> list[str] | None:
    """The crash points a child that did not die at its own reached, in order; None when it
    left no list (it died, or could not write one)."""
    try:
        points = json.loads((case_dir / POINTS_REACHED_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(points, list):
        return None
    return [str(point) for point in points]


@dataclass(frozen=True)
class ChildRun:
    """How a crash child ended."""

    exit_code: int | None
    timed_out: bool
    elapsed_ms: float


def _child_environment() -> dict[str, str]:
    # A system given as module:factory must import in the child as it did in the parent.
    environment = dict(os.environ)
    paths = [entry for entry in sys.path if entry]
    if environment.get("PYTHONPATH"):
        paths.append(environment["PYTHONPATH"])
    environment["PYTHONPATH"] = os.pathsep.join(paths)
    return environment


def spawn_child(case_dir: Path, arguments: list[str], *, timeout_s: float) -> ChildRun:
    """Run a crash child with a bounded wait; kill it on timeout. Stderr is kept."""
    command = [
        sys.executable,
        "-m",
        "crashqueuelab.lab.campaign.child",
        "--case-dir",
        str(case_dir),
    ]
    started = time.perf_counter()
    with (case_dir / CHILD_STDERR).open("ab") as stderr:
        child = subprocess.Popen(
            [*command, *arguments],
            stdin=subprocess.DEVNULL,
            stdout=stderr,
            stderr=stderr,
            env=_child_environment(),
            # Out of the terminal's process group: a Ctrl-C stops the campaign, which lets
            # the case in flight end at its crash point (every wait for it is bounded).
            start_new_session=True,
        )
        try:
            exit_code: int | None = child.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            exit_code, timed_out = None, True
    return ChildRun(exit_code, timed_out, (time.perf_counter() - started) * 1000)
