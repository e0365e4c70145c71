"""Argument checks shared by every public operation; each raises InvalidInput before any write."""

from __future__ import annotations

from crashqueuelab.core.errors import InvalidInput

#: Upper bound on ids, keys and job types, in characters.
MAX_NAME_LENGTH = 512
#: Upper bound on a failure's error text, in characters.
MAX_ERROR_LENGTH = 8192
#: Longest lease a caller may ask for (one year), so deadlines stay far inside 64 bits.
MAX_LEASE_US = 366 * 24 * 3600 * 1_000_000
#: Upper bound on max_attempts.
MAX_ATTEMPTS_LIMIT = 1000


def require_text(field: str, value: str) -> str:
    """Text that UTF-8 can carry: a lone surrogate (from an undecodable byte) cannot."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        raise InvalidInput(
            field, f"is not valid UTF-8 text (character {error.start} is a lone surrogate)"
        ) from None
    return value


def require_name(field: str, value: object) -> str:
    """A non-empty, bounded string without NUL characters."""
    # Ids and tokens are ASCII almost always, and an ASCII string cannot hold a lone
    # surrogate: answered without encoding it (a batched job checks three names).
    if (
        type(value) is str
        and value.isascii()
        and 0 < len(value) <= MAX_NAME_LENGTH
        and "\x00" not in value
        and not value.isspace()
    ):
        return value
    if not isinstance(value, str):
        raise InvalidInput(field, f"must be a string, got {type(value).__name__}")
    require_text(field, value)
    if not value.strip():
        raise InvalidInput(field, "must not be empty")
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidInput(field, f"longer than {MAX_NAME_LENGTH} characters")
    if "\x00" in value:
        raise InvalidInput(field, "must not contain NUL")
    return value


def require_int(field: str, value: object, *, minimum: int, maximum: int | None = None) -> int:
    """An integer (not a bool) within bounds."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(field, f"must be an integer, got {value!r}")
    if value < minimum:
        raise InvalidInput(field, f"must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise InvalidInput(field, f"must be at most {maximum}, got {value}")
    return value


def require_error_text(value: object) -> str:
    """The text recorded with a failure: a bounded string."""
    if not isinstance(value, str):
        raise InvalidInput("error", f"must be a string, got {type(value).__name__}")
    if len(value) > MAX_ERROR_LENGTH:
        raise InvalidInput("error", f"longer than {MAX_ERROR_LENGTH} characters")
    return require_text("error", value)
