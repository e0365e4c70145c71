"""Fair turns at the write lock: a first-come, first-served ticket lock across processes.

SQLite's busy handler sleeps 1, 2, 5 ... 100 ms between attempts while a transaction here
holds the write lock for about 0.2 ms, so the writer that just committed takes the lock
again before any sleeper wakes and, under contention, other workers starve. Polling faster
instead burns the CPU the lock holder needs. So writers take turns, like customers taking a
number at a counter:

- a sidecar file (``<database>-turns``) holds two 8-byte counters: the next ticket and the
  ticket now served, followed by one byte per ticket slot and, from byte 8192, one 4-byte
  futex word per slot;
- to write, a process takes the next ticket (under a short lock on the counters) and locks
  its slot byte; it waits until "now served" reaches its ticket, then runs its SQLite
  transaction; releasing advances "now served" and unlocks the slot;
- a waiter sleeps on its slot's futex word (futex.py) until the turn before its own ends:
  releasing a turn wakes exactly the next ticket's waiter, so nobody polls and the CPU
  stays with the holder. Waits time out (1 ms for the next in line, longer further back)
  so a dead or stuck neighbour is noticed; where futexes are unavailable, a waiter polls
  instead, sleeping in proportion to its distance from the head of the line;
- the slot locks are Linux open-file-description locks, which the kernel releases when a
  process dies: a waiter that finds the ticket being served has no live owner (its process
  was killed while waiting or while holding its turn) skips it. A killed worker can
  therefore never block the line, and every wait is bounded by the caller's timeout.

A process that is stopped (SIGSTOP) while holding or awaiting its turn does hold up the
line until it continues, exactly as it would hold SQLite's own lock.
"""

from __future__ import annotations

import fcntl
import os
import random
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from crashqueuelab.core import requestslots
from crashqueuelab.core.errors import StoreError
from crashqueuelab.core.futex import FutexWords, futex_available
from crashqueuelab.core.requestslots import SlotState

_NEXT_TICKET = 0
_SERVING = 8
_SLOTS_AT = 16
#: More concurrent writers than this would wrap onto a slot still in use.
SLOTS = 4096
#: Where the slots' futex words start (page-aligned, after the slot bytes).
_WORDS_AT = 8192
_FLOCK = "@hhqqi4x"  # struct flock: l_type, l_whence, l_start, l_len, l_pid (+ padding)
_HEAD_SLEEP_S = 20e-6
_LONGEST_SLEEP_S = 2e-3
#: About how long one turn lasts; a waiter k places back sleeps about k times this.
_TURN_ESTIMATE_S = 150e-6
#: How long a futex sleeper waits before it looks at the line again: the next in line
#: soon (its holder may have died), the others rarely (a dead waiter ahead of them is
#: handed over past at once, see ``_hand_over``).
_HEAD_WAIT_S = 1e-3
_FAR_WAIT_S = 50e-3
#: A turn served for longer than this is presumed stuck (a stopped process) and skipped.
#: Skipping is always safe: SQLite's own write lock still serialises the transactions.
STUCK_AFTER_S = 0.25


#: How much longer than its deadline a writer waits for the counter lock to take its
#: request back (the lock is held for microseconds).
_GIVE_UP_GRACE_S = 1.0
#: Slot states in which the carrier has finished with a request.
_SETTLED = (SlotState.DONE, SlotState.REFUSED)


@dataclass(frozen=True)
class Served:
    """This process's turn came: it runs its transaction, then calls ``release``."""

    ticket: int
    #: Whether a carrier took the posted request and vanished before finishing it (died,
    #: or was skipped as stuck): its transaction may or may not have committed it. The
    #: writer then calls ``reclaim`` once it holds SQLite's write lock, so that the
    #: carrier's transaction has ended, and decides from the database.
    taken: bool


@dataclass(frozen=True)
class Carried:
    """A carrier's committed transaction ran the posted request; the ticket is spent."""

    result: bytes


class TurnTimeout(StoreError):
    """Raised when the line does not reach a writer's ticket within its timeout."""

    kind = "TurnTimeout"


def _lock(fd: int, command: int, kind: int, start: int, length: int = 1) -> bytes:
    request = struct.pack(_FLOCK, kind, os.SEEK_SET, start, length, 0)
    result: bytes = fcntl.fcntl(fd, command, request)
    return result


