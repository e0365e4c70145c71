"""The lab's own workers' documented shutdown (docs/real-queues.md, "Deploys"; docs/chaos.md):
a stop signal asks, it never cuts. The worker finishes the jobs in hand and acknowledges
them, takes no new one and exits 0; a second signal changes nothing. A process manager's
SIGKILL at the end of its grace period is what cuts a worker that did not make it.

Both of the lab's worker loops keep it: the deploy experiment's (``lab/deploys/labworker.py``,
one job at a time, SIGTERM and SIGINT) and chaos's (``lab/chaos/processes.py``, a claimed
batch, SIGTERM alone: SIGINT stays the supervisor's, as Ctrl-C reaches the whole group).
"""

from __future__ import annotations

import signal
import threading

from crashqueuelab.lab.runs.stopsignals import event_set_by

#: What a graceful stop does, in the words a record and a page give it.
GRACEFUL = "finish the job in hand and acknowledge it, take no new one, exit 0"


def stop_on(*signals: signal.Signals) -> threading.Event:
    """In a worker's main thread: an event each of ``signals`` sets (a second one changes
    nothing). The loop asks it before it takes new work and waits on it
    when idle; the work in hand is never interrupted."""
    return event_set_by(*signals)
