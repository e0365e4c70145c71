"""How a mutant changes shipped code it cannot reach by subclassing: one module global (or
class attribute) swapped for the length of one call. The SQLite queue's mutants and
walqueue's share the one lock below.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

#: Campaign cases run on two threads of one process: two overlapping swaps of one global
#: would restore each other's value and leave a mutant's change behind for the next system.
_SWAPPING = threading.RLock()


@contextlib.contextmanager
def patched(target: Any, attribute: str, value: Any) -> Iterator[None]:
    """Swap one module global for the duration of one call, one thread at a time."""
    with _SWAPPING:
        original = getattr(target, attribute)
        setattr(target, attribute, value)
        try:
            yield
        finally:
            setattr(target, attribute, original)
