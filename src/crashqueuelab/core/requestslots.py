"""Where a writer waiting in line posts a request for the turn ahead of it to carry.

Group commit across processes (turns.py, groupcommit.py): a waiting writer leaves its
single claim or acknowledgement in a slot of the line's sidecar file; the writer being
served runs it inside its own transaction, so one commit (one fsync) serves several
processes. This module is the slots' byte layout only; every change of a slot's state is
made by turns.py under the line's counter lock, which orders it against every other.

From ``SLOTS_AT``, ``COUNT`` slots of ``SLOT_BYTES``; ticket ``t`` uses slot ``t % COUNT``.
A slot is a header (the ticket that posted it, its state, the lengths of the request and
the result), the request from ``_REQUEST_AT`` and the carrier's result from ``_RESULT_AT``.
A request or result that does not fit is never posted or carried; its writer runs it in
its own turn instead.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from enum import IntEnum

#: After the turn line's counters, slot bytes and futex words (turns.py), page-aligned.
SLOTS_AT = 32768
COUNT = 256
SLOT_BYTES = 8192
_HEADER = struct.Struct("<QB3xII")
_REQUEST_AT = 32
_RESULT_AT = 2048
REQUEST_MAX = _RESULT_AT - _REQUEST_AT
RESULT_MAX = SLOT_BYTES - _RESULT_AT


class SlotState(IntEnum):
    """Where a posted request stands."""

    #: Nothing posted (or its writer took it back).
    EMPTY = 0
    #: Waiting for a carrier.
    POSTED = 1
    #: A carrier runs it in its open transaction; its result, once noted, is in the slot.
    TAKEN = 2
    #: The carrier's transaction committed it: the result stands.
    DONE = 3
    #: The carrier gave it back without writing anything: its writer runs it in its turn.
    REFUSED = 4


@dataclass(frozen=True)
class SlotHeader:
    ticket: int
    state: SlotState
    request_length: int
    result_length: int


def _at(ticket: int) -> int:
    return SLOTS_AT + (ticket % COUNT) * SLOT_BYTES


def read_header(fd: int, ticket: int) -> SlotHeader:
    """The header of the slot ``ticket`` uses (whoever posted there last)."""
    data = os.pread(fd, _HEADER.size, _at(ticket))
    if len(data) < _HEADER.size:
        return SlotHeader(0, SlotState.EMPTY, 0, 0)
    posted_by, state, request_length, result_length = _HEADER.unpack(data)
    return SlotHeader(posted_by, SlotState(state), request_length, result_length)


def write_header(fd: int, ticket: int, state: SlotState, request: int, result: int) -> None:
    os.pwrite(fd, _HEADER.pack(ticket, state, request, result), _at(ticket))


def write_request(fd: int, ticket: int, request: bytes) -> None:
    """Post ``request`` (at most ``REQUEST_MAX`` bytes) in ``ticket``'s slot."""
    os.pwrite(fd, request, _at(ticket) + _REQUEST_AT)
    write_header(fd, ticket, SlotState.POSTED, len(request), 0)


def read_request(fd: int, header: SlotHeader) -> bytes:
    return os.pread(fd, header.request_length, _at(header.ticket) + _REQUEST_AT)


def write_result(fd: int, header: SlotHeader, result: bytes) -> None:
    """Note the carrier's ``result`` (at most ``RESULT_MAX`` bytes); the state stays."""
    os.pwrite(fd, result, _at(header.ticket) + _RESULT_AT)
    write_header(fd, header.ticket, header.state, header.request_length, len(result))


def read_result(fd: int, header: SlotHeader) -> bytes:
    return os.pread(fd, header.result_length, _at(header.ticket) + _RESULT_AT)
