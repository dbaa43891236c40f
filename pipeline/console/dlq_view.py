"""The DLQ as the console shows it: a query's records marked with what became of them, counted and paged.

One scan (:func:`pipeline.console.dlq_read.scan`) reads every record up to the
page's snapshot and keeps a small row per record the query takes (never its
body), so counts cover every record, paging reaches the oldest, and "redrive
all" can name exactly the records the page counted. Each row is marked from
the redrive history and from the DLQ itself (a record whose copy came back to
the DLQ, ``replayed-from`` naming it, has failed again): ``open``,
``redriven`` (no outcome yet), ``resolved`` or ``failed again``; handled ones
(resolved, failed again) can be hidden, and are then not counted.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from pipeline import providers
from pipeline.console.dlq_query import DlqQuery
from pipeline.console.dlq_read import Snapshot, scan
from pipeline.console.history import RunRecord
from pipeline.console.record_view import body_of
from pipeline.console.redaction import Redactor
from pipeline.console.views import iso_time
from pipeline.errors import ConfigError, PipelineError
from pipeline.headers import REPLAYED_FROM_HEADER
from pipeline.providers.base import Preset
from pipeline.records.dlq import DlqEntry
from pipeline.topology import Topology

BUCKETS = 24  # bars in the "over time" chart
MIN_BUCKET_MS = 60_000  # a bar covers at least a minute
HANDLED = frozenset({"resolved", "failed again"})
Marks = Callable[[tuple[int, int]], RunRecord | None]


def source_of(entry: DlqEntry) -> str:
    """The record's ``source`` header, or ``-``."""
    headers = entry.value.get("headers")
    source = headers.get("source") if isinstance(headers, dict) else None
    return source if isinstance(source, str) and source else "-"


class EventTypes:
    """The event type of a DLQ record, read from its body and headers by its source's preset."""

    def __init__(self, topology: Topology) -> None:
        self.presets: dict[str, Preset] = {}
        for name, source in topology.sources.items():
            try:
                self.presets[name] = providers.build(source.provider, **source.options)
            except ConfigError:  # the topology check already refuses these; no type then
                continue

    def of(self, entry: DlqEntry, source: str, body: bytes) -> str | None:
        """The event type, or None (an unknown source, a body the preset cannot read)."""
        preset = self.presets.get(source)
        headers = entry.value.get("headers")
        if preset is None or not isinstance(headers, dict):
            return None
        http = {k[5:]: str(v) for k, v in headers.items() if isinstance(k, str) and k.startswith("http-")}
        try:
            return preset.event_type(http, body)
        except (PipelineError, ValueError):
            return None


@dataclass(frozen=True, slots=True)
class Row:
    """One DLQ record as the list shows it (no body)."""

    partition: int
    offset: int
    timestamp: int
    reason: str
    source: str
    key: str | None
    error: str
    truncated: bool
    event_type: str | None
    copy_of: tuple[int, int] | None  # the DLQ record it was redriven from, when it came back

    @property
    def at(self) -> tuple[int, int]:
        """``(partition, offset)``."""
        return self.partition, self.offset


@dataclass(frozen=True, slots=True)
class Marked:
    """A row and what became of it: its mark, the run that redrove it, and the newer copy of it."""

    row: Row
    mark: str  # open, redriven, resolved, failed again, not replayable
    run: str | None = None
    newer: tuple[int, int] | None = None
    outcome: str = ""


@dataclass
class DlqPage:
    """What the DLQ page shows for a query."""

    query: DlqQuery  # with the snapshot it was drawn on, which its links and forms carry
    total: int = 0  # records the query takes, handled ones included
    counted: int = 0  # of those, the ones listed (all, or those not handled)
    by_reason: Counter[str] = field(default_factory=Counter)
    by_source: Counter[str] = field(default_factory=Counter)
    by_type: Counter[str] = field(default_factory=Counter)
    by_mark: Counter[str] = field(default_factory=Counter)
    rows: list[Marked] = field(default_factory=list)  # this page's
    pages: int = 1
    snapshot: dict[int, int] = field(default_factory=dict)  # each partition's end when first drawn
    selection: list[Row] = field(default_factory=list)  # every listed record, for "redrive all"
    over_time: list[tuple[str, int]] = field(default_factory=list)
    first_at: int | None = None
    last_at: int | None = None
    bucket_label: str = ""

    @property
    def digest(self) -> str:
        """A fingerprint of :attr:`selection`: a redrive of "all" runs only if it still matches."""
        return selection_digest(row.at for row in self.selection)


