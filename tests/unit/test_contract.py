"""The record contract: input records validated at the boundary, and the JSON values the worker writes."""

from __future__ import annotations

import base64
import hashlib

import orjson
import pytest

from pipeline.contract import (
    BAD_HEADER,
    BAD_TIMESTAMP,
    RECEIVED_AT_MAX_MS,
    RECEIVED_AT_MIN_MS,
    Delivery,
    audit_value,
    command_value,
)
from pipeline.dead_letter import DLQ_HEADROOM, ERROR_MAX_CHARS, dlq_value
from pipeline.errors import InvalidHeaderError
from pipeline.kafka.record_size import record_size

MIB = 1024 * 1024
NOW = 1_700_000_000_000


def _delivery(
    headers: list[tuple[str, bytes | None]],
    timestamp: int = NOW,
    key: bytes | None = b"stripe:evt_1",
    value: bytes = b"{}",
) -> Delivery:
    return Delivery.from_record("raw", 0, 7, timestamp, key, value, headers)


# --- reading an input record


def test_source_and_received_at_come_from_their_headers() -> None:
    """``source`` and ``received-at`` are read on construction, whatever the case of the names."""
    delivery = _delivery([("Source", b"stripe"), ("received-at", b"1700000000123")])
    assert delivery.source == "stripe"
    assert delivery.received_at == 1_700_000_000_123
    assert delivery.problem is None


def test_a_missing_received_at_is_the_record_timestamp_and_no_problem() -> None:
    """Without a ``received-at`` header the record timestamp stands in, and the record is fine."""
    delivery = _delivery([("source", b"stripe")], timestamp=NOW)
    assert delivery.received_at == NOW
    assert delivery.problem is None


@pytest.mark.parametrize(
    "raw",
    [
        b"100000000000000000000",  # digits, but beyond 64 bits
        b"9" * 5000,  # beyond Python's int max str digits
        b"-5",
        b"12a",
        b"",
        b"\xff",
        "²".encode(),  # a Unicode digit
        b" 1700000000123",  # int() would accept the space
        b"1_700_000_000_123",  # and the underscores
        b"0001700000000123",  # 16 digits
        str(RECEIVED_AT_MIN_MS - 1).encode(),
        str(RECEIVED_AT_MAX_MS + 1).encode(),
    ],
)
def test_a_bad_received_at_is_a_bad_header_problem_not_an_exception(raw: bytes) -> None:
    """Hostile ``received-at`` values give ``bad-header`` naming the header; ``received_at`` is the timestamp."""
    delivery = _delivery([("source", b"stripe"), ("received-at", raw)], timestamp=NOW)
    assert delivery.received_at == NOW
    assert delivery.problem is not None
    reason, message = delivery.problem
    assert reason == BAD_HEADER == InvalidHeaderError.reason == "bad-header"
    assert "received-at" in message
    assert "\n" not in message
    assert len(message) < 200


def test_received_at_bounds_are_inclusive() -> None:
    """2000-01-01 and 2200-01-01 themselves are accepted."""
    for ms in (RECEIVED_AT_MIN_MS, RECEIVED_AT_MAX_MS):
        delivery = _delivery([("received-at", str(ms).encode())])
        assert (delivery.received_at, delivery.problem) == (ms, None)


@pytest.mark.parametrize("timestamp", [-1, 10**15, 10**40])
def test_an_insane_record_timestamp_is_a_bad_timestamp_problem(timestamp: int) -> None:
    """A negative timestamp or one after 2200 gives ``bad-timestamp``, even with a valid ``received-at``."""
    assert _delivery([], timestamp=timestamp).problem is not None
    delivery = _delivery([("received-at", b"1700000000123")], timestamp=timestamp)
    assert delivery.problem is not None
    assert delivery.problem[0] == BAD_TIMESTAMP == "bad-timestamp"
    assert "timestamp" in delivery.problem[1]


