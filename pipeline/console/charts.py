"""Small SVG charts as plain numbers for the templates: a line of recent rates, bars over time.

Pure: the templates draw ``<polyline>`` and ``<rect>`` elements from these
shapes, so no chart library is shipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Line:
    """A sparkline: its ``points`` attribute, its size, and the values it shows."""

    points: str
    width: int
    height: int
    latest: float
    peak: float


def sparkline(values: Sequence[float], *, width: int = 240, height: int = 48) -> Line:
    """The points of ``values`` spread over ``width``, scaled so the highest touches the top."""
    peak = max(values, default=0.0)
    if len(values) < 2:
        flat = f"0,{height} {width},{height}"
        return Line(flat, width, height, values[-1] if values else 0.0, peak)
    scale = (height - 2) / peak if peak > 0 else 0.0
    step = width / (len(values) - 1)
    points = " ".join(f"{i * step:.1f},{height - 1 - v * scale:.1f}" for i, v in enumerate(values))
    return Line(points, width, height, values[-1], peak)


@dataclass(frozen=True, slots=True)
class Bar:
    """One bar: where it is drawn and what it counts (``label`` is its start, for the tooltip)."""

    x: float
    y: float
    width: float
    height: float
    count: int
    label: str


def bars(counts: Sequence[tuple[str, int]], *, width: int = 480, height: int = 80) -> list[Bar]:
    """One bar per ``(label, count)``, side by side, scaled so the largest fills ``height``."""
    if not counts:
        return []
    peak = max(count for _, count in counts) or 1
    slot = width / len(counts)
    out = []
    for i, (label, count) in enumerate(counts):
        tall = count / peak * (height - 1)
        out.append(Bar(i * slot + 1, height - tall, max(slot - 2, 1), tall, count, label))
    return out
