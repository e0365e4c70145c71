"""One shape for every fault deliverer: a planned fault goes in, its record comes out.

A deliverer declares the ``kinds`` it delivers and strikes a target through the narrow
interface those kinds need (``signals.py``: the workers and their leases; ``powercut.py``:
the power supply; ``server.py``: the system's server; ``network/deliverer.py``: the fault
proxy), never through a whole run, so any experiment whose run offers that interface can
deliver it. A run looks its deliverers up in a table keyed by ``FaultKind`` (``by_kind``).
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

from crashqueuelab.lab.faults.kinds import FaultKind

#: What a run records of one fault: what was planned, what it struck and when it landed
#: (``at_s``, seconds into the run), or why it was ``skipped``. The run keeps the very dict:
#: what happens to the fault later (a pause continued, its late acknowledgements judged) is
#: added to it.
Record = dict[str, Any]

Target_contra = TypeVar("Target_contra", contravariant=True)
Target = TypeVar("Target")


class Fault(Protocol):
    """A fault a schedule planned: the ``worker_slot`` it should hit, once
    ``after_finished`` jobs are done, ``delay_ms`` later."""

    @property
    def index(self) -> int: ...

    @property
    def kind(self) -> FaultKind: ...

    @property
    def worker_slot(self) -> int: ...

    @property
    def after_finished(self) -> int: ...

    @property
    def delay_ms(self) -> float: ...


class Process(Protocol):
    """A started worker process (a ``multiprocessing`` process): its pid is known."""

    @property
    def pid(self) -> int: ...

    @property
    def exitcode(self) -> int | None: ...

    def join(self, timeout: float | None = None) -> None: ...


class Worker(Protocol):
    """The worker in one slot of a run: a respawned worker takes its slot over."""

    @property
    def index(self) -> int: ...

    @property
    def worker_id(self) -> str: ...

    @property
    def process(self) -> Process: ...

    #: When it was started, on the monotonic clock.
    @property
    def started_at(self) -> float: ...


class Deliverer(Protocol[Target_contra]):
    """Delivers the faults of its ``kinds`` to a target (what the run shows of itself)."""

    @property
    def kinds(self) -> frozenset[FaultKind]: ...

    def deliver(self, fault: Fault, target: Target_contra) -> Record | None:
        """Strike ``target`` with ``fault`` and say what landed; None when nothing can be
        struck now (every worker paused or too fresh): the run tries it again later."""
        ...


def by_kind(*deliverers: Deliverer[Target]) -> dict[FaultKind, Deliverer[Target]]:
    """The table a run delivers its faults through: each kind to its one deliverer."""
    table: dict[FaultKind, Deliverer[Target]] = {}
    for deliverer in deliverers:
        for kind in deliverer.kinds:
            if kind in table:
                raise ValueError(f"two deliverers for {kind.value}")
            table[kind] = deliverer
    return table


def landed_count(records: list[Record], kind: FaultKind) -> int:
    """How many faults of ``kind`` landed (a skipped one has no ``at_s``)."""
    return sum(1 for record in records if record["kind"] == kind.value and "at_s" in record)