def selection_digest(records: Iterable[tuple[int, int]]) -> str:
    """sha256 of the sorted ``partition:offset`` list, cut to 32 hex digits."""
    text = "\n".join(f"{p}:{o}" for p, o in sorted(records))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def copy_of(entry: DlqEntry, dlq: str) -> tuple[int, int] | None:
    """The DLQ record ``entry`` was redriven from (its ``replayed-from`` header), when it names one of ``dlq``."""
    headers = entry.value.get("headers")
    where = headers.get(REPLAYED_FROM_HEADER) if isinstance(headers, dict) else None
    if not isinstance(where, str):
        return None
    topic, _, rest = where.rpartition(":")
    topic, _, partition = topic.rpartition(":")
    if topic != dlq or not partition.isdigit() or not rest.isdigit():
        return None
    return int(partition), int(rest)


def row_of(entry: DlqEntry, dlq: str, types: EventTypes, *, body: bytes | None = None) -> Row:
    """The list's row of a DLQ record (``body``: its body, when the caller has read it already)."""
    source = source_of(entry)
    data = body_of(entry.value)[0] if body is None else body
    return Row(
        entry.partition,
        entry.offset,
        entry.timestamp,
        entry.reason,
        source,
        entry.key,
        entry.error[:300],
        entry.truncated,
        types.of(entry, source, data),
        copy_of(entry, dlq),
    )


async def load(
    bootstrap: str,
    topology: Topology,
    query: DlqQuery,
    *,
    marks: Marks,
    redactor: Redactor,
    types: EventTypes,
    page_size: int,
) -> DlqPage:
    """Scan the DLQ once for ``query`` and build its page."""
    dlq = topology.topics.dlq
    snapshot = Snapshot()
    flt = query.record_filter
    rows: list[Row] = []
    copies: dict[tuple[int, int], tuple[int, int]] = {}  # a record -> its newer copy in the DLQ
    async for entry in scan(bootstrap, dlq, snapshot, since_ms=query.since_ms, upto=query.upto):
        older = copy_of(entry, dlq)
        if older is not None:
            copies[older] = (entry.partition, entry.offset)
        if not flt.matches(entry):
            continue
        body, _ = body_of(entry.value)
        row = row_of(entry, dlq, types, body=body)
        text = redactor.data(body).decode("utf-8", "replace") if query.needs_body else ""
        if query.takes(source=row.source, event_type=row.event_type, timestamp=row.timestamp, body=text):
            rows.append(row)
    pinned = query if query.upto is not None else replace(query, upto=dict(snapshot.ends))
    page = DlqPage(query=pinned, total=len(rows), snapshot=dict(snapshot.ends))
    marked = [_mark(row, marks(row.at), copies.get(row.at)) for row in rows]
    listed = [m for m in marked if not (query.hide_handled and m.mark in HANDLED)]
    listed.sort(key=lambda m: (m.row.timestamp, m.row.partition, m.row.offset), reverse=True)
    page.counted = len(listed)
    for m in marked:
        page.by_mark[m.mark] += 1
    for m in listed:
        page.by_reason[m.row.reason] += 1
        page.by_source[m.row.source] += 1
        page.by_type[m.row.event_type or "-"] += 1
    page.selection = [m.row for m in listed]
    page.pages = max((len(listed) + page_size - 1) // page_size, 1)
    page.query = replace(page.query, page=min(query.page, page.pages))  # past the last: the last
    start = (page.query.page - 1) * page_size
    page.rows = listed[start : start + page_size]
    times = [m.row.timestamp for m in listed]
    if times:
        page.first_at, page.last_at = min(times), max(times)
        page.over_time, page.bucket_label = buckets(times)
    return page


def _mark(row: Row, record: RunRecord | None, newer: tuple[int, int] | None) -> Marked:
    """What became of ``row``: its history record's mark, or failed again when a copy came back."""
    if newer is not None:
        return Marked(
            row, "failed again", record.run if record else None, newer, record.outcome_text if record else ""
        )
    if record is None:
        return Marked(row, "open")
    return Marked(row, record.mark, record.run, record.new_record, record.outcome_text)


def buckets(times: list[int]) -> tuple[list[tuple[str, int]], str]:
    """Counts in :data:`BUCKETS` equal spans from the first record's time to the last's (the last
    bar ends at the last record, not later)."""
    low, high = min(times), max(times)
    span = max((high - low) // BUCKETS + 1, MIN_BUCKET_MS)
    count = min(BUCKETS, (high - low) // span + 1)
    counts = [0] * count
    for at in times:
        counts[min((at - low) // span, count - 1)] += 1
    labels = [iso_time(low + i * span) for i in range(count)]
    return list(zip(labels, counts, strict=True)), _span_text(span)


def _span_text(ms: int) -> str:
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000)):
        if ms >= size:
            return f"{ms / size:.3g} {unit}"
    return f"{ms} ms"
