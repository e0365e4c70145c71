"""Lease tokens and job ids as a person reads them: the shortest prefix that still tells
each apart from every other one on the same page, never fewer than four characters."""

from __future__ import annotations

from collections.abc import Iterable

#: A shortened name keeps at least this many characters of what tells it apart.
SHORTEST = 4
#: What a shortened name ends with, so nobody takes it for the whole.
ELLIPSIS = "…"
#: A name is shortened only when that leaves out at least this many characters.
WORTH_LEAVING_OUT = 3
#: The prefixes the lab's stores give their tokens and ids: said once, not repeated.
KINDS = {"lease-": "", "job-": "job "}


def _split(token: str) -> tuple[str, str]:
    """(how the token's kind is said, the part that tells it apart)."""
    for prefix, said in KINDS.items():
        if token.startswith(prefix) and len(token) > len(prefix):
            return said, token.removeprefix(prefix)
    return "", token


def _shared(one: str, other: str) -> int:
    """How many leading characters ``one`` and ``other`` share."""
    count = 0
    for mine, theirs in zip(one, other, strict=False):
        if mine != theirs:
            break
        count += 1
    return count


def short_names(tokens: Iterable[str]) -> dict[str, str]:
    """Each token's shortest distinct prefix among ``tokens``: ``lease-d4587328cb5c41f8``
    becomes ``d458…`` unless another token starts with ``d458`` too, ``job-9e53871b07f3a384``
    becomes ``job 9e53…``; a token barely longer than its prefix stays whole."""
    split = {token: _split(token) for token in set(tokens)}
    bodies = sorted({body for _, body in split.values()})
    # In sorted order a body shares its longest prefix with a neighbour: one character
    # past that prefix tells it from every other body.
    needed = {}
    for index, body in enumerate(bodies):
        neighbours = bodies[max(index - 1, 0) : index] + bodies[index + 1 : index + 2]
        shared = max((_shared(body, other) for other in neighbours), default=0)
        needed[body] = max(SHORTEST, shared + 1)
    shortened = {}
    for token, (said, body) in split.items():
        length = needed[body]
        shown = body if len(body) - length < WORTH_LEAVING_OUT else body[:length] + ELLIPSIS
        shortened[token] = said + shown
    return shortened
