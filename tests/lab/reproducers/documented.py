"""A system that documents one of its failures, as a library declares its weaknesses: what
the reproducer tests name as ``tests.lab.reproducers.documented:documented_no_fencing``
(imported by the exported files they run, so it holds nothing but the system)."""

from __future__ import annotations

from dataclasses import replace

from crashqueuelab.lab.mutants.catalog import no_fencing
from crashqueuelab.systems.contract import Documented, System

WEAKNESS = Documented(
    what="no fencing after expiry: a holder whose lease expired may still acknowledge",
    source="https://example.org/queue/leases",
    explains=("probe stale_holder_after_expiry: *",),
)


def documented_no_fencing() -> System:
    """The unfencing mutant of the shipped queue, declaring that a stale holder's
    acknowledgement is accepted: that probe's failure is documented, the acknowledgement of
    an old lease under a reused worker id is still a bug."""
    return replace(no_fencing(), documented=(WEAKNESS,))
