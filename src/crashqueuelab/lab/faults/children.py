"""Crash children: starting one with a bounded wait, its last words, and its death.

A child is a real process forked for one case from the run's fork server (which has the
child's code and the system's module imported already, and holds no connection), in a
session of its own, with its output in the case directory's ``child.stderr``, the parent's
environment and import path. It runs the entry point it is given with its arguments
(``lab.campaign.child.main``). Before it dies at its crash point it writes and syncs a tiny
JSON file naming the point (its last words), so the parent can prove where it died even
where two points leave the same durable state.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from crashqueuelab.lab.runs.interrupts import forkserver_context, start_owned

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


#: A crash child's entry point: its arguments in, its exit status out.
ChildMain = Callable[[list[str]], int]


def spawn_child(
    case_dir: Path,
    main: ChildMain,
    arguments: Sequence[str],
    *,
    timeout_s: float,
    preload: Sequence[str] = (),
) -> ChildRun:
    """Run ``main(["--case-dir", case_dir, *arguments])`` in a crash child with a bounded
    wait; kill it on timeout.
    Its output is kept in ``CHILD_STDERR``. ``preload``: modules the fork server imports
    once, so a child does not (the system's module)."""
    context = forkserver_context([CLI_MODULE, main.__module__, *preload])
    child = context.Process(
        target=_child,
        args=(
            main,
            ["--case-dir", str(case_dir), *arguments],
            str(case_dir / CHILD_STDERR),
            dict(os.environ),
            sys.path,
        ),
        name=f"crash child {case_dir.name}",
    )
    started = time.perf_counter()
    try:
        start_owned(child)
        child.join(timeout_s)
        timed_out = child.is_alive()
        if timed_out:
            child.kill()
            child.join()
    except BaseException:
        # Interrupted: the case in flight must not outlive its run.
        if child.pid is not None:
            child.kill()
            child.join()
        raise
    exit_code = None if timed_out else child.exitcode
    child.close()
    return ChildRun(exit_code, timed_out, (time.perf_counter() - started) * 1000)


def _child(
    main: ChildMain,
    arguments: list[str],
    stderr: str,
    environment: dict[str, str],
    import_path: list[str],
) -> None:
    """In the forked child: a session of its own (a Ctrl-C at the terminal goes to the
    run, which stops its cases itself), output to the case directory, the parent's
    environment and import path as they are now (the fork server has what they were when
    it started: a system given as module:factory must import here as it did there)."""
    os.setsid()
    output = os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    nothing = os.open(os.devnull, os.O_RDONLY)
    os.dup2(nothing, 0)
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.close(output)
    os.close(nothing)
    os.environ.clear()
    os.environ.update(environment)
    sys.path[:0] = [entry for entry in import_path if entry not in sys.path]
    sys.exit(main(arguments))
