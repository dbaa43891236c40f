"""Input records as the worker reads them: the contract's headers, decoded only when read."""

from __future__ import annotations

from pipeline.contract import Delivery


def _delivery(headers: list[tuple[str, bytes | None]], timestamp: int = 1_000) -> Delivery:
    return Delivery.from_record("raw", 0, 7, timestamp, b"stripe:evt_1", b"{}", headers)


def test_source_and_received_at_come_from_their_headers() -> None:
    """``source`` and ``received-at`` are read on construction, whatever the case of the names."""
    delivery = _delivery([("Source", b"stripe"), ("received-at", b"1700000000123")])
    assert delivery.source == "stripe"
    assert delivery.received_at == 1_700_000_000_123


def test_received_at_falls_back_to_the_record_timestamp() -> None:
    """A missing or non-numeric ``received-at`` (Unicode digits included) means the record timestamp."""
    assert _delivery([], timestamp=5).received_at == 5
    assert _delivery([("received-at", b"soon")], timestamp=5).received_at == 5
    assert _delivery([("received-at", "²".encode())], timestamp=5).received_at == 5


def test_an_empty_or_missing_source_is_none() -> None:
    """No ``source`` header, an empty one or one without a value all read as no source."""
    assert _delivery([]).source is None
    assert _delivery([("source", b"")]).source is None
    assert _delivery([("source", None)]).source is None


def test_a_repeated_header_reads_as_its_last_value_everywhere() -> None:
    """The typed fields and the header mapping agree when a producer repeats a name."""
    delivery = _delivery(
        [("source", b"github"), ("source", b"stripe"), ("http-x-a", b"1"), ("HTTP-X-A", b"2")]
    )
    assert delivery.source == "stripe"
    assert delivery.headers["source"] == "stripe"
    assert delivery.http_headers()["x-a"] == "2"


def test_http_headers_are_the_prefixed_ones_without_the_prefix() -> None:
    """Only ``http-*`` headers are HTTP headers; values are decoded as UTF-8 with replacement."""
    delivery = _delivery(
        [("source", b"stripe"), ("http-stripe-signature", b"t=1,v1=ab"), ("http-x-bad", b"\xff")]
    )
    http = delivery.http_headers()
    assert dict(http) == {"stripe-signature": "t=1,v1=ab", "x-bad": "\ufffd"}
    assert len(http) == 2
