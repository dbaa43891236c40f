"""What the DLQ page is asked: its filters, its page, and the snapshot it stands on.

A query comes from the page's URL or from a redrive form, and the same
fields round-trip through both: reasons, source, key (exact or ``prefix*``),
event type (exact or a glob such as ``invoice.*``), text in the payload, a
time range (``since``, ``until``: a duration back from now or a time), whether
handled records are hidden, the page number, and ``upto``: the end of each
DLQ partition when the page was first drawn. Paging and redriving within one
``upto`` see exactly the records that page saw, however many arrive meanwhile.
Pure: a bad field is a :class:`BadQueryError` naming it.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from pipeline.errors import ConfigError, PipelineError
from pipeline.records.dlq import DlqFilter, parse_since, reasons_of

MAX_TEXT = 200  # characters of a filter field
MAX_PAGE = 1_000_000
#: The fields that make a query, in the order forms and links carry them.
FIELDS = ("reason", "source", "key", "type", "text", "since", "until", "open")


class BadQueryError(PipelineError):
    """A DLQ filter, page or snapshot that cannot be read; the message names the field."""

    reason = "bad-query"


@dataclass(frozen=True)
class DlqQuery:
    """One DLQ query: the raw fields (kept for the form) and what they mean."""

    fields: dict[str, str] = field(default_factory=dict)
    reasons: frozenset[str] = frozenset()
    source: str | None = None
    key: str | None = None
    event_type: str | None = None
    text: str | None = None
    since_ms: int | None = None
    until_ms: int | None = None
    hide_handled: bool = False
    page: int = 1
    upto: dict[int, int] | None = None  # partition -> end offset when the page was first drawn

    @property
    def record_filter(self) -> DlqFilter:
        """The part the read model's filter takes (reasons, key, since)."""
        return DlqFilter(reasons=self.reasons, key=self.key, since_ms=self.since_ms)

    def takes(self, *, source: str, event_type: str | None, timestamp: int, body: str) -> bool:
        """The rest: source, event type, the end of the time range and text in the (redacted) payload."""
        if self.source is not None and source != self.source:
            return False
        if self.until_ms is not None and timestamp > self.until_ms:
            return False
        if self.event_type is not None and not fnmatch.fnmatchcase(event_type or "", self.event_type):
            return False
        return self.text is None or self.text.casefold() in body.casefold()

    @property
    def needs_body(self) -> bool:
        """Whether the payload must be read for each record (a text filter)."""
        return self.text is not None

    def at_page(self, page: int) -> DlqQuery:
        """The same query on another page."""
        return replace(self, page=page)

    def params(self, *, page: int | None = None, with_upto: bool = True) -> dict[str, str]:
        """The query as URL or form fields: the filters given, the page, and the snapshot."""
        out = {name: value for name, value in self.fields.items() if value}
        shown = self.page if page is None else page
        if shown > 1:
            out["page"] = str(shown)
        if with_upto and self.upto is not None:
            out["upto"] = format_upto(self.upto)
        return out

    def link(self, **kwargs: Any) -> str:
        """``/dlq?...`` for this query (on ``page``, with or without the snapshot)."""
        params = self.params(**kwargs)
        return "/dlq" + ("?" + urlencode(params) if params else "")


def parse_query(values: Mapping[str, Any], *, now: datetime) -> DlqQuery:
    """The query of a page's URL or a form (``getall`` for ``reason`` when the mapping has it)."""
    getall = getattr(values, "getall", None)
    raw_reasons = [str(v) for v in getall("reason", [])] if getall else [str(values.get("reason", ""))]
    reason = ",".join(r.strip() for r in raw_reasons if r.strip())[:MAX_TEXT]
    fields = {name: reason if name == "reason" else _text(values, name) for name in FIELDS}
    try:
        reasons = reasons_of([fields["reason"]])
    except ConfigError as exc:
        raise BadQueryError(f"reason: {exc}") from None
    since = _time(fields["since"], "since", now)
    until = _time(fields["until"], "until", now)
    if since is not None and until is not None and since > until:
        raise BadQueryError("since: the range starts after it ends (since is later than until)")
    page_text = _text(values, "page") or "1"
    if not page_text.isdigit() or not 1 <= int(page_text) <= MAX_PAGE:
        raise BadQueryError(f"page: expected a number from 1 to {MAX_PAGE}, got {page_text[:20]!r}")
    upto_text = _text(values, "upto")
    return DlqQuery(
        fields={**fields, "open": "1" if fields["open"] else ""},
        reasons=reasons,
        source=fields["source"] or None,
        key=fields["key"] or None,
        event_type=fields["type"] or None,
        text=fields["text"] or None,
        since_ms=since,
        until_ms=until,
        hide_handled=bool(fields["open"]),
        page=int(page_text),
        upto=parse_upto(upto_text) if upto_text else None,
    )


def _text(values: Mapping[str, Any], name: str) -> str:
    value = str(values.get(name, "") or "").strip()
    if len(value) > MAX_TEXT or any(ord(c) < 32 for c in value):
        raise BadQueryError(f"{name}: at most {MAX_TEXT} characters, no control characters")
    return value


def _time(text: str, name: str, now: datetime) -> int | None:
    if not text:
        return None
    try:
        return parse_since(text, now=now)
    except (ValueError, OverflowError) as exc:
        raise BadQueryError(f"{name}: {exc}") from None


def parse_upto(text: str) -> dict[int, int]:
    """``0:120,1:98``: each DLQ partition's end offset in a snapshot."""
    out: dict[int, int] = {}
    for item in text.split(","):
        partition, sep, offset = item.strip().partition(":")
        if not (
            sep and partition.isdigit() and offset.isdigit() and len(offset) <= 19 and len(partition) <= 6
        ):
            raise BadQueryError(f"upto: expected PARTITION:OFFSET,... got {item[:40]!r}")
        out[int(partition)] = int(offset)
    return out


def format_upto(upto: Mapping[int, int]) -> str:
    """The inverse of :func:`parse_upto`."""
    return ",".join(f"{p}:{o}" for p, o in sorted(upto.items()))
