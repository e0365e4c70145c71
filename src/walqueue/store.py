"""The directory: WAL segments, snapshots and the CURRENT pointer, and recovery from them.

Layout (pinned so other tools can read it): ``wal-{first_seq:020d}.log`` segments of frames,
``snapshot-{seq:020d}.json`` snapshots (one frame each), ``CURRENT`` (one frame naming the
published snapshot and its sequence), ``LOCK``; ``*.tmp`` files are never authoritative.

By default a segment is the seed's format: frames appended to a file created empty, each
synced before the call returns, a new segment once the live one would pass
``SEGMENT_BYTES``; a torn final frame of the newest segment is cut off (truncated) before
anything is appended.

``preallocate=True`` is a documented option with its own format: a segment is created full
of zeros (``SEGMENT_BYTES``, synced) and frames overwrite them in place, so a sync after a
write only flushes data instead of also committing the file's new size; the frames end at a
zero length field followed by zeros, and a torn tail is overwritten with zeros. A reader
written to the seed's format rejects such segments, and a directory written that way must
be opened with ``preallocate=True`` again (docs/walqueue.md).

Every step that puts bytes on disk calls the hook with a phase name first or after (the
phase list is in docs/walqueue.md), so a test can stop the process at any of them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from walqueue.codec import decode_frames, decode_single, encode_frame, written_end, zero_from
from walqueue.durability import fsync_directory, sync_data, write_file
from walqueue.errors import CorruptStore
from walqueue.state import State, apply, validate

Hook = Callable[[str], None]

CURRENT = "CURRENT"
#: A transaction that would take the live segment past this size starts the next segment
#: (one larger than a segment goes in alone, past it). With ``preallocate``, each segment is
#: created holding this many zeros.
SEGMENT_BYTES = 1024 * 1024
_SEGMENT = re.compile(r"^wal-(\d{20})\.log$")
_SNAPSHOT = re.compile(r"^snapshot-(\d{20})\.json$")


def segment_name(first_seq: int) -> str:
    return f"wal-{first_seq:020d}.log"


def snapshot_name(seq: int) -> str:
    return f"snapshot-{seq:020d}.json"


def _write_all_at(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _no_hook(phase: str) -> None:
    """The default hook: observes nothing."""


class Store:
    """Appends transactions durably and rebuilds the state from what is on disk."""

    def __init__(self, directory: Path, hook: Hook | None, *, preallocate: bool = False) -> None:
        self.directory = directory
        self.preallocate = preallocate
        self.hook: Hook = hook if hook is not None else _no_hook
        # Without a hook nobody can stop between the two halves of a frame, so one write
        # (one system call) does; with one, the midpoint is a crash point of its own.
        self._split_writes = hook is not None
        self.snapshot_seq = 0
        self._live: Path | None = None
        self._live_fd: int | None = None
        self._live_size = 0

    # -- recovery ------------------------------------------------------------------------

    def _segments(self) -> list[tuple[int, Path]]:
        found = []
        for path in self.directory.iterdir():
            match = _SEGMENT.match(path.name)
            if match:
                found.append((int(match.group(1)), path))
        return sorted(found)

    def _load_snapshot(self) -> State:
        current = self.directory / CURRENT
        if not current.exists():
            return State()
        pointer = decode_single(current.read_bytes(), where=CURRENT)
        name, seq = pointer.get("snapshot"), pointer.get("seq")
        if not isinstance(seq, int) or isinstance(seq, bool) or name != snapshot_name(seq):
            raise CorruptStore(f"{CURRENT}: names {name!r} at sequence {seq!r}")
        path = self.directory / name
        if not path.is_file():
            raise CorruptStore(f"{CURRENT} names {name}, which is missing")
        body = decode_single(path.read_bytes(), where=name)
        if body.get("seq") != seq or not isinstance(body.get("state"), dict):
            raise CorruptStore(f"{name}: does not hold the state through sequence {seq}")
        state = State.from_json(body["state"], where=name)
        if state.last_seq != seq:
            raise CorruptStore(f"{name}: state ends at {state.last_seq}, not {seq}")
        self.snapshot_seq = seq
        return state

    def recover(self) -> State:
        """Load CURRENT's snapshot, then replay the WAL's contiguous suffix exactly once."""
        state = self._load_snapshot()
        segments = self._segments()
        expected: int | None = None
        frames_end = 0
        # The torn tail is cut off only once everything was read and accepted: an open that
        # fails leaves every byte where it found it.
        torn: tuple[Path, int, int] | None = None
        data = b""
        for index, (first_seq, path) in enumerate(segments):
            newest = index == len(segments) - 1
            data = path.read_bytes()
            frames, covered = decode_frames(
                data, where=path.name, tail_may_tear=newest, zero_tail=self.preallocate
            )
            if covered < len(data) and not (self.preallocate and zero_from(data, covered)):
                torn = (path, covered, written_end(data))
            frames_end = covered
            if expected is not None and first_seq != expected:
                raise CorruptStore(f"{path.name}: starts at {first_seq}, expected {expected}")
            expected = first_seq
            for txn in frames:
                if txn.get("seq") != expected:
                    raise CorruptStore(
                        f"{path.name}: sequence {txn.get('seq')!r}, expected {expected}"
                    )
                expected += 1
                if txn["seq"] <= state.last_seq:
                    continue  # already in the snapshot (a segment left by a compaction)
                validate(state, txn, where=path.name)
                apply(state, txn)
        if expected is not None and expected <= state.last_seq:
            # Every segment ends before the snapshot: fine, but new writes start after it.
            expected = None
        if expected is not None and expected != state.last_seq + 1:
            raise CorruptStore(f"the WAL ends at {expected - 1}, the state at {state.last_seq}")
        if torn is not None:
            self._truncate(*torn)
        if segments and expected is not None:
            self._open_live(segments[-1][1], frames_end)
            self._resync(data[:frames_end])
            # The names recovery found may not be durable yet: a compaction that failed after
            # creating the next segment (its file synced, the directory's sync failed or never
            # came) leaves that segment newest, and the frames appended to it from now on
            # would vanish with its name at a power cut.
            fsync_directory(self.directory)
        else:
            self._start_segment(state.last_seq + 1)
        self.hook("recover:done")
        return state

    def _truncate(self, path: Path, length: int, end: int) -> None:
        """Cut a torn final frame off the newest segment, durably, before any append.

        With ``preallocate`` the torn bytes (up to ``end``, the last non-zero byte) are
        overwritten with zeros instead, so the segment keeps its space for the frames to come.
        """
        self.hook("truncate:before")
        fd = os.open(path, os.O_WRONLY)
        try:
            if self.preallocate:
                _write_all_at(fd, bytes(end - length), length)
            else:
                os.ftruncate(fd, length)
            self.hook("truncate:after_truncate")
            os.fsync(fd)
        finally:
            os.close(fd)
        self.hook("truncate:after_sync")

    def _resync(self, frames: bytes) -> None:
        """Write the live segment's frames again, as read, and sync them, before anything is
        appended after them.

        What was read may be only in the page cache: after a failed fsync Linux drops the
        dirty pages it covered from what it will write, yet keeps serving them to readers
        ("fsyncgate"), and a later fsync succeeds without writing them. A queue opened after
        such a failure would append after frames the disk never received, and a power cut
        would then leave a hole of zeros before acknowledged frames. Written again, the bytes
        are dirty again and this sync puts them on the disk (or fails, and the open with it).
        """
        if frames:
            fd = self._fd()
            _write_all_at(fd, frames, 0)
            sync_data(fd)

    # -- appending -----------------------------------------------------------------------

    def _open_live(self, path: Path, frames_end: int) -> None:
        """Append to ``path`` from ``frames_end``, where its frames end (the file's end, or
        where its zeros begin with ``preallocate``)."""
        self.close()
        self._live = path
        self._live_fd = os.open(path, os.O_WRONLY)
        self._live_size = frames_end

    def _start_segment(self, first_seq: int) -> None:
        """Create the segment that transaction ``first_seq`` onwards go to."""
        path = self.directory / segment_name(first_seq)
        self.hook("rotate:before_create")
        write_file(path, bytes(SEGMENT_BYTES) if self.preallocate else b"")
        self.hook("rotate:after_create")
        fsync_directory(self.directory)
        self.hook("rotate:after_dir_sync")
        self._open_live(path, 0)

    def append(self, txn: dict[str, Any], frame: bytes | None = None) -> None:
        """Write one transaction as one frame and sync it; rotate first if the segment is full.

        ``frame`` is ``txn`` already encoded, when the caller encoded it to check it.
        """
        if frame is None:
            frame = encode_frame(txn)
        if self._live_size and self._live_size + len(frame) > SEGMENT_BYTES:
            self._start_segment(txn["seq"])
        fd = self._fd()
        at = self._live_size
        half = len(frame) // 2 if self._split_writes else len(frame)
        self.hook("append:before_write")
        _write_all_at(fd, frame[:half], at)
        self.hook("append:mid_write")
        _write_all_at(fd, frame[half:], at + half)
        self._live_size += len(frame)
        self.hook("append:after_write")
        # fdatasync: it syncs the file's new size with the data an append added (the size is
        # needed to read it back), and nothing else (with ``preallocate``, the size was
        # synced when the segment was created, unless a frame larger than it grew it).
        sync_data(fd)
        self.hook("append:after_sync")

    def _fd(self) -> int:
        if self._live_fd is None:
            raise CorruptStore("the store is closed")
        return self._live_fd

    # -- compaction ----------------------------------------------------------------------

    def compact(self, state: State) -> int:
        """Rotate; write and sync the snapshot; publish CURRENT; delete what it covers."""
        seq = state.last_seq
        if self._live_size or self._live is None or self._live.name != segment_name(seq + 1):
            self._start_segment(seq + 1)
        name = snapshot_name(seq)
        temporary = self.directory / f"{name}.tmp"
        self.hook("snapshot:before_write")
        write_file(temporary, encode_frame({"seq": seq, "state": state.to_json()}))
        self.hook("snapshot:after_sync")
        temporary.replace(self.directory / name)
        self.hook("snapshot:after_rename")
        fsync_directory(self.directory)
        self.hook("snapshot:after_dir_sync")
        pointer = self.directory / f"{CURRENT}.tmp"
        self.hook("current:before_write")
        write_file(pointer, encode_frame({"snapshot": name, "seq": seq}))
        self.hook("current:after_sync")
        pointer.replace(self.directory / CURRENT)
        self.hook("current:after_rename")
        fsync_directory(self.directory)
        self.hook("current:after_dir_sync")
        self.snapshot_seq = seq
        for _, path in self._segments():
            if path != self._live:
                self.hook("delete:before_unlink")
                path.unlink()
                self.hook("delete:after_unlink")
        for path in self.directory.iterdir():
            stale_snapshot = _SNAPSHOT.match(path.name) and path.name != name
            if stale_snapshot or path.name.endswith(".tmp"):
                path.unlink()
        fsync_directory(self.directory)
        self.hook("delete:after_dir_sync")
        return seq

    def segment_count(self) -> int:
        return len(self._segments())

    def close(self) -> None:
        if self._live_fd is not None:
            os.close(self._live_fd)
            self._live_fd = None
