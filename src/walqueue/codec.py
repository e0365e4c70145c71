"""Canonical JSON, payload checks, and the frame format of the WAL, snapshots and CURRENT.

A frame is a 4-byte big-endian payload length, the canonical JSON payload, and the 32-byte
SHA-256 of exactly that JSON.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from typing import Any

from walqueue.errors import CorruptStore

LENGTH_BYTES = 4
DIGEST_BYTES = 32
#: A larger length field is corruption, rejected before anything is allocated.
MAX_FRAME_PAYLOAD = 64 * 1024 * 1024


def canonical(value: Any) -> bytes:
    """The canonical UTF-8 JSON bytes of ``value``."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def _check(value: Any, depth: int) -> None:
    if depth > 64:
        raise ValueError("payload nested too deeply")
    if value is None or isinstance(value, (bool, int, str)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("payload holds NaN or Infinity")
        return
    if isinstance(value, list):
        for item in value:
            _check(item, depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError("payload keys must be strings")
            _check(item, depth + 1)
        return
    raise TypeError(f"payload holds a {type(value).__name__}, which JSON cannot")


def checked_payload(payload: Any) -> dict[str, Any]:
    """A deep copy of a valid JSON-object payload."""
    if not isinstance(payload, dict):
        raise TypeError(f"payload must be a JSON object, got {type(payload).__name__}")
    _check(payload, 0)
    copied: dict[str, Any] = copy.deepcopy(payload)
    return copied


def encode_frame(value: Any) -> bytes:
    body = canonical(value)
    if len(body) > MAX_FRAME_PAYLOAD:
        raise ValueError(f"transaction of {len(body)} bytes exceeds the frame bound")
    return len(body).to_bytes(LENGTH_BYTES, "big") + body + hashlib.sha256(body).digest()


def decode_frames(data: bytes, *, where: str, tail_may_tear: bool) -> tuple[list[Any], int]:
    """Every complete frame of ``data`` and the length they cover.

    An incomplete last frame is a torn tail when ``tail_may_tear`` (its bytes are not
    counted); anywhere else it, a bad digest, an oversized length or a frame that is not a
    JSON object is CorruptStore.
    """
    frames: list[Any] = []
    offset = 0
    while offset < len(data):
        remaining = len(data) - offset
        if remaining < LENGTH_BYTES:
            return _torn(frames, offset, where, tail_may_tear)
        size = int.from_bytes(data[offset : offset + LENGTH_BYTES], "big")
        if size > MAX_FRAME_PAYLOAD:
            raise CorruptStore(f"{where}: frame at byte {offset} claims {size} bytes")
        end = offset + LENGTH_BYTES + size + DIGEST_BYTES
        if end > len(data):
            if _hidden_frame(data, offset):
                raise CorruptStore(f"{where}: the length field at byte {offset} is damaged")
            return _torn(frames, offset, where, tail_may_tear)
        body = data[offset + LENGTH_BYTES : offset + LENGTH_BYTES + size]
        if hashlib.sha256(body).digest() != data[end - DIGEST_BYTES : end]:
            raise CorruptStore(f"{where}: checksum mismatch in the frame at byte {offset}")
        try:
            value = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise CorruptStore(f"{where}: the frame at byte {offset} is not JSON") from None
        if not isinstance(value, dict):
            raise CorruptStore(f"{where}: the frame at byte {offset} is not a JSON object")
        frames.append(value)
        offset = end
    return frames, offset


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
    for position in range(start, len(data) - DIGEST_BYTES + 1):
        if data[position - 1] != closing or position == start:
            continue
        running.update(data[previous:position])
        previous = position
        if running.copy().digest() == data[position : position + DIGEST_BYTES]:
            return True
    return False


def _torn(frames: list[Any], offset: int, where: str, tail_may_tear: bool) -> tuple[list[Any], int]:
    if not tail_may_tear:
        raise CorruptStore(f"{where}: incomplete frame at byte {offset}")
    return frames, offset


def decode_single(data: bytes, *, where: str) -> dict[str, Any]:
    """A file holding exactly one complete frame (a snapshot, CURRENT)."""
    frames, covered = decode_frames(data, where=where, tail_may_tear=False)
    if len(frames) != 1 or covered != len(data):
        raise CorruptStore(f"{where}: expected exactly one frame")
    frame: dict[str, Any] = frames[0]
    return frame