def test_a_bad_header_is_reported_before_a_bad_timestamp() -> None:
    """With both wrong, the header's problem is the one reported."""
    delivery = _delivery([("received-at", b"soon")], timestamp=-1)
    assert delivery.problem is not None
    assert delivery.problem[0] == BAD_HEADER


@pytest.mark.parametrize("raw", [b"\xff", b"s" * 257, b"\xe2\x82"])
def test_a_source_not_utf8_or_too_long_is_a_bad_header(raw: bytes) -> None:
    """An undecodable or overlong ``source`` is ``bad-header`` and reads as no source."""
    delivery = _delivery([("source", raw)])
    assert delivery.source is None
    assert delivery.problem is not None
    assert delivery.problem[0] == BAD_HEADER
    assert "source" in delivery.problem[1]


def test_a_source_of_256_bytes_is_accepted() -> None:
    """The longest allowed ``source`` (256 bytes of UTF-8) reads as itself."""
    name = "é" * 128
    delivery = _delivery([("source", name.encode())])
    assert (delivery.source, delivery.problem) == (name, None)


def test_an_empty_or_missing_source_is_none() -> None:
    """No ``source`` header, an empty one or one without a value all read as no source, no problem."""
    cases: list[list[tuple[str, bytes | None]]] = [[], [("source", b"")], [("source", None)]]
    for headers in cases:
        delivery = _delivery(headers)
        assert (delivery.source, delivery.problem) == (None, None)


def test_headers_without_a_value_crash_nothing() -> None:
    """A ``None`` header value is skipped by every reader and by the output functions."""
    headers: list[tuple[str, bytes | None]] = [("received-at", None), ("http-x", None), ("source", b"s")]
    delivery = _delivery(headers)
    assert (delivery.problem, delivery.received_at) == (None, NOW)
    assert dict(delivery.headers) == {"source": "s"}
    assert dict(delivery.http_headers()) == {}
    assert orjson.loads(dlq_value(delivery, error="e", reason="r", max_bytes=4096))["headers"] == {
        "source": "s"
    }
    assert record_size(None, b"", headers) > record_size(None, b"", [])


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


# --- commands and audit records


HOSTILE_RECEIVED_AT = [b"100000000000000000000", b"9" * 5000, b"18446744073709551616"]


@pytest.mark.parametrize("raw", HOSTILE_RECEIVED_AT)
def test_audit_and_command_values_serialise_for_any_validated_delivery(raw: bytes) -> None:
    """Whatever ``received-at`` says, the values built from a delivery serialise with its ``received_at``."""
    delivery = _delivery([("source", b"stripe"), ("received-at", raw)])
    audit = audit_value(
        key="stripe:evt_1",
        outcome="invalid",
        partition=delivery.partition,
        offset=delivery.offset,
        received_at=delivery.received_at,
        first_seen_at=None,
        reason=delivery.problem[0] if delivery.problem else None,
    )
    command = command_value(
        command="handle",
        key="stripe:evt_1",
        effect_key="stripe:evt_1",
        source="stripe",
        event_type=None,
        received_at=delivery.received_at,
        body=delivery.value,
    )
    assert orjson.loads(audit)["received_at"] == NOW
    assert orjson.loads(audit)["reason"] == "bad-header"
    assert orjson.loads(command)["received_at"] == NOW


def test_audit_value_turns_an_out_of_range_integer_into_null() -> None:
    """An integer orjson cannot write (from a hostile command record, say) becomes null, not an exception."""
    value = audit_value(
        key="k",
        outcome="handled",
        partition=0,
        offset=1,
        received_at=10**20,
        first_seen_at=None,
        extra={"stage": "effect", "n": [2**64], "event_key": "\ud800"},
    )
    record = orjson.loads(value)
    assert record["received_at"] is None
    assert record["n"] == [None]
    assert record["event_key"] == "?"
    assert record["stage"] == "effect"


