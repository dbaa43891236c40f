"""The DLQ as the console shows it: counts per reason, per source and over time, records, one record's detail.

It reads the DLQ with the same scan as ``pipeline dlq list`` (``pipeline/ops/dlq.py``).
Bodies and headers are shown as they were received, minus secrets
(:class:`pipeline.console.views.Redactor`); the templates escape them.
"""

from __future__ import annotations

import base64
import binascii
from collections import Counter
from dataclasses import dataclass, field

from aiokafka import TopicPartition

from pipeline.console.redaction import Redactor
from pipeline.console.views import hexdump
from pipeline.kafka.clients import started_reader
from pipeline.ops.dlq import Scan, scan
from pipeline.records.dlq import DlqEntry, DlqFilter, parse_entry

BUCKETS = 24  # bars in the "over time" chart
MIN_BUCKET_MS = 60_000  # a bar covers at least a minute


def source_of(entry: DlqEntry) -> str:
    """The record's ``source`` header, or ``-``."""
    headers = entry.value.get("headers")
    source = headers.get("source") if isinstance(headers, dict) else None
    return source if isinstance(source, str) and source else "-"


@dataclass
class DlqSummary:
    """What the DLQ holds among the records a filter takes."""

    total: int = 0
    by_reason: Counter[str] = field(default_factory=Counter)
    by_source: Counter[str] = field(default_factory=Counter)
    over_time: list[tuple[str, int]] = field(default_factory=list)  # (bucket start, count)
    bucket_label: str = ""
    records: list[DlqEntry] = field(default_factory=list)  # the newest ``shown`` of them
    shown: int = 0


async def summarise(
    bootstrap: str, topic: str, flt: DlqFilter, *, source: str | None, shown: int
) -> DlqSummary:
    """Scan the DLQ once: counts over every record ``flt`` (and ``source``) takes, the newest ``shown`` listed."""
    out = DlqSummary(shown=shown)
    times: list[int] = []
    kept: list[DlqEntry] = []
    async for entry in scan(bootstrap, topic, flt, Scan()):
        src = source_of(entry)
        if source and src != source:
            continue
        out.total += 1
        out.by_reason[entry.reason] += 1
        out.by_source[src] += 1
        times.append(entry.timestamp)
        kept.append(entry)
        if len(kept) > shown * 2:  # keep memory bounded: the newest are kept below
            kept = sorted(kept, key=lambda e: e.timestamp, reverse=True)[:shown]
    out.records = sorted(kept, key=lambda e: e.timestamp, reverse=True)[:shown]
    out.over_time, out.bucket_label = _buckets(times)
    return out


def _buckets(times: list[int]) -> tuple[list[tuple[str, int]], str]:
    """Counts in :data:`BUCKETS` equal spans from the first record's time to the last's."""
    from pipeline.console.views import iso_time  # noqa: PLC0415  (one helper; no cycle at import time)

    if not times:
        return [], ""
    low, high = min(times), max(times)
    span = max((high - low) // BUCKETS + 1, MIN_BUCKET_MS)
    counts = [0] * BUCKETS
    for at in times:
        counts[min((at - low) // span, BUCKETS - 1)] += 1
    labels = [iso_time(low + i * span) for i in range(BUCKETS)]
    return list(zip(labels, counts, strict=True)), _span_text(span)


def _span_text(ms: int) -> str:
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000)):
        if ms >= size:
            return f"{ms / size:.3g} {unit}"
    return f"{ms} ms"


async def read_record(bootstrap: str, topic: str, partition: int, offset: int) -> DlqEntry | None:
    """The DLQ record at ``partition``/``offset`` (None when there is none)."""
    tp = TopicPartition(topic, partition)
    consumer = await started_reader(bootstrap)
    try:
        consumer.assign([tp])
        end = (await consumer.end_offsets([tp]))[tp]
        if offset >= end:
            return None
        consumer.seek(tp, offset)
        for _ in range(20):
            batch = await consumer.getmany(tp, timeout_ms=250, max_records=1)
            for record in batch.get(tp, []):
                if record.offset != offset:
                    return None  # gone (deleted by retention) or not a data record
                return parse_entry(partition, offset, record.timestamp, record.key, record.value)
    finally:
        await consumer.stop()
    return None


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
    body, note = _body(value)
    body = redactor.data(body)
    try:
        text: str | None = body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return RecordDetail(entry, fields, _headers(value, redactor), text, hexdump(body), len(body), note)


def _body(value: dict[str, object]) -> tuple[bytes, str]:
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