class TurnLock:
    """The ticket line of one database, through one open file description."""

    def __init__(self, path: Path, *, futex: bool | None = None) -> None:
        """``futex`` None uses futexes where they work, True insists on them, False polls."""
        self.path = path
        self._fd: int | None = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._jitter = random.Random()
        #: Tickets of this lock whose request is posted and not yet taken back.
        self._posted: set[int] = set()
        self._words: FutexWords | None = None
        if futex is False or (futex is None and not futex_available()):
            return
        try:
            self._words = FutexWords(self._fd, _WORDS_AT, SLOTS)
        except OSError:
            # A file system that cannot map the sidecar shared (some network and FUSE
            # mounts): unless futexes were demanded, the line polls as it would elsewhere.
            if futex:
                self.close()
                raise
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._words is not None:
            self._words.close()
            self._words = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @property
    def _descriptor(self) -> int:
        if self._fd is None:
            raise StoreError(str(self.path), "the turn lock is closed")
        return self._fd

    def _read(self, offset: int) -> int:
        data = os.pread(self._descriptor, 8, offset)
        return int.from_bytes(data, "little") if len(data) == 8 else 0

    def _write(self, offset: int, value: int) -> None:
        os.pwrite(self._descriptor, value.to_bytes(8, "little"), offset)

    def _with_counters(self, deadline: float) -> None:
        """Lock the two counters (held for microseconds, so a short poll suffices)."""
        while True:
            try:
                _lock(self._descriptor, fcntl.F_OFD_SETLK, fcntl.F_WRLCK, 0, _SLOTS_AT)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TurnTimeout(str(self.path), "the ticket counters stayed locked") from None
                time.sleep(_HEAD_SLEEP_S)

    def _release_counters(self) -> None:
        _lock(self._descriptor, fcntl.F_OFD_SETLK, fcntl.F_UNLCK, 0, _SLOTS_AT)

    def _slot(self, ticket: int) -> int:
        return _SLOTS_AT + ticket % SLOTS

    def _slot_owned(self, ticket: int) -> bool:
        reply = _lock(self._descriptor, fcntl.F_OFD_GETLK, fcntl.F_WRLCK, self._slot(ticket))
        kind: int = struct.unpack(_FLOCK, reply)[0]
        return kind != fcntl.F_UNLCK

    def acquire(self, *, timeout_s: float) -> int:
        """Wait for this process's turn; returns the ticket to pass to ``release``."""
        deadline = time.monotonic() + timeout_s
        ticket, now_served = self._take_ticket(None, deadline)
        if not now_served:
            served = self._wait(ticket, deadline, posted=False)
            assert isinstance(served, Served)  # nothing was posted, so nothing is carried
        return ticket

    def enter(self, request: Callable[[], bytes], *, timeout_s: float) -> Served | Carried:
        """Take a ticket, post the request (``request()``'s bytes) for a carrier, and wait:
        for this process's own turn (``Served``: run the request, or what a vanished
        carrier left of it, and ``release``), or for a carrier's commit (``Carried``: the
        ticket is spent).

        A writer served at once posts nothing (``request`` is not even called), nor does
        one whose request is longer than ``requestslots.REQUEST_MAX`` or whose slot another
        live writer still uses: it simply waits for its own turn.
        """
        deadline = time.monotonic() + timeout_s
        ticket, now_served = self._take_ticket(request, deadline)
        if now_served:
            return Served(ticket, taken=False)
        return self._wait(ticket, deadline, posted=ticket in self._posted)

    def _take_ticket(
        self, request: Callable[[], bytes] | None, deadline: float
    ) -> tuple[int, bool]:
        """A new ticket, and whether it is already served (nobody ahead of it); posts the
        request of a writer that will have to wait."""
        self._with_counters(deadline)
        try:
            ticket = self._read(_NEXT_TICKET)
            self._write(_NEXT_TICKET, ticket + 1)
            try:
                _lock(self._descriptor, fcntl.F_OFD_SETLK, fcntl.F_WRLCK, self._slot(ticket))
            except BlockingIOError:
                raise StoreError(str(self.path), f"more than {SLOTS} writers in line") from None
            now_served = self._read(_SERVING) >= ticket
            if request is not None and not now_served:
                posted = request()
                if self._slot_free(ticket, posted):
                    requestslots.write_request(self._descriptor, ticket, posted)
                    self._posted.add(ticket)
        finally:
            self._release_counters()
        return ticket, now_served

    def _slot_free(self, ticket: int, request: bytes) -> bool:
        """Whether ``ticket`` may post ``request``: it fits, and nobody alive uses the slot."""
        if len(request) > requestslots.REQUEST_MAX:
            return False
        header = requestslots.read_header(self._descriptor, ticket)
        return header.state is SlotState.EMPTY or not self._slot_owned(header.ticket)

    def _wait(self, ticket: int, deadline: float, *, posted: bool) -> Served | Carried:
        watched, since = -1, time.monotonic()
        while True:
            # Read before the line: a hand-over after this read changes the word, and the
            # wait below then returns at once instead of missing it.
            seen = self._words.value(ticket) if self._words is not None else 0
            if posted and requestslots.read_header(self._descriptor, ticket).state in _SETTLED:
                return self._settle(ticket, deadline, served=False)
            serving = self._read(_SERVING)
            if serving >= ticket:
                if posted:
                    return self._settle(ticket, deadline, served=True)
                return Served(ticket, taken=False)
            now = time.monotonic()
            if serving != watched:
                watched, since = serving, now
            if not self._slot_owned(serving) or now - since > STUCK_AFTER_S:
                self._skip(serving, deadline)
                continue
            if time.monotonic() >= deadline:
                return self._time_out(ticket, deadline, posted=posted)
            self._pause(ticket, seen, ticket - serving, deadline)

    def _settle(self, ticket: int, deadline: float, *, served: bool) -> Served | Carried:
        """Take the posted request back, as its carrier left it.

        Done: the carrier committed it and this ticket is spent. Refused: the carrier gave
        it back untouched, and the writer keeps its place in line. Taken but not done when
        the line reached this ticket: the carrier vanished; the slot stays as it is until
        the writer ``reclaim``s it.
        """
        state, result = self._withdraw(ticket, deadline, keep_taken=served)
        if state is SlotState.DONE:
            self.release(ticket)
            return Carried(result)
        if state is SlotState.REFUSED and not served:
            return self._wait(ticket, deadline, posted=False)
        return Served(ticket, taken=state is SlotState.TAKEN)

    def _withdraw(
        self, ticket: int, deadline: float, *, keep_taken: bool = False
    ) -> tuple[SlotState, bytes]:
        """Empty ``ticket``'s slot (unless TAKEN and ``keep_taken``); how its carrier, if
        any, left it, and its result.

        Emptied, the slot is out of reach of a carrier that comes back late: ``note`` and
        ``finish`` only touch a slot still TAKEN under the same ticket.
        """
        fd = self._descriptor
        # The counters are held for microseconds; a writer past its deadline still waits
        # this long for them, or its request could be carried after it gave up.
        self._with_counters(deadline + _GIVE_UP_GRACE_S)
        try:
            header = requestslots.read_header(fd, ticket)
            state = header.state if header.ticket == ticket else SlotState.EMPTY
            result = requestslots.read_result(fd, header) if state >= SlotState.TAKEN else b""
            if state is not SlotState.EMPTY and not (keep_taken and state is SlotState.TAKEN):
                requestslots.write_header(fd, ticket, SlotState.EMPTY, 0, 0)
        finally:
            self._release_counters()
        self._posted.discard(ticket)
        return state, result

    def reclaim(self, ticket: int, *, timeout_s: float) -> bytes:
        """The result a vanished carrier noted for ``ticket`` (empty if none); empties the slot.

        Call it holding SQLite's write lock: the carrier's transaction has then ended, and
        had it committed, it noted its result before its COMMIT.
        """
        state, result = self._withdraw(ticket, time.monotonic() + timeout_s)
        return result if state in (SlotState.TAKEN, SlotState.DONE) else b""

    def _time_out(self, ticket: int, deadline: float, *, posted: bool) -> Carried:
        """Give the ticket up (whoever reaches it finds its slot free and skips it) and
        raise TurnTimeout, unless a carrier committed the request meanwhile."""
        state = SlotState.EMPTY
        if posted:
            state, result = self._withdraw(ticket, deadline)
            if state is SlotState.DONE:
                self.release(ticket)
                return Carried(result)
        _lock(self._descriptor, fcntl.F_OFD_SETLK, fcntl.F_UNLCK, self._slot(ticket))
        detail = ""
        if state is SlotState.TAKEN:
            detail = "; its request is in another writer's open transaction, which may commit it"
        raise TurnTimeout(str(self.path), f"ticket {ticket} not served in time{detail}")

    # -- carrying (the writer being served) -------------------------------------------------

    def take(self, ticket: int, *, limit: int, timeout_s: float) -> list[tuple[int, bytes]]:
        """The requests posted by the live writers right behind ``ticket`` (this process's
        served turn), up to ``limit``, now TAKEN: run each, ``note`` the results, commit,
        then ``finish`` (or ``abandon`` on rollback)."""
        # Nobody behind (read without the lock: a writer arriving after it waits for its
        # own turn, which comes right after this one).
        if self._read(_NEXT_TICKET) <= ticket + 1:
            return []
        fd = self._descriptor
        taken: list[tuple[int, bytes]] = []
        self._with_counters(time.monotonic() + timeout_s)
        try:
            last = min(self._read(_NEXT_TICKET), ticket + 1 + limit)
            for behind in range(ticket + 1, last):
                header = requestslots.read_header(fd, behind)
                if header.ticket != behind or header.state is not SlotState.POSTED:
                    break
                if not self._slot_owned(behind):
                    break
                requestslots.write_header(fd, behind, SlotState.TAKEN, header.request_length, 0)
                taken.append((behind, requestslots.read_request(fd, header)))
        finally:
            self._release_counters()
        return taken

    def note(self, results: list[tuple[int, bytes | None]], *, timeout_s: float) -> None:
        """Before COMMIT: each taken ticket's result, or None to give it back untouched."""
        fd = self._descriptor
        self._with_counters(time.monotonic() + timeout_s)
        try:
            for ticket, result in results:
                header = requestslots.read_header(fd, ticket)
                if header.ticket != ticket or header.state is not SlotState.TAKEN:
                    continue
                if result is None:
                    requestslots.write_header(fd, ticket, SlotState.REFUSED, 0, 0)
                else:
                    requestslots.write_result(fd, header, result)
        finally:
            self._release_counters()

    def finish(self, ticket: int, carried: list[int], *, timeout_s: float) -> None:
        """After COMMIT: the carried requests are done; the line moves past the run of
        them right behind ``ticket``, their writers wake, and this turn ends."""
        if not carried:
            self.release(ticket)
            return
        fd = self._descriptor
        done: list[int] = []
        self._with_counters(time.monotonic() + timeout_s)
        try:
            for behind in carried:
                header = requestslots.read_header(fd, behind)
                if header.ticket == behind and header.state is SlotState.TAKEN:
                    requestslots.write_header(
                        fd, behind, SlotState.DONE, header.request_length, header.result_length
                    )
                    done.append(behind)
            past = ticket
            while past + 1 in done:
                past += 1
            # A turn that was skipped as stuck must not move the line back.
            moved = self._read(_SERVING) == ticket
            if moved:
                self._write(_SERVING, past + 1)
        finally:
            self._release_counters()
        # The next turn first: on a busy machine the woken writers compete for the CPU.
        if moved:
            self._hand_over(past + 1)
        if self._words is not None:
            for behind in done:
                self._words.wake(behind)
        _lock(fd, fcntl.F_OFD_SETLK, fcntl.F_UNLCK, self._slot(ticket))

    def abandon(self, carried: list[int], *, timeout_s: float) -> None:
        """After ROLLBACK: give every carried request back; its writer runs it itself."""
        self.note([(behind, None) for behind in carried], timeout_s=timeout_s)

    def _pause(self, ticket: int, seen: int, distance: int, deadline: float) -> None:
        """Wait a while for the line to move: on the ticket's futex word, or polling."""
        if self._words is not None:
            wait = _HEAD_WAIT_S if distance == 1 else _FAR_WAIT_S
            self._words.wait(ticket, seen, min(wait, deadline - time.monotonic()))
            return
        sleep = _HEAD_SLEEP_S if distance == 1 else distance * _TURN_ESTIMATE_S
        time.sleep(min(sleep, _LONGEST_SLEEP_S) * (0.5 + self._jitter.random()))

    def _hand_over(self, serving: int) -> None:
        """Wake the waiter of the ticket now served; if that ticket has no live owner (its
        process died or gave up while waiting), also the one behind it, who skips it.

        Called after "now served" was written: a ticket taken after the read below reads
        the new value before it waits, so when no later ticket was taken yet there is
        nobody to wake, and an uncontended turn costs one read instead of two calls.
        """
        if self._words is None or self._read(_NEXT_TICKET) <= serving:
            return
        self._words.wake(serving)
        if not self._slot_owned(serving):
            self._words.wake(serving + 1)

    def _skip(self, serving: int, deadline: float) -> None:
        """The served ticket is dead or stuck: advance the line past it, once."""
        self._with_counters(deadline)
        try:
            if self._read(_SERVING) == serving:
                self._write(_SERVING, serving + 1)
        finally:
            self._release_counters()
        self._hand_over(serving + 1)

    def release(self, ticket: int) -> None:
        """End this turn: serve the next ticket (unless the line moved on), free the slot."""
        # A turn that was skipped as stuck must not move the line back.
        if self._read(_SERVING) == ticket:
            self._write(_SERVING, ticket + 1)
            self._hand_over(ticket + 1)
        _lock(self._descriptor, fcntl.F_OFD_SETLK, fcntl.F_UNLCK, self._slot(ticket))
