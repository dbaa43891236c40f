"""``pipeline dlq``'s pure parts: ``--since``, filters, rebuilding the original record, printing."""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest

from pipeline.contract import BAD_TIMESTAMP, Delivery, replayed_from
from pipeline.dead_letter import dlq_value
from pipeline.errors import ConfigError, InvalidRecordError
from pipeline.headers import REPLAYED_FROM_HEADER
from pipeline.records.dlq import (
    DLQ_REASONS,
    DlqEntry,
    DlqFilter,
    NotReplayableError,
    parse_entry,
    parse_since,
    reasons_of,
    rebuild,
    records_of,
)
from pipeline.worker.emitter import MAX_DLQ_KEY_BYTES
from pipeline.worker.poison import UNPRODUCIBLE
from pipeline.worker.stage import HandlerFailedError

ROOT = Path(__file__).resolve().parents[3]

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
NOW_MS = int(NOW.timestamp() * 1000)
INPUT, DLQ = "webhooks.raw", "webhooks.dlq"
HEADERS: list[tuple[str, bytes | None]] = [
    ("source", b"github"),
    ("received-at", b"1790000000000"),
    ("http-x-hub-signature-256", b"sha256=ab"),
    ("HTTP-X-Latin1", b"caf\xe9"),
    ("http-x-empty", None),
    ("http-x-twice", b"1"),
    ("http-x-twice", b"2"),
]


def _delivery(
    headers: list[tuple[str, bytes | None]] = HEADERS,
    *,
    key: bytes | None = b"github:d-1",
    value: bytes = b"{}",
) -> Delivery:
    return Delivery(INPUT, 2, 41, 1_790_000_000_000, key, value, tuple(headers))


def _entry(delivery: Delivery, *, reason: str = "bad-signature", max_bytes: int | None = None) -> DlqEntry:
    """The DLQ record the emitter writes for ``delivery``, as ``dlq`` reads it back (at DLQ offset 7)."""
    key = delivery.key
    if key is not None and len(key) > MAX_DLQ_KEY_BYTES:
        key = b"sha256:" + hashlib.sha256(key).hexdigest().encode()
    value = dlq_value(delivery, error="no signature matched", reason=reason, max_bytes=max_bytes)
    return parse_entry(0, 7, delivery.timestamp, key, value)


# --- --since


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2h", datetime(2026, 11, 30, 10, 0, tzinfo=UTC)),
        ("3d", datetime(2026, 11, 27, 12, 0, tzinfo=UTC)),
        ("90m", datetime(2026, 11, 30, 10, 30, tzinfo=UTC)),
        ("2026-11-30T10:00", datetime(2026, 11, 30, 10, 0, tzinfo=UTC)),
        ("2026-11-30", datetime(2026, 11, 30, tzinfo=UTC)),
        ("2026-11-30T10:00:00Z", datetime(2026, 11, 30, 10, 0, tzinfo=UTC)),
        ("2026-11-30T11:00+01:00", datetime(2026, 11, 30, 10, 0, tzinfo=UTC)),
    ],
)
def test_since_takes_a_duration_back_from_now_or_a_time_in_utc(text: str, expected: datetime) -> None:
    """A duration counts back from now; a time without an offset is UTC."""
    assert parse_since(text, now=NOW) == int(expected.timestamp() * 1000)


@pytest.mark.parametrize("text", ["", "yesterday", "-2h", "2x", "2026-13-01"])
def test_since_refuses_what_is_neither_in_one_line(text: str) -> None:
    """Anything else is a ValueError naming both accepted forms."""
    with pytest.raises(ValueError, match="duration") as caught:
        parse_since(text, now=NOW)
    assert "\n" not in str(caught.value)


# --- filters


def test_the_filter_takes_reasons_keys_prefixes_and_times() -> None:
    """Each given condition must hold; none given takes everything."""
    entry = _entry(_delivery())
    assert DlqFilter().matches(entry)
    assert DlqFilter(reasons=frozenset({"bad-signature", "bad-body"})).matches(entry)
    assert not DlqFilter(reasons=frozenset({"unknown-source"})).matches(entry)
    assert DlqFilter(key="github:d-1").matches(entry)
    assert DlqFilter(key="github:*").matches(entry)
    assert not DlqFilter(key="github:d").matches(entry)
    assert not DlqFilter(key="stripe:*").matches(entry)
    assert DlqFilter(since_ms=entry.timestamp).matches(entry)
    assert not DlqFilter(since_ms=entry.timestamp + 1).matches(entry)


