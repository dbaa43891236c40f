"""One DLQ record as its page shows it: its fields, every header in order, and the body as text and hex.

Bodies and headers are shown as they were received, minus secrets
(:mod:`pipeline.console.redaction`); the templates escape them and reveal
hidden characters.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from pipeline.console.redaction import Redactor
from pipeline.console.views import hexdump
from pipeline.records.dlq import DlqEntry


@dataclass(frozen=True)
class RecordDetail:
    """One DLQ record as shown: its fields, headers and body (text when UTF-8, and hex), secrets hidden."""

    entry: DlqEntry
    fields: list[tuple[str, str]]
    headers: list[tuple[str, str]]
    body_text: str | None
    body_hex: str
    body_bytes: int
    note: str  # why the body is partial or missing, or ""


def detail(entry: DlqEntry, redactor: Redactor) -> RecordDetail:
    """Everything about ``entry`` the record page shows."""
    value = entry.value
    fields: list[tuple[str, str]] = [
        (name, redactor.text(str(value.get(name))))
        for name in ("reason", "error", "key", "topic", "partition", "offset", "timestamp", "truncated")
        if name in value
    ]
    body, note = body_of(value)
    text, dump = body_view(body, redactor)
    return RecordDetail(entry, fields, _headers(value, redactor), text, dump, len(body), note)


def body_view(body: bytes, redactor: Redactor) -> tuple[str | None, str]:
    """A body as the pages show it, secrets hidden: its text (None when not UTF-8) and its hex dump."""
    body = redactor.data(body)
    try:
        return body.decode("utf-8"), hexdump(body)
    except UnicodeDecodeError:
        return None, hexdump(body)


def body_of(value: dict[str, object]) -> tuple[bytes, str]:
    """A DLQ record's body (from ``value_base64``, else ``value``) and why it is partial or missing."""
    encoded = value.get("value_base64")
    if isinstance(encoded, str):
        try:
            body = base64.b64decode(encoded, validate=True)
        except binascii.Error:
            return b"", "the record's value_base64 is not base64"
        if value.get("truncated") is True:
            return (
                body,
                f"truncated: only the first {len(body)} of {value.get('value_bytes')} bytes were kept",
            )
        return body, ""
    text = value.get("value")
    return (text.encode(), "") if isinstance(text, str) else (b"", "the record holds no body")


def _headers(value: dict[str, object], redactor: Redactor) -> list[tuple[str, str]]:
    """The original headers in order (from ``headers_base64``, else ``headers``), as text."""
    pairs = value.get("headers_base64")
    out: list[tuple[str, str]] = []
    if isinstance(pairs, list):
        for pair in pairs:
            if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)):
                continue
            name, raw = pair
            try:
                data = base64.b64decode(raw, validate=True) if isinstance(raw, str) else b""
            except binascii.Error:
                data = b"?"
            out.append((name, redactor.header(name, data.decode("utf-8", "replace"))))
        return out
    texts = value.get("headers")
    if isinstance(texts, dict):
        out = [(str(k), redactor.header(str(k), str(v))) for k, v in texts.items()]
    return out
