"""Network fault windows: what a fault does to one connection path, and for how long.

Each kind is a Toxiproxy-style "toxic" applied to the bytes of a real TCP connection, never
simulated inside a client library:

- ``latency``: every chunk of bytes, both ways, is delivered ``amount`` milliseconds late;
- ``bandwidth``: each direction carries at most ``amount`` bytes per second;
- ``stall``: bytes are held both ways and nothing is closed (a half-open connection); new
  connections get through, and held bytes flow again when the window ends;
- ``partition``: as a stall, and new connections are not put through to the server until
  the window ends (the client's connect hangs, as when its SYN is lost);
- ``lost-replies``: requests reach the server, its answers are dropped; when the window
  ends, every connection that lost an answer is reset, so its client learns nothing of
  what the server did (an unknown outcome, never a failure);
- ``reset``: every open connection of the path is reset at once (a window of no length).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


class WindowKind(enum.StrEnum):
    LATENCY = "latency"
    BANDWIDTH = "bandwidth"
    STALL = "stall"
    PARTITION = "partition"
    LOST_REPLIES = "lost-replies"
    RESET = "reset"


#: Kinds whose ``amount`` means something (milliseconds, bytes per second).
AMOUNT_UNITS = {WindowKind.LATENCY: "ms", WindowKind.BANDWIDTH: "bytes/s"}


@dataclass(frozen=True)
class FaultWindow:
    """One fault on some paths from ``start`` to ``end`` (seconds on the proxy's clock)."""

    kind: WindowKind
    paths: tuple[str, ...]
    start: float
    end: float
    amount: float = 0.0

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise ValueError(f"a {self.kind} window cannot end before it starts")
        if self.kind in AMOUNT_UNITS and self.amount <= 0:
            unit = AMOUNT_UNITS[self.kind]
            raise ValueError(f"a {self.kind} window needs a positive amount ({unit})")

    def covers(self, path: str, now: float) -> bool:
        return path in self.paths and self.start <= now < self.end

    def to_json(self, origin: float = 0.0) -> dict[str, Any]:
        """The window with times in seconds after ``origin`` (a run's start)."""
        answer: dict[str, Any] = {
            "kind": self.kind.value,
            "paths": list(self.paths),
            "start_s": round(self.start - origin, 6),
            "end_s": round(self.end - origin, 6),
        }
        if self.kind in AMOUNT_UNITS:
            answer["amount"] = self.amount
            answer["unit"] = AMOUNT_UNITS[self.kind]
        return answer


@dataclass(frozen=True)
class Condition:
    """What the windows in force do to one path at one moment."""

    latency_s: float = 0.0
    bytes_per_s: float | None = None
    held: bool = False
    refuses_new: bool = False
    drops_replies: bool = False

    @classmethod
    def of(cls, windows: list[FaultWindow], path: str, now: float) -> Condition:
        latency = 0.0
        rate: float | None = None
        held = refuses = drops = False
        for window in windows:
            if not window.covers(path, now):
                continue
            if window.kind is WindowKind.LATENCY:
                latency = max(latency, window.amount / 1000.0)
            elif window.kind is WindowKind.BANDWIDTH:
                rate = window.amount if rate is None else min(rate, window.amount)
            elif window.kind is WindowKind.STALL:
                held = True
            elif window.kind is WindowKind.PARTITION:
                held = refuses = True
            elif window.kind is WindowKind.LOST_REPLIES:
                drops = True
        return cls(latency, rate, held, refuses, drops)
