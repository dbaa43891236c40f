"""A case-insensitive, read-only view over any ``Mapping[str, str]`` of HTTP headers.

HTTP header names are case-insensitive (RFC 9110 §5.1) and HTTP/2 lowercases them, so
callers may pass a plain ``dict`` with any spelling. When two names differ only by case
the first one in iteration order wins.
"""

from __future__ import annotations

from collections.abc import Mapping


class HeaderView:
    """Looks headers up by name regardless of case."""

    __slots__ = ("_lowered",)

    def __init__(self, headers: Mapping[str, str]) -> None:
        lowered: dict[str, str] = {}
        for name, value in headers.items():
            lowered.setdefault(name.lower(), value)
        self._lowered = lowered

    def get(self, name: str) -> str | None:
        """The value of header ``name``, or None when absent."""
        return self._lowered.get(name.lower())

    def first(self, names: tuple[str, ...]) -> tuple[str, str] | None:
        """The first of ``names`` that is present, as ``(name, value)``."""
        for name in names:
            value = self._lowered.get(name.lower())
            if value is not None:
                return name, value
        return None

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._lowered
