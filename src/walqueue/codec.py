"""Canonical JSON, payload checks, and the frame format of the WAL, snapshots and CURRENT.

A frame is a 4-byte big-endian payload length, the canonical JSON payload, and the 32-byte
SHA-256 of exactly that JSON.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from walqueue.errors import CorruptStore

LENGTH_BYTES = 4
DIGEST_BYTES = 32
#: The unit a disk persists whole, or not at all, when the power goes (the smallest there is).
SECTOR_BYTES = 512
#: A larger length field is corruption, rejected before anything is allocated.
MAX_FRAME_PAYLOAD = 64 * 1024 * 1024


def canonical(value: Any) -> bytes:
    """The canonical UTF-8 JSON bytes of ``value``."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


_SCALARS = (str, int, bool, type(None))


def _copy_checked(value: Any, depth: int) -> Any:
    """A deep copy of JSON-shaped ``value``; TypeError/ValueError for anything else.

    Hand-written because copy.deepcopy's generic machinery dominated the cost of a put.
    """
    kind = type(value)
    if kind in _SCALARS:
        return value
    if depth > 64:
        raise ValueError("payload nested too deeply")
    if kind is float:
        if not math.isfinite(value):
            raise ValueError("payload holds NaN or Infinity")
        return value
    if kind is list:
        return [_copy_checked(item, depth + 1) for item in value]
    if kind is dict:
        copied = {}
        for key, item in value.items():
            if type(key) is not str:
                raise TypeError("payload keys must be strings")
            copied[key] = _copy_checked(item, depth + 1)
        return copied
    raise TypeError(f"payload holds a {kind.__name__}, which JSON cannot")


def checked_payload(payload: Any) -> dict[str, Any]:
    """A deep copy of a valid JSON-object payload."""
    if type(payload) is not dict:
        raise TypeError(f"payload must be a JSON object, got {type(payload).__name__}")
    copied: dict[str, Any] = _copy_checked(payload, 0)
    return copied


