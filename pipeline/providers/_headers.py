"""A case-insensitive, read-only view over any ``Mapping[str, str]`` of HTTP headers.

HTTP header names are case-insensitive (RFC 9110 §5.1) and HTTP/2 lowercases them, so
callers may pass a plain ``dict`` with any spelling. A header given twice (two lines, as
aiohttp's multidict keeps them, or two spellings) with the same value is read once; with
different values, reading it raises InvalidHeaderError: which copy a provider signed is
ambiguous, so neither is trusted.
"""

from __future__ import annotations

from collections.abc import Mapping

from pipeline.errors import InvalidHeaderError


class HeaderView:
    """Looks headers up by name regardless of case; lowers the names on the first lookup only."""

    __slots__ = ("_ambiguous", "_headers", "_lowered")

    def __init__(self, headers: Mapping[str, str]) -> None:
        self._headers = headers
        self._lowered: dict[str, str] | None = None
        self._ambiguous: set[str] = set()

    def _all(self) -> dict[str, str]:
        lowered = self._lowered
        if lowered is None:
            lowered = {}
            for name, value in self._headers.items():
                low = name.lower()
                if lowered.setdefault(low, value) != value:
                    self._ambiguous.add(low)
            self._lowered = lowered
        return lowered

    def _checked(self, name: str, value: str | None) -> str | None:
        if value is not None and self._ambiguous and name.lower() in self._ambiguous:
            raise InvalidHeaderError(f"header {name} is given more than once with different values")
        return value

    def get(self, name: str) -> str | None:
        """The value of header ``name``, or None when absent."""
        return self._checked(name, self._all().get(name.lower()))

    def first(self, names: tuple[str, ...]) -> tuple[str, str] | None:
        """The first of ``names`` that is present, as ``(name, value)``."""
        lowered = self._all()
        for name in names:
            value = self._checked(name, lowered.get(name.lower()))
            if value is not None:
                return name, value
        return None

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._all()
