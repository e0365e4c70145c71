"""Progress lines on stderr: every one on a terminal (with a bar where the line says how
far along the run is), one every few seconds into a pipe or a file, none with --quiet."""

from __future__ import annotations

import argparse
import re
import time
from typing import TextIO

from crashqueuelab.lab.runs.progress import Progress

#: Off a terminal, at most one progress line this often (seconds).
PROGRESS_EVERY_S = 5.0
_FRACTION = re.compile(r"(\d[\d,]*)/(\d[\d,]*)")


def _bar(stream: TextIO) -> Progress:
    """On a terminal: each line, with a bar and an estimate of the time left when the line
    says how far along the run is (``12/23``)."""
    started = time.monotonic()

    def show(message: str) -> None:
        found = _FRACTION.search(message)
        if found is None:
            print(message, file=stream, flush=True)
            return
        done, total = (int(part.replace(",", "")) for part in found.groups())
        share = min(1.0, done / total) if total else 1.0
        elapsed = time.monotonic() - started
        left = f", about {elapsed / share - elapsed:.0f} s left" if 0 < share < 1 else ""
        bar = "#" * round(share * 20) + "." * (20 - round(share * 20))
        print(f"[{bar}] {message}{left}", file=stream, flush=True)

    return show


def progress_for(args: argparse.Namespace) -> Progress | None:
    """Every progress line on a terminal; one every few seconds into a pipe or a file;
    none with ``--quiet``. Every long command behaves alike."""
    stream: TextIO = args.stderr
    if args.quiet:
        return None
    if stream.isatty():
        return _bar(stream)
    last = [-PROGRESS_EVERY_S]

    def throttled(message: str) -> None:
        now = time.monotonic()
        if now - last[0] >= PROGRESS_EVERY_S:
            last[0] = now
            print(message, file=stream, flush=True)

    return throttled