# --- DLQ records


def test_a_small_dlq_record_is_the_whole_record() -> None:
    """Under the limit the record carries the body as text and base64, with no truncation fields."""
    delivery = _delivery([("source", b"stripe")], value=b'{"id": "evt_1"}')
    record = orjson.loads(dlq_value(delivery, error="boom", reason="bad-body", max_bytes=4 * MIB))
    assert record == orjson.loads(dlq_value(delivery, error="boom", reason="bad-body"))
    assert record["value"] == '{"id": "evt_1"}'
    assert base64.b64decode(record["value_base64"]) == b'{"id": "evt_1"}'
    assert {"truncated", "value_bytes", "value_sha256", "headers_truncated"}.isdisjoint(record)
    assert record["headers"] == {"source": "stripe"}


def test_a_4_mib_body_is_cut_to_fit_with_its_length_and_digest() -> None:
    """A 4 MiB body in a 4 MiB record: base64 prefix of the body, original length, sha256 of the whole."""
    body = bytes(range(256)) * (4 * MIB // 256)
    delivery = _delivery([("source", b"stripe")], value=body)
    value = dlq_value(delivery, error="too large", reason="bad-body", max_bytes=4 * MIB)
    assert len(value) <= 4 * MIB - DLQ_HEADROOM - len(delivery.key or b"")
    assert record_size(delivery.key, value, ()) <= 4 * MIB
    record = orjson.loads(value)
    assert record["truncated"] is True
    assert record["value"] is None
    assert record["value_bytes"] == len(body)
    assert record["value_sha256"] == hashlib.sha256(body).hexdigest()
    prefix = base64.b64decode(record["value_base64"])
    assert body.startswith(prefix)
    assert len(prefix) > 3 * MIB - 4096  # the room is used, not thrown away
    assert record["headers"] == {"source": "stripe"}
    assert "headers_truncated" not in record


def test_a_record_whose_text_doubles_the_size_is_cut_too() -> None:
    """A body whose base64 alone fits but text plus base64 does not is cut as well."""
    body = b"a" * (2 * MIB)
    value = dlq_value(_delivery([], value=body), error="e", reason="r", max_bytes=4 * MIB)
    assert len(value) <= 4 * MIB - DLQ_HEADROOM
    assert orjson.loads(value)["value_bytes"] == len(body)


@pytest.mark.parametrize("max_bytes", [4096, 5000, 64 * 1024, MIB])
def test_huge_headers_key_and_error_still_fit_and_are_marked(max_bytes: int) -> None:
    """Oversized headers, key and error are cut so the record always fits; the cuts are marked."""
    headers: list[tuple[str, bytes | None]] = [(f"http-x-{i}", b"\x01" * 100_000) for i in range(50)]
    headers += [("source", b"stripe"), ("http-" + "n" * 10_000, b"v")]
    delivery = _delivery(headers, key=b"\x01" * 2_000, value=b"\x00" * 3 * MIB)
    value = dlq_value(delivery, error="\x01" * 50_000, reason="bad-body", max_bytes=max_bytes)
    assert len(value) <= max(max_bytes - 2_000, 4096) - DLQ_HEADROOM
    record = orjson.loads(value)
    assert record["truncated"] is True
    assert record["headers_truncated"] is True
    assert record["key_truncated"] is True
    assert record["headers"].get("source") == "stripe"  # the small headers are kept whole
    assert len(record["error"]) <= ERROR_MAX_CHARS
    assert record["value_bytes"] == 3 * MIB


def test_the_error_is_capped_at_1000_characters() -> None:
    """A long error message is cut to ERROR_MAX_CHARS, ending in an ellipsis."""
    record = orjson.loads(dlq_value(_delivery([]), error="x" * 5_000, reason="r"))
    assert len(record["error"]) == ERROR_MAX_CHARS
    assert record["error"].endswith("…")
