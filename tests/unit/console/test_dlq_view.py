"""The DLQ page built from one scan: marks, hide-resolved counts, paging to the oldest, event types, payload text."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from pipeline import topology
from pipeline.console import dlq_view
from pipeline.console.dlq_query import parse_query
from pipeline.console.dlq_read import Snapshot
from pipeline.console.dlq_view import EventTypes, buckets, selection_digest
from pipeline.console.history import RunRecord
from pipeline.console.redaction import Redactor
from pipeline.contract import Delivery
from pipeline.dead_letter import dlq_value
from pipeline.records.dlq import DlqEntry, parse_entry

TOPO = topology.parse(
    {"app": {"name": "shop"}, "sources": {"github": {"verify": "none"}, "stripe": {"verify": "none"}}}
)
DLQ = TOPO.topics.dlq
T0 = 1_790_000_000_000
NOW = datetime.fromtimestamp(T0 / 1000 + 3600, UTC)


def _entry(
    offset: int,
    *,
    partition: int = 0,
    reason: str = "bad-signature",
    event: str = "push",
    body: dict[str, Any] | None = None,
    replayed_from: str | None = None,
) -> DlqEntry:
    """A GitHub delivery's DLQ record at ``partition``/``offset``, its record time ``T0 + offset`` s."""
    data = orjson.dumps(body if body is not None else {"after": f"c{offset}"})
    headers = [("source", b"github"), ("http-x-github-event", event.encode())]
    if replayed_from is not None:
        headers.append(("replayed-from", replayed_from.encode()))
    delivery = Delivery(
        TOPO.topics.input,
        partition,
        offset,
        T0 + offset * 1000,
        f"github:d-{offset}".encode(),
        data,
        tuple(headers),
    )
    value = dlq_value(delivery, error="no signature matched", reason=reason)
    return parse_entry(partition, offset, delivery.timestamp, delivery.key, value)


def _scanning(monkeypatch: pytest.MonkeyPatch, entries: list[DlqEntry]) -> None:
    """The DLQ read replaced by ``entries`` (the unit under test is what is built from them)."""

    async def scan(
        _bootstrap: str,
        _topic: str,
        snapshot: Snapshot,
        *,
        since_ms: int | None = None,
        upto: Mapping[int, int] | None = None,
    ) -> AsyncIterator[DlqEntry]:
        snapshot.ends = {0: max(e.offset for e in entries) + 1}
        for entry in entries:
            if upto is None or entry.offset < upto.get(entry.partition, 0):
                yield entry

    monkeypatch.setattr(dlq_view, "scan", scan)


async def _load(
    query: dict[str, str], marks: dict[tuple[int, int], RunRecord] | None = None, page_size: int = 100
) -> dlq_view.DlqPage:
    return await dlq_view.load(
        "b:1",
        TOPO,
        parse_query(query, now=NOW),
        marks=(marks or {}).get,
        redactor=Redactor(),
        types=EventTypes(TOPO),
        page_size=page_size,
    )


async def test_paging_reaches_the_oldest_record_newest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """250 records in pages of 100: three pages, the last holding the 50 oldest, and the snapshot pinned."""
    _scanning(monkeypatch, [_entry(i) for i in range(250)])
    first = await _load({})
    assert (first.counted, first.pages, first.query.upto) == (250, 3, {0: 250})
    assert [m.row.offset for m in first.rows[:2]] == [249, 248]
    last = await _load({"page": "3", "upto": "0:250"})
    assert [m.row.offset for m in last.rows] == list(range(49, -1, -1))
    assert len(last.selection) == 250
    assert last.digest == selection_digest((0, i) for i in range(250))


async def test_records_past_the_snapshot_are_neither_counted_nor_chosen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Records that arrived after the page was drawn stay out of its counts and its "redrive all"."""
    _scanning(monkeypatch, [_entry(i) for i in range(14)])
    page = await _load({"upto": "0:10"})
    assert (page.total, len(page.selection)) == (10, 10)


async def test_marks_come_from_the_history_and_from_copies_back_in_the_dlq(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Resolved from the history; failed again when its redriven copy came back (linked both ways);
    hiding resolved leaves the open ones and the copies, and counts only those."""
    entries = [_entry(0), _entry(1), _entry(2), _entry(3, replayed_from=f"{DLQ}:0:1")]
    _scanning(monkeypatch, entries)
    marks = {
        (0, 0): RunRecord("20261130-100000-aaaa", 0, 0, "bad-signature", None, "sent", outcome="first"),
        (0, 2): RunRecord("20261130-100000-aaaa", 0, 2, "bad-signature", None, "sent"),
    }
    page = await _load({}, marks)
    by_offset = {m.row.offset: m for m in page.rows}
    assert {o: m.mark for o, m in by_offset.items()} == {
        0: "resolved",
        1: "failed again",
        2: "redriven",
        3: "open",
    }
    assert by_offset[1].newer == (0, 3)
    assert by_offset[3].row.copy_of == (0, 1)
    assert page.by_mark == {"resolved": 1, "failed again": 1, "redriven": 1, "open": 1}
    hidden = await _load({"open": "1"}, marks)
    assert [m.row.offset for m in hidden.rows] == [3, 2]
    assert (hidden.total, hidden.counted, sum(hidden.by_reason.values())) == (4, 2, 2)


async def test_event_types_and_payload_text_filter(monkeypatch: pytest.MonkeyPatch) -> None:
    """The type is read by the source's preset (GitHub: header and action); text is searched in the
    redacted payload, so a secret cannot be found by guessing it."""
    entries = [
        _entry(0, event="push"),
        _entry(1, event="pull_request", body={"action": "opened", "note": "cus_42"}),
        _entry(2, event="pull_request", body={"action": "closed", "webhook_secret": "hunter2hunter2"}),
    ]
    _scanning(monkeypatch, entries)
    typed = await _load({"type": "pull_request.*"})
    assert [(m.row.offset, m.row.event_type) for m in typed.rows] == [
        (2, "pull_request.closed"),
        (1, "pull_request.opened"),
    ]
    assert typed.by_type == {"pull_request.closed": 1, "pull_request.opened": 1}
    assert [m.row.offset for m in (await _load({"text": "CUS_42"})).rows] == [1]
    assert (await _load({"text": "hunter2"})).counted == 0


def test_the_time_axis_ends_at_the_last_record() -> None:
    """Bars span the records' times: a few seconds of records make one bar, never minutes into the future."""
    bars, label = buckets([T0, T0 + 5_000])
    assert len(bars) == 1
    assert label == "1 min"
    bars, _ = buckets([T0, T0 + 48 * 3_600_000])
    assert len(bars) == 24
    assert sum(n for _, n in bars) == 2
