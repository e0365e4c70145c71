"""Charts as data for the SVG templates: scaled coordinates, axis ticks, marks.

No markup is built here; the templates turn these numbers into SVG (autoescaped like
everything else).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

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


#: The lane charts' geometry: as wide as the other charts, one lane every LANE_STEP px.
LANE_HEIGHT, LANE_STEP, LANE_TOP, LANE_RIGHT = 14, 18, 10, 10
#: The label column is at least this wide, and ends this far left of the lanes.
LABEL_ROOM, LABEL_GAP = 110, 10
#: A lane with more marks than this has them counted in slices of time, not drawn one by
#: one (500 kills in a lane are a smear of dots); likewise its bars with more than this.
DENSE_LANE = 40
#: The width of one slice of a dense lane, in px.
SLICE_PX = 6
#: A dense lane's bars, merged into one: pale, so the counted marks over it stand out.
DENSE_LANE_COLOR = "#d2e3fc"
#: An upper bound of each character's width in the charts' 11 px sans-serif, as a share of
#: the font size: labels are given the room they take, so none runs into its lane.
_WIDE, _NARROW, _FONT_PX = frozenset("mwMW@%"), frozenset(" .,:;'|!()[]iljtfI"), 11


def label_width(text: str) -> float:
    """How wide ``text`` can be drawn at the lanes' font size, in px (an upper bound)."""
    return _FONT_PX * sum(
        1.0 if char in _WIDE else 0.45 if char in _NARROW else 0.8 if char.isupper() else 0.66
        for char in text
    )


@dataclass(frozen=True)
class LaneChart:
    """Lanes over one time axis (a worker slot's processes, a job's executions): each row's
    ``label``, its ``spans`` (bars: ``start``, ``end``, ``color``, ``title``), ``windows``
    (bands drawn over them), ``dots`` (marks at an instant: ``at``, ``color``, ``title``,
    and optionally ``kind`` and ``r``) and optionally ``spans_are`` (what its bars are).
    The label column is as wide as the longest label; a dense lane's bars merge into one
    and its marks are counted per slice of time."""

    rows: Sequence[Mapping[str, Any]]
    end: float
    ticks: Sequence[tuple[float, str]] = ()

    @property
    def left(self) -> float:
        longest = max((label_width(str(row["label"])) for row in self.rows), default=0.0)
        return round(max(LABEL_ROOM, longest) + LABEL_GAP, 1)

    @property
    def height(self) -> int:
        return LANE_TOP + LANE_STEP * len(self.rows) + 30

    @property
    def axis_y(self) -> int:
        return LANE_TOP + LANE_STEP * len(self.rows) + 4

    def _x(self, at: float) -> float:
        plot = WIDTH - self.left - LANE_RIGHT
        return round(self.left + plot * min(max(at, 0.0), self.end) / self.end, 1)

    def axis(self) -> list[tuple[float, str]]:
        return [(self._x(at), label) for at, label in self.ticks]

    def lanes(self) -> list[dict[str, Any]]:
        counted = [
            self._counted(row["dots"]) if len(row.get("dots", ())) > DENSE_LANE else None
            for row in self.rows
        ]
        # One scale for every dense lane, so a taller bar is more marks in any lane.
        fullest = max((len(slice_) for c in counted if c for slice_ in c), default=1)
        return [
            self._lane(row, LANE_TOP + LANE_STEP * index, slices, fullest)
            for index, (row, slices) in enumerate(zip(self.rows, counted, strict=True))
        ]

    def _lane(
        self,
        row: Mapping[str, Any],
        y: int,
        counted: list[list[Mapping[str, Any]]] | None,
        fullest: int,
    ) -> dict[str, Any]:
        spans = list(row.get("spans", ()))
        if len(spans) > DENSE_LANE:
            first, last = min(s["start"] for s in spans), max(s["end"] for s in spans)
            what = row.get("spans_are", "bars")
            title = (
                f"{len(spans):,} {what} from {first:.2f} s to {last:.2f} s, too many to draw apart"
            )
            spans = [{"start": first, "end": last, "color": DENSE_LANE_COLOR, "title": title}]
        marks = [
            {"x": self._x(d["at"]), "y": y + LANE_HEIGHT / 2, "r": d.get("r", 4),
             "color": d["color"], "title": d["title"]}
            for d in (row.get("dots", ()) if counted is None else ())
        ]  # fmt: skip
        return {
            "y": y,
            "label": row["label"],
            "spans": [self._bar(s, y, LANE_HEIGHT) for s in spans],
            "windows": [self._bar(w, y - 2, LANE_HEIGHT + 4) for w in row.get("windows", ())],
            "dots": marks,
            "slices": [] if counted is None else self._slices(counted, y, fullest),
        }

    def _bar(self, span: Mapping[str, Any], y: float, height: float) -> dict[str, Any]:
        x = self._x(span["start"])
        return {"x": x, "y": y, "width": max(self._x(span["end"]) - x, 1.0), "height": height,
                "color": span["color"], "title": span["title"]}  # fmt: skip

    def _slice_count(self) -> int:
        return max(int((WIDTH - self.left - LANE_RIGHT) // SLICE_PX), 1)

    def _counted(self, dots: Sequence[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
        """The marks in each slice of time, the slices in order."""
        count = self._slice_count()
        slices: list[list[Mapping[str, Any]]] = [[] for _ in range(count)]
        for dot in dots:
            at = min(max(dot["at"], 0.0), self.end)
            slices[min(int(at / self.end * count), count - 1)].append(dot)
        return slices

    def _slices(
        self, counted: list[list[Mapping[str, Any]]], y: int, fullest: int
    ) -> list[dict[str, Any]]:
        """A bar per slice that holds marks, as tall as its count against the fullest slice,
        coloured as its commonest kind of mark, its counts by kind in its title."""
        width = self.end / len(counted)
        drawn = []
        for index, marks in enumerate(counted):
            if not marks:
                continue
            kinds: dict[str, list[Mapping[str, Any]]] = {}
            for mark in marks:
                kinds.setdefault(str(mark.get("kind", "marks")), []).append(mark)
            height = max(2.0, round(LANE_HEIGHT * len(marks) / fullest, 1))
            commonest = max(kinds.values(), key=len)
            counts = ", ".join(f"{len(same)} {kind}" for kind, same in sorted(kinds.items()))
            start, end = self._x(index * width), self._x((index + 1) * width)
            drawn.append({
                "x": start, "y": y + LANE_HEIGHT - height, "width": max(end - start - 1, 1.0),
                "height": height, "color": commonest[0]["color"],
                "title": f"{counts} from {index * width:.2f} s to {(index + 1) * width:.2f} s",
            })  # fmt: skip
        return drawn
