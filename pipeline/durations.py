"""Parse and print human durations such as ``7d``, ``36h``, ``90m``, ``300s``, ``250ms``."""

from __future__ import annotations

import math
import re
from datetime import timedelta

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_FORMS = "expected a duration such as '7d', '36h', '90m' or '300s'"
# Far beyond any bound a caller sets, and far inside what timedelta and a Kafka long hold.
_LARGEST = timedelta(days=100 * 365)


def parse_duration(
    value: object, *, at_least: timedelta | None = None, at_most: timedelta | None = None
) -> timedelta:
    """Return the duration ``value`` names; a bare number is seconds.

    Raises ``ValueError`` (one line, naming the accepted forms or the bound) when
    ``value`` is not a positive, finite duration within ``[at_least, at_most]``.
    """
    if isinstance(value, bool):
        # callers handle one error type for every bad value
        raise ValueError(f"{_FORMS}, got {value!r}")  # noqa: TRY004
    if isinstance(value, int | float):
        seconds = float(value) if not abs(value) > 1e300 else math.inf * (1 if value > 0 else -1)
    elif isinstance(value, str) and (match := _PATTERN.match(value)):
        seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    elif isinstance(value, str) and value.strip().startswith("-"):
        raise ValueError(f"a duration must be positive, got {_shown(value)}")
    else:
        raise ValueError(f"{_FORMS}, got {_shown(value)}")
    if math.isnan(seconds):
        raise ValueError(f"{_FORMS}, got {_shown(value)}")
    if seconds <= 0:
        raise ValueError(f"a duration must be positive, got {_shown(value)}")
    ceiling = at_most if at_most is not None else _LARGEST
    if seconds > ceiling.total_seconds():
        raise ValueError(f"must be at most {format_duration(ceiling)}, got {_shown(value)}")
    duration = timedelta(seconds=seconds)
    if at_least is not None and duration < at_least:
        raise ValueError(f"must be at least {format_duration(at_least)}, got {_shown(value)}")
    return duration


def _shown(value: object) -> str:
    """``value`` for an error message: its repr, cut to a readable length."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def format_duration(value: timedelta) -> str:
    """Print ``value`` in the largest unit that divides it (``7d``, ``90m``)."""
    seconds = value.total_seconds()
    for unit in ("w", "d", "h", "m", "s"):
        size = _UNITS[unit]
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds * 1000)}ms"
