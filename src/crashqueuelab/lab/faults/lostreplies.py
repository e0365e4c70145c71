"""A crash child whose connection to the server loses the answer to one COMMIT.

For a reply-lost crash point (``systems.contract.reply_lost_phases``) the child starts a
fault proxy of its own on the loopback interface (``lab.network``), between itself and the
run's PostgreSQL server, and names the proxy as the server to the system it opens. At the
transition's BEFORE phase (inside the transaction, every statement answered) the proxy
starts dropping the server's answers: the COMMIT reaches the server and its answer never
comes back; when the window ends the connection is reset. Only the server knows whether
the transition happened. At the transition's AFTER phase, which the system reaches only
once it has decided that the transition committed, the child dies as at any crash point
(with other last words, so that the case fails, if the proxy dropped no answer).
A system that retries instead, or gives up (``OutcomeUnknown``), never reaches it: the case
fails, and says which points it did reach.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from crashqueuelab.lab.faults.children import die_with_last_words
from crashqueuelab.lab.faults.network.plan import upstream_of
from crashqueuelab.lab.faults.network.proxy import FaultProxy
from crashqueuelab.lab.faults.network.windows import WindowKind
from crashqueuelab.lab.runs.servers import SERVER_VARIABLES
from crashqueuelab.systems.crashpoints import (
    reply_lost_phases,
)

#: How long the server's answers are dropped before the connection is reset.
WINDOW_S = 0.3
_PATH = "crash-child"


@contextmanager
def replies_lost_at(point: str, last_words: str | None) -> Iterator[Callable[[str], None]]:
    """The hook of a child at reply-lost ``point``, with the proxy running until the block
    ends (a death at the point ends it with the process)."""
    phases = reply_lost_phases(point)
    if phases is None:
        raise ValueError(f"{point} is not a reply-lost crash point")
    before, after = phases
    variable = SERVER_VARIABLES[0]
    dsn = os.environ.get(variable)
    if not dsn:
        raise RuntimeError(f"{point}: a reply-lost point needs the run's server ({variable})")
    upstream, through = upstream_of(dsn)
    armed = [False]
    with FaultProxy(upstream) as proxy:
        os.environ[variable] = through(proxy.add_path(_PATH))

        def hook(phase: str) -> None:
            if phase == before and not armed[0]:
                armed[0] = True
                proxy.apply(WindowKind.LOST_REPLIES, [_PATH], seconds=WINDOW_S)
            elif phase == after and armed[0]:
                # Only a death after a lost answer is this point's: anything else proved
                # nothing, and its last words say so (the case then fails).
                lost = proxy.counts[_PATH]["lost_replies"] if _PATH in proxy.counts else 0
                words = point if lost else f"{point}: no answer was lost"
                die_with_last_words(words, last_words)

        try:
            yield hook
        finally:
            os.environ[variable] = dsn