def test_reasons_may_repeat_and_be_comma_separated() -> None:
    """``--reason a,b --reason c`` is three reasons; nothing given is none."""
    assert reasons_of(["bad-signature, unknown-source", "bad-body", ""]) == {
        "bad-signature",
        "unknown-source",
        "bad-body",
    }
    assert reasons_of(None) == frozenset()


def test_records_pick_dlq_records_by_partition_and_offset() -> None:
    """``--record 0:3,1:4`` takes exactly those DLQ records; anything but two numbers is one readable error."""
    entry = _entry(_delivery())
    assert records_of(["0:3, 1:4", "2:0"]) == {(0, 3), (1, 4), (2, 0)}
    assert DlqFilter(records=frozenset({(entry.partition, entry.offset)})).matches(entry)
    assert not DlqFilter(records=frozenset({(entry.partition, entry.offset + 1)})).matches(entry)
    for bad in ("3", "a:1", "1:-2", "1:2:3"):
        with pytest.raises(ValueError, match="PARTITION:OFFSET"):
            records_of([bad])


def test_an_unknown_reason_is_one_line_naming_the_known_ones() -> None:
    """``--reason bogus`` raises ConfigError listing every reason a DLQ record can carry."""
    with pytest.raises(ConfigError) as info:
        reasons_of(["bad-signature,bogus"])
    message = str(info.value)
    assert "'bogus'" in message
    assert "\n" not in message
    assert all(reason in message for reason in DLQ_REASONS)


def _subclasses(cls: type[InvalidRecordError]) -> list[type[InvalidRecordError]]:
    return [cls, *(sub for child in cls.__subclasses__() for sub in _subclasses(child))]


def test_the_known_reasons_are_every_reason_the_worker_writes() -> None:
    """DLQ_REASONS holds each invalid-record error's reason, the worker's own and the design's table."""
    # the ingress's own (HTTP answers) and a downstream consumer's never reach the DLQ
    elsewhere = ("pipeline.ingress", "pipeline.downstream")
    errors = [cls for cls in _subclasses(InvalidRecordError) if not cls.__module__.startswith(elsewhere)]
    written = {cls.reason for cls in errors}
    written |= {UNPRODUCIBLE, BAD_TIMESTAMP, HandlerFailedError.reason}
    sources = [ROOT / "pipeline" / "worker" / name for name in ("event_stage.py", "effect_stage.py")]
    for text in (path.read_text(encoding="utf-8") for path in sources):
        written |= set(re.findall(r'Invalid\("([a-z-]+)"', text))
        written |= set(re.findall(r'return "([a-z-]+)", f?"', text))
    design = (ROOT / "docs" / "design.md").read_text(encoding="utf-8").split("## 7.")[1].split("## 8.")[0]
    named = set(re.findall(r"reason `([a-z-]+)`", design))
    named |= {
        r for group in re.findall(r"DLQ \(([^)]*)\)", design) for r in re.findall(r"`([a-z-]+)`", group)
    }
    assert written <= set(DLQ_REASONS)
    assert named <= set(DLQ_REASONS)
    assert set(DLQ_REASONS) == written | named | {"unparseable"}


# --- rebuilding the original


def test_a_dlq_record_rebuilds_the_original_byte_for_byte() -> None:
    """Key, body and every header (non-UTF-8, repeated, without a value, in order) come back, plus replayed-from."""
    body = b'{"ref": "refs/heads/main"}\xff'
    original = rebuild(_entry(_delivery(value=body)), dlq_topic=DLQ, input_topic=INPUT)
    assert original.key == b"github:d-1"
    assert original.value == body
    assert original.headers == [*HEADERS, (REPLAYED_FROM_HEADER, b"webhooks.dlq:0:7")]
    assert (original.timestamp, original.partition) == (1_790_000_000_000, 2)


def test_a_replayed_record_that_failed_again_names_only_its_latest_dlq_record() -> None:
    """An earlier replayed-from header is replaced, not repeated."""
    delivery = _delivery([*HEADERS, (REPLAYED_FROM_HEADER, b"webhooks.dlq:3:1")])
    original = rebuild(_entry(delivery), dlq_topic=DLQ, input_topic=INPUT)
    assert [v for n, v in original.headers if n == REPLAYED_FROM_HEADER] == [b"webhooks.dlq:0:7"]


def test_a_key_longer_than_the_dlq_key_limit_is_restored_from_its_text() -> None:
    """The DLQ record's key is a sha256 stand-in; the key text restores the original when it matches."""
    long_key = b"github:" + b"k" * (MAX_DLQ_KEY_BYTES + 1)
    original = rebuild(_entry(_delivery(key=long_key)), dlq_topic=DLQ, input_topic=INPUT)
    assert original.key == long_key


