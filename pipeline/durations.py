"""Parse and print human durations such as ``7d``, ``36h``, ``90m``, ``300s``, ``250ms``."""

from __future__ import annotations

import re
from datetime import timedelta

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")


def parse_duration(value: object) -> timedelta:
    """Return the duration ``value`` names; a bare number is seconds.

    Raises ``ValueError`` with the accepted forms when ``value`` is not a duration.
    """
    if isinstance(value, bool):
        # callers handle one error type for every bad value
        raise ValueError(f"expected a duration such as '7d' or '36h', got {value!r}")  # noqa: TRY004
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (match := _PATTERN.match(value)):
        seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    else:
        raise ValueError(f"expected a duration such as '7d' or '36h', got {value!r}")
    if seconds <= 0:
        raise ValueError(f"a duration must be positive, got {value!r}")
    return timedelta(seconds=seconds)


def format_duration(value: timedelta) -> str:
    """Print ``value`` in the largest unit that divides it (``7d``, ``90m``)."""
    seconds = value.total_seconds()
    for unit in ("w", "d", "h", "m", "s"):
        size = _UNITS[unit]
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds * 1000)}ms"
