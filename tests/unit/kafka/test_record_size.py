"""The bound on a record's size on the wire that every size check before a send relies on."""

from __future__ import annotations

from aiokafka.record.default_records import DefaultRecordBatchBuilder

from pipeline.kafka.record_size import RECORD_OVERHEAD, record_size

MIB = 1024 * 1024


def test_record_size_bounds_what_aiokafka_counts() -> None:
    """``record_size`` is never below aiokafka's own estimate, so passing the check passes the producer's."""
    cases: list[tuple[bytes | None, bytes, list[tuple[str, bytes | None]]]] = [
        (None, b"", []),
        (b"k" * 300, b"v" * 70_000, [("source", b"stripe"), ("é" * 80, None)]),
        (b"", b"v" * (4 * MIB), [(f"h{i}", b"x" * 200) for i in range(100)]),
    ]
    for key, value, headers in cases:
        estimate = DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, headers)
        assert estimate <= record_size(key, value, headers) <= estimate + 1024 + 10 * len(headers)


def test_each_header_adds_its_name_and_value() -> None:
    """A header counts its name's UTF-8 bytes, its value and its length prefixes; a missing value counts none."""
    bare = record_size(b"k", b"v", [])
    assert record_size(b"k", b"v", [("\u00e9", b"xyz")]) == bare + 10 + 2 + 3
    assert record_size(b"k", b"v", [("a", None)]) == bare + 10 + 1


def test_a_record_without_a_key_counts_no_key_bytes() -> None:
    """A keyless record is the overhead and its value, exactly; an empty key counts the same, a key its bytes."""
    assert RECORD_OVERHEAD == 128
    assert record_size(None, b"v" * 5, []) == 128 + 5
    assert record_size(b"", b"v" * 5, []) == 128 + 5
    assert record_size(b"key", b"v" * 5, []) == 128 + 3 + 5
