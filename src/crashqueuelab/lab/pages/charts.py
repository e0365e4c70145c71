"""Charts as data for the SVG templates: scaled coordinates, axis ticks, marks.

No markup is built here; the templates turn these numbers into SVG (autoescaped like
everything else).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

WIDTH, HEIGHT = 720, 260
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 16, 40


@dataclass(frozen=True)
class Series:
    name: str
    points: list[tuple[float, float]]
    color: str


@dataclass(frozen=True)
class Mark:
    """A vertical line at ``x`` (a kill, a pause), labelled."""

    x: float
    label: str
    color: str
    #: A rare fault among thousands of kills is drawn wide and opaque, so it stays visible.
    wide: bool = False


@dataclass(frozen=True)
class Window:
    """A span of ``x`` shaded for its duration (a pause from its stop to its continue)."""

    start: float
    end: float
    label: str
    color: str
    #: What a window of this colour is, in the chart's legend.
    legend: str = "a paused worker, from its SIGSTOP to its SIGCONT"


@dataclass(frozen=True)
class Rule:
    """A horizontal line at ``y`` (a physical limit), labelled."""

    y: float
    label: str


@dataclass
class Chart:
    title: str
    x_label: str
    y_label: str
    series: list[Series]
    marks: list[Mark] = field(default_factory=list)
    rules: list[Rule] = field(default_factory=list)
    log_x: bool = False
    windows: list[Window] = field(default_factory=list)
    #: The x axis runs from 0 to this (several charts of one run share their axis).
    x_end: float | None = None

    def _bounds(self) -> tuple[float, float, float, float]:
        if self.x_end is not None:
            ys = [y for s in self.series for _, y in s.points] + [r.y for r in self.rules]
            y1 = max(ys) if ys else 1.0
            return 0.0, max(self.x_end, 1e-9), 0.0, (y1 * 1.08 if y1 > 0 else 1.0)
        xs = [x for s in self.series for x, _ in s.points] + [m.x for m in self.marks]
        ys = [y for s in self.series for _, y in s.points] + [r.y for r in self.rules]
        x0, x1 = (min(xs), max(xs)) if xs else (0.0, 1.0)
        y1 = max(ys) if ys else 1.0
        return x0, (x1 if x1 > x0 else x0 + 1.0), 0.0, (y1 * 1.08 if y1 > 0 else 1.0)

    def _sx(self, x: float) -> float:
        x0, x1, _, _ = self._bounds()
        if self.log_x:
            x, x0, x1 = math.log2(x), math.log2(x0), math.log2(x1) if x1 > x0 else x0 + 1
        return LEFT + (x - x0) / ((x1 - x0) or 1.0) * (WIDTH - LEFT - RIGHT)

    def _sy(self, y: float) -> float:
        _, _, y0, y1 = self._bounds()
        return HEIGHT - BOTTOM - (y - y0) / ((y1 - y0) or 1.0) * (HEIGHT - TOP - BOTTOM)

    def polylines(self) -> list[dict[str, object]]:
        return [
            {
                "name": s.name,
                "color": s.color,
                "points": " ".join(f"{self._sx(x):.1f},{self._sy(y):.1f}" for x, y in s.points),
                "dots": [(round(self._sx(x), 1), round(self._sy(y), 1)) for x, y in s.points],
            }
            for s in self.series
        ]

    def vertical_marks(self) -> list[dict[str, object]]:
        return [
            {"x": round(self._sx(m.x), 1), "label": m.label, "color": m.color, "wide": m.wide}
            for m in self.marks
        ]

    def shaded_windows(self) -> list[dict[str, object]]:
        shaded = []
        for window in self.windows:
            x = self._sx(window.start)
            width = max(self._sx(window.end) - x, 2.0)
            shaded.append({"x": round(x, 1), "width": round(width, 1), "label": window.label,
                           "color": window.color})  # fmt: skip
        return shaded

    def horizontal_rules(self) -> list[dict[str, object]]:
        return [{"y": round(self._sy(r.y), 1), "label": r.label} for r in self.rules]

    def ticks(self) -> dict[str, list[tuple[float, str]]]:
        x0, x1, y0, y1 = self._bounds()
        if self.log_x:
            xs = sorted({x for s in self.series for x, _ in s.points})
        else:
            xs = nice_ticks(x0, x1)
        ys = nice_ticks(y0, y1)
        return {
            "x": [(round(self._sx(x), 1), number_text(x)) for x in xs],
            "y": [(round(self._sy(y), 1), number_text(y)) for y in ys],
        }


def nice_ticks(low: float, high: float, most: int = 6) -> list[float]:
    """Round values from ``low`` to ``high``: steps of 1, 2 or 5 times a power of ten, at
    most ``most`` of them (0, 5, 10, 15 s; never 0, 7.3, 14.6)."""
    span = high - low
    if span <= 0:
        return [low]
    step = 10 ** math.floor(math.log10(span / most))
    for factor in (1, 2, 5, 10):
        if span / (step * factor) <= most:
            step *= factor
            break
    first = math.ceil(low / step) * step
    count = math.floor((high - first) / step + 1e-9) + 1
    return [round(first + index * step, 10) for index in range(count)]


def number_text(value: float) -> str:
    """A tick label: thousands separated, two decimals only where they say something."""
    if value >= 100 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:.2f}"


def rate_over_time(
    times: Sequence[float], *, end: float, buckets: int = 40
) -> list[tuple[float, float]]:
    """Events per second in equal time buckets from 0 to ``end``, at each bucket's middle."""
    if end <= 0:
        return []
    width = end / buckets
    counts = [0] * buckets
    for at in times:
        if 0 <= at <= end:
            counts[min(buckets - 1, int(at / width))] += 1
    return [((index + 0.5) * width, count / width) for index, count in enumerate(counts)]