def copy_payload(payload: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of a payload already known to be valid."""
    copied: dict[str, Any] = _copy_checked(payload, 0)
    return copied


def encode_frame(value: Any) -> bytes:
    body = canonical(value)
    if len(body) > MAX_FRAME_PAYLOAD:
        raise ValueError(f"transaction of {len(body)} bytes exceeds the frame bound")
    return len(body).to_bytes(LENGTH_BYTES, "big") + body + hashlib.sha256(body).digest()


def decode_frames(
    data: bytes, *, where: str, tail_may_tear: bool, zero_tail: bool = False
) -> tuple[list[Any], int]:
    """Every complete frame of ``data`` and the length they cover.

    In the seed's format (the default) a segment is nothing but frames, appended. Only the
    newest segment's last frame may be unfinished (``tail_may_tear``): its bytes are a torn
    tail, not counted, when the write that made them never finished: a prefix of the frame
    (its length field reaching past the end, no whole frame hidden behind a damaged length),
    zeros where it begins, or a frame whose digest does not match and that still has a
    sector of zeros or runs into the zeros at the end (``unfinished``; a power cut persists
    a frame's sectors in any order, and can keep a file's new size without its data). A
    complete final frame that is none of these was written whole and damaged since: like an
    incomplete frame, zeros, a bad digest, an oversized length or a frame that is not a JSON
    object anywhere else, it is CorruptStore.

    With ``zero_tail`` (segments preallocated with zeros, ``Queue(preallocate=True)``) a
    length field of zero followed by nothing but zeros ends the frames, in any segment.
    """
    bodies: list[tuple[int, bytes]] = []
    offset = 0
    view = memoryview(data)
    sha256 = hashlib.sha256
    while offset < len(data):
        if len(data) - offset < LENGTH_BYTES:
            if zero_tail and zero_from(data, offset):
                break
            return _parse(bodies, where), _torn_at(offset, where, tail_may_tear)
        size = int.from_bytes(view[offset : offset + LENGTH_BYTES], "big")
        if size == 0:
            if zero_tail and zero_from(data, offset):
                break
            # Zeros where a frame begins, but data after them: a frame whose first sectors
            # a power cut lost, torn like any other damaged tail. Unless a whole body and
            # its digest follow: a lost sector leaves those behind a zero length field only
            # when the body begins at the sector boundary.
            if (offset + LENGTH_BYTES) % SECTOR_BYTES and _hidden_frame(data, offset):
                raise CorruptStore(f"{where}: the length field at byte {offset} is damaged")
            if tail_may_tear and not _valid_frame_after(data, offset):
                return _parse(bodies, where), offset
            if zero_from(data, offset):
                raise CorruptStore(f"{where}: zeros from byte {offset} on, not a frame")
            raise CorruptStore(f"{where}: a zero length field at byte {offset} before data")
        end = offset + LENGTH_BYTES + size + DIGEST_BYTES
        if size > MAX_FRAME_PAYLOAD:
            if _hidden_frame(data, offset):
                raise CorruptStore(f"{where}: the length field at byte {offset} is damaged")
            if tail_may_tear and not _valid_frame_after(data, offset):
                return _parse(bodies, where), offset
            raise CorruptStore(f"{where}: frame at byte {offset} claims {size} bytes")
        if end > len(data):
            if _hidden_frame(data, offset):
                raise CorruptStore(f"{where}: the length field at byte {offset} is damaged")
            return _parse(bodies, where), _torn_at(offset, where, tail_may_tear)
        body = view[offset + LENGTH_BYTES : end - DIGEST_BYTES]
        if sha256(body).digest() != view[end - DIGEST_BYTES : end]:
            if _hidden_frame(data, offset):
                raise CorruptStore(f"{where}: the length field at byte {offset} is damaged")
            if (
                tail_may_tear
                and unfinished(data, offset, end, zero_tail=zero_tail)
                and not _valid_frame_after(data, offset)
            ):
                return _parse(bodies, where), offset
            raise CorruptStore(f"{where}: checksum mismatch in the frame at byte {offset}")
        bodies.append((offset, bytes(body)))
        offset = end
    return _parse(bodies, where), offset


def _parse(bodies: list[tuple[int, bytes]], where: str) -> list[Any]:
    """Parse every body; one JSON array is much faster than a call per frame."""
    try:
        values: list[Any] = json.loads(b"[" + b",".join(body for _, body in bodies) + b"]")
        if len(values) != len(bodies):
            raise ValueError("bodies merged")
    except (UnicodeDecodeError, ValueError):
        # Find the culprit frame by frame, to name it.
        values = []
        for offset, body in bodies:
            try:
                values.append(json.loads(body))
            except (UnicodeDecodeError, ValueError):
                raise CorruptStore(f"{where}: the frame at byte {offset} is not JSON") from None
    for (offset, _), value in zip(bodies, values, strict=True):
        if not isinstance(value, dict):
            raise CorruptStore(f"{where}: the frame at byte {offset} is not a JSON object")
    return values


def zero_from(data: bytes, offset: int) -> bool:
    """Whether every byte of ``data`` from ``offset`` on is zero."""
    return data.count(0, offset) == len(data) - offset


def written_end(data: bytes) -> int:
    """One past the last non-zero byte: no frame starts at or after it (a body is never zero)."""
    return len(data.rstrip(b"\0"))


def _hidden_frame(data: bytes, offset: int) -> bool:
    """Whether a complete frame starts at ``offset`` although its length field says otherwise.

    A torn tail is a prefix of one frame, so no digest inside it can match. A damaged
    length field, though, can make a complete frame (and those after it) look torn; finding
    a body that ends in ``}`` and is followed by its own digest exposes it. The hash is
    extended incrementally, so the scan is linear in the tail's length.
    """
    start = offset + LENGTH_BYTES
    running = hashlib.sha256()
    previous = start
    closing = ord("}")
    # A body ends in a non-zero "}", so a digest starts at most one byte past the written end.
    last = min(len(data) - DIGEST_BYTES, written_end(data)) + 1
    for position in range(start, last):
        if data[position - 1] != closing or position == start:
            continue
        running.update(data[previous:position])
        previous = position
        if running.copy().digest() == data[position : position + DIGEST_BYTES]:
            return True
    return False


def unfinished(data: bytes, offset: int, end: int, *, zero_tail: bool = False) -> bool:
    """Whether the complete-length frame from ``offset`` to ``end``, whose digest does not
    match, is a write that never finished rather than a synced frame damaged since.

    A power cut persists a frame's 512-byte sectors in any order, and an unwritten sector
    reads as zeros. So the frame is unfinished when a piece of it (its bytes after the length
    field, cut at the file's sector boundaries, as etcd's WAL decoder cuts a record) that
    holds some of its JSON is all zero, since canonical JSON holds no zero byte; or when it
    runs into the zeros at the end of the file and what was written of its digest is the
    start of its body's digest (the write stopped there). With ``zero_tail`` (a preallocated
    segment, zeros from its creation) the write may have stopped anywhere; without it the
    zeros at the end are a new size kept without its data, lost in whole sectors, so they
    count from a sector boundary. A synced frame damaged since has neither, unless the
    damage zeroed a whole piece, or (preallocated) the last written bytes of its digest.
    """
    body_end = end - DIGEST_BYTES
    piece = offset + LENGTH_BYTES
    while piece < body_end:
        boundary = min(end, (piece // SECTOR_BYTES + 1) * SECTOR_BYTES)
        if data.count(0, piece, boundary) == boundary - piece:
            return True
        piece = boundary
    written = max(written_end(data), body_end)
    if not zero_tail:
        written = -(-written // SECTOR_BYTES) * SECTOR_BYTES
    if written >= end:
        return False
    digest = hashlib.sha256(data[offset + LENGTH_BYTES : body_end]).digest()
    return digest[: written - body_end] == data[body_end:written]


def _valid_frame_after(data: bytes, offset: int) -> bool:
    """Whether a whole, digest-checked frame starts anywhere after ``offset``: then the bad
    bytes at ``offset`` were once synced (a later frame was), and are corruption."""
    view = memoryview(data)
    opening, closing = ord("{"), ord("}")
    last = min(len(data) - LENGTH_BYTES - DIGEST_BYTES, written_end(data))
    for start in range(offset + 1, last):
        size = int.from_bytes(view[start : start + LENGTH_BYTES], "big")
        end = start + LENGTH_BYTES + size + DIGEST_BYTES
        if size < 2 or end > len(data) or data[start + LENGTH_BYTES] != opening:
            continue
        if data[end - DIGEST_BYTES - 1] != closing:
            continue
        body = view[start + LENGTH_BYTES : end - DIGEST_BYTES]
        if hashlib.sha256(body).digest() == view[end - DIGEST_BYTES : end]:
            return True
    return False


def _torn_at(offset: int, where: str, tail_may_tear: bool) -> int:
    if not tail_may_tear:
        raise CorruptStore(f"{where}: incomplete frame at byte {offset}")
    return offset


def decode_single(data: bytes, *, where: str) -> dict[str, Any]:
    """A file holding exactly one complete frame (a snapshot, CURRENT)."""
    frames, covered = decode_frames(data, where=where, tail_may_tear=False)
    if len(frames) != 1 or covered != len(data):
        raise CorruptStore(f"{where}: expected exactly one frame")
    frame: dict[str, Any] = frames[0]
    return frame
