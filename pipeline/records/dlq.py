"""DLQ records as the operator tools and the console read them: choosing them and rebuilding the original.

Pure: no Kafka. ``pipeline/ops/dlq.py`` (``pipeline dlq``) and the console
read the DLQ and produce the replays; ``pipeline/ops/dlq_records.py`` prints them.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from pipeline.durations import parse_duration
from pipeline.errors import ConfigError, PipelineError
from pipeline.headers import REPLAYED_FROM_HEADER

Header = tuple[str, bytes | None]

#: How many characters of a key a line or an error shows.
KEY_SHOWN = 120
_SHA256_PREFIX = b"sha256:"
_TS_MAX_MS = 7_258_118_400_000  # 2200-01-01, as the contract's timestamps

#: Every reason a DLQ record can carry (docs/design.md, section 7), and ``unparseable`` for a
#: record that is not a DLQ record at all; tests/unit/records/test_dlq.py checks it against the worker.
DLQ_REASONS = (
    "bad-body",
    "bad-effect-record",
    "bad-header",
    "bad-signature",
    "bad-timestamp",
    "handler-error",
    "invalid",
    "key-mismatch",
    "missing-effect-key",
    "missing-key",
    "too-large",
    "unknown-command-topic",
    "unknown-source",
    "unproducible",
    "unparseable",
)


class NotReplayableError(PipelineError):
    """A DLQ record from which the original record cannot be rebuilt (truncated, malformed)."""

    reason = "not-replayable"


# -- choosing records -------------------------------------------------------------------------


def parse_since(text: str, *, now: datetime) -> int:
    """``--since``: a duration back from ``now`` (``2h``, ``3d``) or a time (``2026-11-30T10:00``,
    UTC unless it names an offset), as ms since the epoch. Raises ValueError (one line)."""
    stripped = text.strip()
    try:
        return int((now - parse_duration(stripped)).timestamp() * 1000)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(stripped)
    except ValueError:
        raise ValueError(
            f"expected a duration such as '2h' or '3d', or a time such as '2026-11-30T10:00', got {text[:40]!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


@dataclass(frozen=True, slots=True)
class DlqEntry:
    """One DLQ record: where it sits in the DLQ, its Kafka key and its parsed value."""

    partition: int
    offset: int
    timestamp: int
    record_key: bytes | None
    value: dict[str, Any]

    @property
    def reason(self) -> str:
        """The DLQ reason (``unparseable`` when the value is not a DLQ record)."""
        reason = self.value.get("reason")
        return reason if isinstance(reason, str) else "unparseable"

    @property
    def key(self) -> str | None:
        """The original key as text."""
        key = self.value.get("key")
        return key if isinstance(key, str) else None

    @property
    def error(self) -> str:
        """The error that sent the record here."""
        error = self.value.get("error")
        return error if isinstance(error, str) else ""

    @property
    def truncated(self) -> bool:
        """Whether only a prefix of the body is kept (such a record cannot be replayed)."""
        return self.value.get("truncated") is True


def parse_entry(
    partition: int, offset: int, timestamp: int, key: bytes | None, value: bytes | None
) -> DlqEntry:
    """A consumed DLQ record; a value that is not a JSON object reads as an empty one."""
    try:
        parsed = orjson.loads(value) if value is not None else None
    except orjson.JSONDecodeError:
        parsed = None
    return DlqEntry(partition, offset, timestamp, key, parsed if isinstance(parsed, dict) else {})


@dataclass(frozen=True, slots=True)
class DlqFilter:
    """Which DLQ records a command takes: reasons (none: all), a key (``prefix*`` or exact), a time,
    and DLQ records by ``(partition, offset)`` (none: all)."""

    reasons: frozenset[str] = frozenset()
    key: str | None = None
    since_ms: int | None = None
    records: frozenset[tuple[int, int]] = frozenset()

    def matches(self, entry: DlqEntry) -> bool:
        """Whether ``entry`` passes every given condition."""
        if self.records and (entry.partition, entry.offset) not in self.records:
            return False
        if self.reasons and entry.reason not in self.reasons:
            return False
        if self.since_ms is not None and entry.timestamp < self.since_ms:
            return False
        if self.key is None:
            return True
        key = entry.key or ""
        return key.startswith(self.key[:-1]) if self.key.endswith("*") else key == self.key


def records_of(values: Iterable[str] | None) -> frozenset[tuple[int, int]]:
    """``--record P:O`` given once or more, each possibly comma-separated; ValueError (one line) otherwise."""
    found = set()
    for value in values or ():
        for item in value.split(","):
            text = item.strip()
            if not text:
                continue
            partition, sep, offset = text.partition(":")
            if not (sep and partition.isdigit() and offset.isdigit()):
                raise ValueError(f"expected a DLQ record as PARTITION:OFFSET such as 0:17, got {text[:40]!r}")
            found.add((int(partition), int(offset)))
    return frozenset(found)


def reasons_of(values: Iterable[str] | None) -> frozenset[str]:
    """``--reason`` given once or more, each possibly comma-separated; ConfigError naming the known
    reasons for one that no DLQ record can carry (a typo would otherwise match nothing, silently)."""
    reasons = frozenset(r.strip() for value in values or () for r in value.split(",") if r.strip())
    unknown = sorted(reasons - set(DLQ_REASONS))
    if unknown:
        raise ConfigError(
            f"no DLQ record has reason {', '.join(map(repr, unknown))}; the reasons are {', '.join(DLQ_REASONS)}"
        )
    return reasons


# -- rebuilding the original record -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Original:
    """The record a DLQ entry was made from, ready to produce again."""

    key: bytes | None
    value: bytes
    headers: list[Header]
    timestamp: int | None
    partition: int  # its partition then: where a keyless record goes back to
    topic: str  # where it came from and goes back to: the input topic, or the effects topic


def rebuild(
    entry: DlqEntry, *, dlq_topic: str, input_topic: str, effects_topic: str | None = None
) -> Original:
    """The original record of ``entry``, with a ``replayed-from`` header naming the DLQ record.

    A record the effect stage dead-lettered came from ``effects_topic`` (when given) and goes
    back there, keyed by its effect key with its headers, to be deduped by effect key again.
    Raises NotReplayableError for a value that is not a DLQ record, a record from any other
    topic, a truncated record, or a key or header that cannot be restored byte for byte.
    """
    value = entry.value
    if not value:
        raise NotReplayableError("not a DLQ record (its value is not a JSON object)")
    topic = value.get("topic")
    if topic != input_topic and (effects_topic is None or topic != effects_topic):
        shown = one_line(str(topic), KEY_SHOWN)
        also = f" or the effects topic {effects_topic}" if effects_topic is not None else ""
        raise NotReplayableError(f"it came from {shown}, not from the input topic {input_topic}{also}")
    if entry.truncated:
        size = value.get("value_bytes")
        raise NotReplayableError(f"truncated: the DLQ record keeps only a prefix of the {size}-byte body")
    encoded = value.get("value_base64")
    if not isinstance(encoded, str):
        raise NotReplayableError("the DLQ record has no value_base64")
    try:
        body = base64.b64decode(encoded, validate=True)
    except binascii.Error:
        raise NotReplayableError("its value_base64 is not base64") from None
    headers = [h for h in _headers(value) if h[0].lower() != REPLAYED_FROM_HEADER]
    headers.append((REPLAYED_FROM_HEADER, f"{dlq_topic}:{entry.partition}:{entry.offset}".encode()))
    timestamp = value.get("timestamp")
    partition = value.get("partition")
    return Original(
        key=_original_key(entry.record_key, value.get("key")),
        value=body,
        headers=headers,
        timestamp=timestamp if type(timestamp) is int and 0 <= timestamp <= _TS_MAX_MS else None,
        partition=partition if type(partition) is int and partition >= 0 else 0,
        topic=str(topic),
    )


def _headers(value: dict[str, Any]) -> list[Header]:
    """The original headers: ``headers_base64`` (byte for byte), else the ``headers`` text (older records)."""
    if "headers_base64" in value:
        pairs = value["headers_base64"]
        if not isinstance(pairs, list):
            raise NotReplayableError("its headers_base64 is not a list")
        headers: list[Header] = []
        for pair in pairs:
            if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)):
                raise NotReplayableError("its headers_base64 holds something other than [name, value] pairs")
            name, raw = pair
            try:
                headers.append((name, None if raw is None else base64.b64decode(raw, validate=True)))
            except (binascii.Error, TypeError, ValueError):
                raise NotReplayableError(f"its header {name[:40]!r} is not base64") from None
        return headers
    if value.get("headers_truncated") is True:
        raise NotReplayableError("its headers were cut to fit the DLQ")
    texts = value.get("headers")
    if not isinstance(texts, dict) or not all(isinstance(v, str) for v in texts.values()):
        raise NotReplayableError("its headers are not a JSON object of strings")
    if any("\ufffd" in v for v in texts.values()):
        raise NotReplayableError("a header value was not UTF-8 and this DLQ record has no headers_base64")
    return [(name, text.encode()) for name, text in texts.items()]


def _original_key(record_key: bytes | None, text: Any) -> bytes | None:
    """The original key: the DLQ record's key (its exact bytes), unless that is the ``sha256:``
    stand-in for a key longer than 16 KiB, which the ``key`` text restores when it hashes to it."""
    if record_key is None or text is None:
        if text is not None:
            raise NotReplayableError("the DLQ record has lost its key")
        return record_key
    if not isinstance(text, str):
        raise NotReplayableError("its key is not text")
    whole = text.encode()
    if whole == record_key or not record_key.startswith(_SHA256_PREFIX):
        return record_key  # a key that is not UTF-8 is right in the record key, not in the text
    if hashlib.sha256(whole).hexdigest().encode() == record_key[len(_SHA256_PREFIX) :]:
        return whole
    raise NotReplayableError("its key was replaced by a sha256 in the DLQ and its text does not restore it")


# -- showing --------------------------------------------------------------------------------


def one_line(text: str, limit: int) -> str:
    """``text`` on one line, control characters shown as '?', cut to ``limit`` characters."""
    shown = "".join(c if c.isprintable() else "?" for c in text[: limit + 1])
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"
