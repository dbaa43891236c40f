"""The DLQ page's query: filters, page and snapshot read from a URL or a form, each bad field named."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from multidict import MultiDict

from pipeline.console.dlq_query import BadQueryError, format_upto, parse_query, parse_upto

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
NOW_MS = int(NOW.timestamp() * 1000)


def test_every_filter_is_read_and_round_trips_through_links_and_forms() -> None:
    """Reasons (repeated or comma-separated), source, type glob, key, text, a range, hide-resolved, page, snapshot."""
    values = MultiDict(
        [
            ("reason", "bad-signature"),
            ("reason", "unknown-source"),
            ("source", "stripe"),
            ("type", "invoice.*"),
            ("key", "stripe:*"),
            ("text", "cus_42"),
            ("since", "2h"),
            ("until", "2026-11-30T11:30"),
            ("open", "1"),
            ("page", "3"),
            ("upto", "0:10,1:7"),
        ]
    )
    query = parse_query(values, now=NOW)
    assert query.reasons == {"bad-signature", "unknown-source"}
    assert (query.source, query.event_type, query.key, query.text) == (
        "stripe",
        "invoice.*",
        "stripe:*",
        "cus_42",
    )
    assert (query.since_ms, query.until_ms) == (NOW_MS - 7_200_000, NOW_MS - 1_800_000)
    assert (query.hide_handled, query.page, query.upto) == (True, 3, {0: 10, 1: 7})
    again = parse_query(MultiDict(query.params()), now=NOW)
    assert again == query
    assert query.link(page=1, with_upto=False).startswith(
        "/dlq?reason=bad-signature%2Cunknown-source&source=stripe"
    )
    assert "page=" not in query.link(page=1)


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("reason", "unknown", "reason: no DLQ record has reason 'unknown'"),
        ("since", "yesterday", "since: expected a duration"),
        ("until", "soon", "until: expected a duration"),
        ("page", "0", "page: expected a number"),
        ("page", "x", "page: expected a number"),
        ("upto", "0:1,x", "upto: expected PARTITION:OFFSET"),
        ("key", "a\nb", "key: at most 200 characters, no control characters"),
        ("text", "x" * 201, "text: at most 200 characters"),
    ],
)
def test_a_bad_field_is_one_error_naming_it(field: str, value: str, named: str) -> None:
    """Each mistake is a BadQueryError whose message starts with the field (the page shows it above the form)."""
    with pytest.raises(BadQueryError) as error:
        parse_query({field: value}, now=NOW)
    assert str(error.value).startswith(named)


def test_a_range_that_ends_before_it_starts_is_refused() -> None:
    """``since`` later than ``until`` matches nothing by construction: said, not silently empty."""
    with pytest.raises(BadQueryError, match="starts after it ends"):
        parse_query({"since": "1h", "until": "2h"}, now=NOW)


def test_the_filters_beyond_the_record_filter() -> None:
    """Source exact, event type a glob, the range's end inclusive, text case-insensitive."""
    query = parse_query({"source": "stripe", "type": "invoice.*", "until": "1h", "text": "CUS_42"}, now=NOW)
    takes = {
        "source": "stripe",
        "event_type": "invoice.paid",
        "timestamp": NOW_MS - 3_600_000,
        "body": '{"c":"cus_42"}',
    }
    assert query.takes(**takes)  # type: ignore[arg-type]
    assert not query.takes(**{**takes, "source": "github"})  # type: ignore[arg-type]
    assert not query.takes(**{**takes, "event_type": "charge.failed"})  # type: ignore[arg-type]
    assert not query.takes(**{**takes, "event_type": None})  # type: ignore[arg-type]
    assert not query.takes(**{**takes, "timestamp": NOW_MS})  # type: ignore[arg-type]
    assert not query.takes(**{**takes, "body": "{}"})  # type: ignore[arg-type]
    assert query.needs_body


def test_a_snapshot_is_each_partitions_end() -> None:
    """``upto`` reads and prints as ``P:O,...``."""
    assert parse_upto("1:5, 0:3") == {0: 3, 1: 5}
    assert format_upto({1: 5, 0: 3}) == "0:3,1:5"
