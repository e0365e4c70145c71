"""Progress lines: what a long run says while it works, each naming what it belongs to."""

from __future__ import annotations

from collections.abc import Callable

#: Takes one line of progress (the command line decides where it goes, and how often).
Progress = Callable[[str], None]


def labelled(progress: Progress | None, label: str) -> Progress | None:
    """``progress`` with every line led by ``label`` (the experiment, the system, the crash
    mode), so lines from the parts of a showcase never read as one run's."""
    if progress is None:
        return None
    sink = progress

    def say(message: str) -> None:
        sink(f"{label}: {message}")

    return say
