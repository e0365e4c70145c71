"""Capped exponential retry: when a failed or expired attempt may run again."""

from __future__ import annotations

from dataclasses import dataclass

from crashqueuelab.core.errors import InvalidInput


@dataclass(frozen=True)
class RetryPolicy:
    """``delay = min(base_delay_us * 2 ** (attempt - 1), max_delay_us)``."""

    base_delay_us: int = 1_000_000
    max_delay_us: int = 60_000_000

    def __post_init__(self) -> None:
        for name in ("base_delay_us", "max_delay_us"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidInput(name, f"must be a non-negative integer, got {value!r}")
        if self.max_delay_us < self.base_delay_us:
            raise InvalidInput("max_delay_us", "must not be smaller than base_delay_us")

    def delay_us(self, attempt: int) -> int:
        """The wait after attempt number ``attempt`` (1-based) failed."""
        if attempt < 1:
            raise InvalidInput("attempt", f"must be at least 1, got {attempt}")
        # Bound the exponent first so a huge attempt number cannot build a huge integer.
        exponent = min(attempt - 1, 64)
        return min(self.base_delay_us * (1 << exponent), self.max_delay_us)
