"""Reading JSON webhook bodies: validate once, look fields up by dotted path.

Most bodies are only checked (a JSON object?) and read for one or two fields
(the event type, an event id). simdjson does that without building the whole
document as Python objects: it validates all of it in C and materialises only
the fields asked for, about a seventh of ``orjson.loads``'s cost on a 1-2 KB
event. Whatever simdjson refuses (integers beyond 64 bits, a byte-order mark,
anything malformed) is decided by orjson, so no body orjson takes is refused,
and every error message is orjson's. Where two members share a name, the first
is read (orjson's whole parse keeps the last); RFC 8259 leaves that undefined.
The whole document (:func:`parse_object`) is still built, with orjson, for
callers that need all of it.
"""

from __future__ import annotations

import functools
from typing import Any

import orjson
import simdjson

from pipeline.errors import BodyError, MissingKeyError

_MISSING = object()


class _LastParsed:
    """The most recent body parsed, so one record's body is parsed once (one instance: :data:`_LAST`).

    The worker asks for the same body's key, type and contents in turn; the
    parsed document is treated as read-only by every caller.
    """

    def __init__(self) -> None:
        self.body: bytes | None = None
        self.document: dict[str, Any] | None = None


class _Checked:
    """simdjson's view of the most recent body it took as a JSON object.

    A simdjson document lives in its parser's buffers, and the parser refuses a new
    body while any part of the old one is referenced: only this holder (one instance:
    :data:`_CHECKED`) keeps one,
    released before the next parse, and lookups hand out plain Python values.
    """

    def __init__(self) -> None:
        self.parser: simdjson.Parser | None = None  # created on first use, not at import
        self.body: bytes | None = None
        self.document: simdjson.Object | None = None


_LAST = _LastParsed()
_CHECKED = _Checked()


_REFUSED = object()  # simdjson did not take the body as a JSON object: orjson decides
# Larger bodies go to orjson: the parser keeps buffers sized to the largest body it took
# (about six times its size), for the life of the process.
SIMDJSON_MAX_BYTES = 256 * 1024
_BOM = b"\xef\xbb\xbf"  # simdjson skips one; orjson (and so this module) refuses it


def _checked(body: bytes) -> simdjson.Object | object:
    """simdjson's document of ``body`` when it is a JSON object, else ``_REFUSED``."""
    if body is _CHECKED.body and _CHECKED.document is not None:
        return _CHECKED.document
    _CHECKED.body = _CHECKED.document = None  # the parser takes a new body only once the old is let go
    if len(body) > SIMDJSON_MAX_BYTES or body.startswith(_BOM):
        return _REFUSED
    parser = _CHECKED.parser
    if parser is None:
        parser = _CHECKED.parser = simdjson.Parser()
    try:
        document = parser.parse(body)
    except RuntimeError:  # too deep, a big integer, or a parser still in use: start afresh
        _CHECKED.parser = None
        return _REFUSED
    except ValueError:  # malformed, or a number simdjson does not read
        return _REFUSED
    if not isinstance(document, simdjson.Object):
        return _REFUSED
    _CHECKED.body, _CHECKED.document = body, document
    return document


def check_object(body: bytes, provider: str) -> None:
    """Nothing when the body is a JSON object; BodyError otherwise (see :func:`parse_object`)."""
    if body is _LAST.body and _LAST.document is not None:
        return  # already parsed whole (a key hashed from body fields): not parsed again
    if _checked(body) is _REFUSED:
        parse_object(body, provider)


def value_at(body: bytes, path: str, provider: str) -> object:
    """The value at dotted ``path`` of the JSON object ``body`` (or ``_MISSING``); BodyError for a non-object."""
    if body is _LAST.body and _LAST.document is not None:
        return lookup(_LAST.document, path)
    node = _checked(body)
    if node is _REFUSED:
        return lookup(parse_object(body, provider), path)
    for part in _parts(path):
        if not isinstance(node, simdjson.Object) or part not in node:
            return _MISSING
        node = node[part]
    if isinstance(node, simdjson.Object):
        return node.as_dict()
    if isinstance(node, simdjson.Array):
        return node.as_list()
    return node


def parse_object(body: bytes, provider: str) -> dict[str, Any]:
    """The body as a JSON object; BodyError when it is not JSON or not an object."""
    if body is _LAST.body and _LAST.document is not None:
        return _LAST.document
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BodyError(f"{provider} body is not valid JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise BodyError(f"{provider} body is JSON but not an object (got {type(parsed).__name__})")
    _LAST.body, _LAST.document = body, parsed
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


def required_text(body: bytes, path: str, provider: str) -> str:
    """The string (or integer) at ``path`` of the body; MissingKeyError naming the field otherwise."""
    value = value_at(body, path, provider)
    if is_missing(value) or value is None:
        raise MissingKeyError(f"body field {path!r} missing")
    text = scalar_text(value)
    if text is None:
        raise MissingKeyError(f"body field {path!r} is not a non-empty string (got {type(value).__name__})")
    return text


def optional_text(body: bytes, path: str, provider: str) -> str | None:
    """The string at ``path`` of the body or None; BodyError only when the body is not a JSON object."""
    value = value_at(body, path, provider)
    return None if is_missing(value) else scalar_text(value)
