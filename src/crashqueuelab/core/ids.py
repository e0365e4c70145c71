"""Injected identifiers: job ids and opaque lease tokens.

A seeded generator makes campaigns reproducible (same seed and stream, same ids); the
default draws from the operating system's randomness so concurrent producers never collide.
"""

from __future__ import annotations

import random
import secrets
from typing import Protocol


class IdGenerator(Protocol):
    """Makes job ids and lease tokens."""

    def job_id(self) -> str: ...

    def lease_token(self) -> str: ...


class RandomIds:
    """Unpredictable ids from ``secrets``: the default for real use."""

    def job_id(self) -> str:
        return f"job-{secrets.token_hex(8)}"

    def lease_token(self) -> str:
        return f"lease-{secrets.token_hex(8)}"


class SeededIds:
    """Reproducible ids: the same ``seed`` and ``stream`` always give the same sequence.

    ``stream`` separates generators that share a seed (a producer and each worker of a
    campaign case), so that they do not hand out the same ids.
    """

    def __init__(self, seed: int | str, stream: str = "") -> None:
        # random.Random hashes a str seed with SHA-512, so the sequence is stable
        # across processes and interpreter runs (unlike hash()).
        self._random = random.Random(f"{seed}/{stream}")

    def _hex(self) -> str:
        return f"{self._random.getrandbits(64):016x}"

    def job_id(self) -> str:
        return f"job-{self._hex()}"

    def lease_token(self) -> str:
        return f"lease-{self._hex()}"
