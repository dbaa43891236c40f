"""``pipeline dlq list``'s lines: one line per record whatever it holds, and the summary."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

import orjson

from pipeline.contract import Delivery
from pipeline.dead_letter import dlq_value
from pipeline.ops.dlq_records import entry_json, entry_line, parse_entry, summary

NOW_MS = int(datetime(2026, 11, 30, 12, 0, tzinfo=UTC).timestamp() * 1000)


def _delivery(key: bytes) -> Delivery:
    return Delivery("webhooks.raw", 2, 41, 1_790_000_000_000, key, b"{}", (("source", b"github"),))


def test_a_list_line_is_one_line_whatever_the_key_and_error() -> None:
    """Control characters in key and error are shown as '?', and the error is cut."""
    delivery = _delivery(b"github:a\nb")
    value = dlq_value(delivery, error="line one\nline two " + "x" * 500, reason="bad-signature")
    line = entry_line(parse_entry(1, 9, NOW_MS, delivery.key, value))
    assert "\n" not in line
    assert line.startswith("1:9  2026-11-30T12:00:00Z  bad-signature  github:a?b  line one?line two")
    assert line.endswith("…")
    printed = orjson.loads(entry_json(parse_entry(1, 9, NOW_MS, delivery.key, value)))
    assert (printed["dlq_offset"], printed["offset"], printed["truncated"]) == (9, 41, False)


def test_the_summary_counts_each_reason_most_frequent_first() -> None:
    """``N records: reason n, ...``."""
    assert summary(Counter({"unknown-source": 1, "bad-signature": 3})) == (
        "4 records: bad-signature 3, unknown-source 1"
    )
    assert summary(Counter()) == "0 records"
