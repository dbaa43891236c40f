"""A case-insensitive, read-only view over any ``Mapping[str, str]`` of HTTP headers.

HTTP header names are case-insensitive (RFC 9110 §5.1) and HTTP/2 lowercases them, so
callers may pass a plain ``dict`` with any spelling. When two names differ only by case
the first one in iteration order wins.
"""

from __future__ import annotations

from collections.abc import Mapping


class HeaderView:
    """Looks headers up by name regardless of case; lowers the names on the first lookup only."""

    __slots__ = ("_headers", "_lowered")

    def __init__(self, headers: Mapping[str, str]) -> None:
        self._headers = headers
        self._lowered: dict[str, str] | None = None

    def _all(self) -> dict[str, str]:
        lowered = self._lowered
        if lowered is None:
            lowered = {}
            for name, value in self._headers.items():
                lowered.setdefault(name.lower(), value)
            self._lowered = lowered
        return lowered

    def get(self, name: str) -> str | None:
        """The value of header ``name``, or None when absent."""
        return self._all().get(name.lower())

    def first(self, names: tuple[str, ...]) -> tuple[str, str] | None:
        """The first of ``names`` that is present, as ``(name, value)``."""
        lowered = self._all()
        for name in names:
            value = lowered.get(name.lower())
            if value is not None:
                return name, value
        return None

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._all()
