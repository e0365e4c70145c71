"""Staging group commit for the lab: a call of the SQLite queue made while a second writer
of the same store holds the line, carries the call in its own transaction, and then
commits, or dies at one of three moments (``CARRIER_FATES``).

Under chaos these paths are taken only when the scheduler says so; here a probe or the
model workload takes each on purpose and judges what the caller was told against the store.
The carrier reaches into the queue's turn lock and transaction, as the queue's own
group-commit tests do: it is a second queue on the same file, in a thread of its own; its
connection and its open file description of the turn lock are its own, so SQLite and the
kernel treat it as another process. It dies as a killed process would: its transaction
ends (committed or not), and its turn lock is closed without finishing its turn, which
drops its locks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from crashqueuelab.core import requestslots
from crashqueuelab.core.ids import SeededIds
from crashqueuelab.core.locking import begin_immediate
from crashqueuelab.core.queue import DurableQueue
from crashqueuelab.core.requestslots import SlotState
from crashqueuelab.core.turns import Served
from crashqueuelab.systems.contract import (
    CARRIER_FATES,
    COMMITS,
    DIES_AFTER_COMMIT,
    DIES_AFTER_TAKING,
)

T = TypeVar("T")
#: Every wait of a staged carrier is bounded by this (seconds).
WAIT_S = 10.0
_POLL_S = 0.001


class CarrierFailed(RuntimeError):
    """The staged carrier could not play its part (the call was never posted in time)."""


def behind_a_carrier(follower: DurableQueue, call: Callable[[], T], fate: str) -> T:
    """Make ``call`` (a single call on ``follower``) wait behind a carrier that meets
    ``fate``; the call's own answer."""
    if fate not in CARRIER_FATES:
        raise ValueError(f"unknown carrier fate {fate!r}; one of {', '.join(CARRIER_FATES)}")
    holding = threading.Event()
    errors: list[BaseException] = []
    carrier = threading.Thread(
        target=_carry, args=(follower, fate, holding, errors), name="staged-carrier", daemon=True
    )
    carrier.start()
    try:
        if not holding.wait(WAIT_S):
            raise CarrierFailed("the staged carrier never took its turn")
        if errors:
            raise errors[0]
        return call()
    finally:
        carrier.join(WAIT_S)
        if errors and not isinstance(errors[0], CarrierFailed):
            raise errors[0]


def _carry(
    follower: DurableQueue, fate: str, holding: threading.Event, errors: list[BaseException]
) -> None:
    try:
        queue = type(follower)(
            follower.path,
            clock=follower._clock,
            ids=SeededIds(0, "staged-carrier"),
            retry=follower._retry,
            create=False,
            group_commit=True,
        )
    except BaseException as error:  # handed to the caller's thread
        errors.append(error)
        holding.set()
        return
    try:
        turns = queue._turns
        ticket = turns.acquire(timeout_s=WAIT_S)
        holding.set()
        _await_request(queue, ticket)
        if fate == COMMITS:
            with queue._transaction(Served(ticket, taken=False)):
                pass
            return
        conn = queue.connection
        begin_immediate(conn, timeout_s=WAIT_S)
        taken = turns.take(ticket, limit=1, timeout_s=WAIT_S)
        if fate != DIES_AFTER_TAKING:
            behind = [waiting for waiting, _ in taken]
            results = queue._carry(taken)
            turns.note(list(zip(behind, results, strict=True)), timeout_s=WAIT_S)
        conn.execute("COMMIT" if fate == DIES_AFTER_COMMIT else "ROLLBACK")
        turns.close()  # dies: its locks drop with it, its turn never finishes
    except BaseException as error:
        errors.append(error)
        holding.set()
    finally:
        queue.close()


def _await_request(queue: DurableQueue, ticket: int) -> None:
    """Wait until the writer right behind ``ticket`` posted its request."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        header = requestslots.read_header(queue._turns._descriptor, ticket + 1)
        if header.ticket == ticket + 1 and header.state is SlotState.POSTED:
            return
        time.sleep(_POLL_S)
    raise CarrierFailed(f"no request was posted behind the carrier within {WAIT_S} s")
