"""Reading JSON webhook bodies: parse once, look fields up by dotted path."""

from __future__ import annotations

import functools
from typing import Any

import orjson

from pipeline.errors import BodyError, MissingKeyError

_MISSING = object()


class _LastParsed:
    """The most recent body parsed, so one record's body is parsed once.

    The worker asks for the same body's key, type and contents in turn; the
    parsed document is treated as read-only by every caller.
    """

    body: bytes | None = None
    document: dict[str, Any] | None = None


def parse_object(body: bytes, provider: str) -> dict[str, Any]:
    """The body as a JSON object; BodyError when it is not JSON or not an object."""
    if body is _LastParsed.body and _LastParsed.document is not None:
        return _LastParsed.document
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BodyError(f"{provider} body is not valid JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise BodyError(f"{provider} body is JSON but not an object (got {type(parsed).__name__})")
    _LastParsed.body, _LastParsed.document = body, parsed
    return parsed


@functools.lru_cache(maxsize=1024)
def _parts(path: str) -> tuple[str, ...]:
    return tuple(path.split("."))


def lookup(document: dict[str, Any], path: str) -> object:
    """The value at dotted ``path`` (``data.object.id``), or ``_MISSING``."""
    node: object = document
    for part in _parts(path):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def is_missing(value: object) -> bool:
    """Whether :func:`lookup` found nothing."""
    return value is _MISSING


def scalar_text(value: object) -> str | None:
    """A non-empty string or an integer as text; None for anything else (bool, float, dict…)."""
    if isinstance(value, str):
        return value or None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def required_text(document: dict[str, Any], path: str) -> str:
    """The string (or integer) at ``path``; MissingKeyError naming the field otherwise."""
    value = lookup(document, path)
    if is_missing(value) or value is None:
        raise MissingKeyError(f"body field {path!r} missing")
    text = scalar_text(value)
    if text is None:
        raise MissingKeyError(f"body field {path!r} is not a non-empty string (got {type(value).__name__})")
    return text


def optional_text(document: dict[str, Any], path: str) -> str | None:
    """The string at ``path`` or None; never raises."""
    value = lookup(document, path)
    return None if is_missing(value) else scalar_text(value)
