"""Canonical JSON payloads: one byte-exact form per payload, and its SHA-256 digest.

Idempotent submission compares digests, so two requests that mean the same object must
serialise identically (sorted keys, compact separators) and anything JSON cannot carry
faithfully (NaN, Infinity, non-string keys, tuples, duplicate keys) is rejected up front.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

from crashqueuelab.core.errors import InvalidInput
from crashqueuelab.core.validation import require_text

#: Upper bound on a canonical payload, in UTF-8 bytes.
MAX_PAYLOAD_BYTES = 64 * 1024
#: Nesting bound, so a hostile payload cannot exhaust the recursion limit.
MAX_PAYLOAD_DEPTH = 32
#: Integers must fit in 64 bits, as every JSON consumer of note can carry them exactly.
MAX_PAYLOAD_INT = 2**63 - 1


def _check_value(value: object, path: str, depth: int) -> None:
    if depth > MAX_PAYLOAD_DEPTH:
        raise InvalidInput("payload", f"nested deeper than {MAX_PAYLOAD_DEPTH} levels at {path}")
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        if not -MAX_PAYLOAD_INT - 1 <= value <= MAX_PAYLOAD_INT:
            raise InvalidInput("payload", f"{path} is an integer beyond 64 bits")
        return
    if isinstance(value, str):
        require_text("payload", value)
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidInput("payload", f"{path} is {value!r}; JSON has no NaN or Infinity")
        return
    if isinstance(value, list):
        for index, item in enumerate(value):
            _check_value(item, f"{path}[{index}]", depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidInput("payload", f"{path} has a non-string key {key!r}")
            require_text("payload", key)
            _check_value(item, f"{path}.{key}", depth + 1)
        return
    raise InvalidInput("payload", f"{path} is a {type(value).__name__}, which JSON cannot hold")


def canonical_json(payload: Mapping[str, Any]) -> str:
    """Validate ``payload`` and return its canonical JSON text."""
    if not isinstance(payload, dict):
        raise InvalidInput("payload", f"must be a JSON object, got {type(payload).__name__}")
    _check_value(payload, "$", 0)
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    size = len(text.encode("utf-8"))
    if size > MAX_PAYLOAD_BYTES:
        raise InvalidInput("payload", f"{size} bytes exceeds the {MAX_PAYLOAD_BYTES}-byte bound")
    return text


def payload_digest(canonical: str) -> str:
    """Hex SHA-256 of the canonical text's UTF-8 bytes."""
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _reject_constant(name: str) -> float:
    raise InvalidInput("payload", f"{name} is not valid JSON")


def _pairs_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise InvalidInput("payload", f"duplicate key {key!r}")
        result[key] = value
    return result


def parse_payload(text: str) -> dict[str, Any]:
    """Parse JSON text from outside (the CLI) into a payload, strictly."""
    require_text("payload", text)
    if len(text.encode("utf-8")) > MAX_PAYLOAD_BYTES * 4:
        raise InvalidInput("payload", "text is far beyond the payload bound")
    try:
        value = json.loads(
            text,
            object_pairs_hook=_pairs_without_duplicates,
            parse_constant=_reject_constant,
        )
    except json.JSONDecodeError as error:
        raise InvalidInput("payload", f"invalid JSON: {error}") from None
    except RecursionError:
        raise InvalidInput("payload", f"nested deeper than {MAX_PAYLOAD_DEPTH} levels") from None
    except ValueError as error:  # an integer literal with thousands of digits
        raise InvalidInput("payload", f"invalid JSON: {error}") from None
    if not isinstance(value, dict):
        raise InvalidInput("payload", f"must be a JSON object, got {type(value).__name__}")
    canonical_json(value)
    return value