def test_a_key_that_is_not_utf8_comes_from_the_record_key() -> None:
    """The key text is lossy then; the DLQ record's own key holds the bytes."""
    original = rebuild(_entry(_delivery(key=b"github:\xff")), dlq_topic=DLQ, input_topic=INPUT)
    assert original.key == b"github:\xff"


def test_a_keyless_record_stays_keyless() -> None:
    """No key in, no key out; it goes back to its partition and the worker derives the key."""
    original = rebuild(_entry(_delivery(key=None)), dlq_topic=DLQ, input_topic=INPUT)
    assert (original.key, original.partition) == (None, 2)


def test_an_older_dlq_record_without_headers_base64_uses_the_header_text() -> None:
    """Records written before headers_base64 replay from ``headers``, unless a value was not UTF-8."""
    value = orjson.loads(dlq_value(_delivery(HEADERS[:3]), error="e", reason="bad-signature"))
    del value["headers_base64"]
    old = DlqEntry(0, 7, 1, b"github:d-1", value)
    assert rebuild(old, dlq_topic=DLQ, input_topic=INPUT).headers[:3] == HEADERS[:3]
    lossy = orjson.loads(dlq_value(_delivery(), error="e", reason="bad-signature"))
    del lossy["headers_base64"]
    with pytest.raises(NotReplayableError, match="not UTF-8"):
        rebuild(DlqEntry(0, 7, 1, b"github:d-1", lossy), dlq_topic=DLQ, input_topic=INPUT)


def test_a_truncated_record_cannot_be_replayed() -> None:
    """Only a prefix of its body is kept: refused, naming the body's size."""
    entry = _entry(_delivery(value=b"x" * 10_000), max_bytes=4096)
    assert entry.truncated
    with pytest.raises(NotReplayableError, match=r"truncated.*10000-byte body"):
        rebuild(entry, dlq_topic=DLQ, input_topic=INPUT)


def test_an_effect_stage_record_rebuilds_for_the_effects_topic_with_its_effect_key_and_headers() -> None:
    """A DLQ record the effect stage wrote (from the effects topic) goes back there: effect key, command, headers."""
    headers: list[tuple[str, bytes | None]] = [
        ("effect-ttl-ms", b"2592000000"),
        ("command-topic", b"shop.orders"),
    ]
    command = b'{"command":"fulfil-order","key":"stripe:evt_1","effect_key":"fulfil-order:pi_1"}'
    delivery = Delivery(
        "shop-effects", 3, 12, 1_790_000_000_000, b"fulfil-order:pi_1", command, tuple(headers)
    )
    entry = DlqEntry(
        0, 7, 1, b"fulfil-order:pi_1", orjson.loads(dlq_value(delivery, error="e", reason="too-large"))
    )
    original = rebuild(entry, dlq_topic=DLQ, input_topic=INPUT, effects_topic="shop-effects")
    assert (original.topic, original.key, original.value) == ("shop-effects", b"fulfil-order:pi_1", command)
    assert original.headers == [*headers, (REPLAYED_FROM_HEADER, b"webhooks.dlq:0:7")]
    with pytest.raises(
        NotReplayableError, match=r"not from the input topic webhooks\.raw or the effects topic other"
    ):
        rebuild(entry, dlq_topic=DLQ, input_topic=INPUT, effects_topic="other")


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (b"not json", "not a DLQ record"),
        (b'{"topic": "app-effects", "value_base64": ""}', "not from the input topic"),
        (b'{"topic": "webhooks.raw", "value_base64": "%%%"}', "not base64"),
        (b'{"topic": "webhooks.raw", "value_base64": "", "headers_base64": [["a", 1]]}', "not base64"),
        (b'{"topic": "webhooks.raw", "value_base64": "", "headers_base64": {}}', "not a list"),
        (b'{"topic": "webhooks.raw", "value_base64": "", "headers_truncated": true}', "cut"),
    ],
)
def test_a_malformed_dlq_record_is_refused_with_the_reason(value: bytes, match: str) -> None:
    """Anything that cannot give back the original record is NotReplayableError, never a crash."""
    with pytest.raises(NotReplayableError, match=match):
        rebuild(parse_entry(0, 1, 1, b"k", value), dlq_topic=DLQ, input_topic=INPUT)


# --- the worker's side and printing


def test_the_worker_reads_replayed_from_only_from_replayed_records() -> None:
    """The audit extra is the header's value when present, else nothing."""
    assert replayed_from(_delivery()) == {}
    replayed = _delivery([*HEADERS, (REPLAYED_FROM_HEADER, b"webhooks.dlq:0:7")])
    assert replayed_from(replayed) == {"replayed_from": "webhooks.dlq:0:7"}
