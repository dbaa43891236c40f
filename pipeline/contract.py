"""The records the pipeline reads and writes, as the contract in DESIGN.md gives them.

Input records: key ``<source>:<id>`` (or empty), value the raw body, headers
``source``, ``received-at`` and ``http-<name>``. Output records: commands,
audit records and DLQ records, all JSON.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import orjson

HTTP_PREFIX = "http-"
SOURCE_HEADER = "source"
RECEIVED_AT_HEADER = "received-at"
IDEMPOTENCY_KEY_HEADER = "idempotency-key"
REROUTED_FROM_HEADER = "rerouted-from"

Headers = Sequence[tuple[str, bytes | None]]  # a consumer may hand over a header without a value


class Delivery:
    """One input record. ``source`` and ``received_at`` are read on construction; the other
    headers are decoded (names lowercased) only when asked for, since most records need none."""

    __slots__ = (
        "_headers",
        "key",
        "offset",
        "partition",
        "raw_headers",
        "received_at",
        "source",
        "timestamp",
        "topic",
        "value",
    )

    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        timestamp: int,
        key: bytes | None,
        value: bytes,
        raw_headers: Headers,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.timestamp = timestamp
        self.key = key
        self.value = value
        self.raw_headers = raw_headers
        self._headers: dict[str, str] | None = None
        source: bytes | None = None
        received: bytes | None = None
        for name, raw in raw_headers:  # a repeated name: the last one wins, as in ``headers``
            if raw is None:
                continue
            lowered = name.lower()
            if lowered == SOURCE_HEADER:
                source = raw
            elif lowered == RECEIVED_AT_HEADER:
                received = raw
        #: The ``source`` header, if any.
        self.source = source.decode("utf-8", "replace") or None if source is not None else None
        #: When the ingress received it (ms), else the record timestamp.
        self.received_at = int(received) if received is not None and received.isdigit() else timestamp

    @classmethod
    def from_record(
        cls,
        topic: str,
        partition: int,
        offset: int,
        timestamp: int,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
    ) -> Delivery:
        """Build from a consumer record's fields."""
        return cls(topic, partition, offset, timestamp, key, value or b"", tuple(headers))

    @classmethod
    def from_records(cls, records: Sequence[Any]) -> list[Delivery]:
        """Build from aiokafka ``ConsumerRecord`` objects."""
        return [
            cls(r.topic, r.partition, r.offset, r.timestamp, r.key, r.value or b"", r.headers or ())
            for r in records
        ]

    @property
    def headers(self) -> Mapping[str, str]:
        """Every header, names lowercased, values decoded as UTF-8 (the last of a repeated name wins)."""
        if self._headers is None:
            self._headers = {
                name.lower(): raw.decode("utf-8", "replace")
                for name, raw in self.raw_headers
                if raw is not None
            }
        return self._headers

    def http_headers(self) -> Mapping[str, str]:
        """The original HTTP headers (``http-<name>`` without the prefix), decoded on first use."""
        return _HttpHeaders(self)


class _HttpHeaders(Mapping[str, str]):
    """A delivery's ``http-*`` headers, decoded only when a provider reads one."""

    __slots__ = ("_decoded", "_delivery")

    def __init__(self, delivery: Delivery) -> None:
        self._delivery = delivery
        self._decoded: dict[str, str] | None = None

    def _all(self) -> dict[str, str]:
        if self._decoded is None:
            cut = len(HTTP_PREFIX)
            self._decoded = {
                name[cut:]: value
                for name, value in self._delivery.headers.items()
                if name.startswith(HTTP_PREFIX)
            }
        return self._decoded

    def __getitem__(self, name: str) -> str:
        return self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


def http_headers_to_kafka(
    http_headers: Mapping[str, str],
    *,
    source: str,
    received_at: int,
    skip: frozenset[str] = frozenset(),
) -> list[tuple[str, bytes]]:
    """Kafka record headers for a webhook, per the contract."""
    headers = [(SOURCE_HEADER, source.encode()), (RECEIVED_AT_HEADER, str(received_at).encode())]
    headers += [
        (HTTP_PREFIX + name.lower(), value.encode("utf-8", "replace"))
        for name, value in http_headers.items()
        if name.lower() not in skip
    ]
    return headers


def command_value(
    *,
    command: str,
    key: str,
    effect_key: str,
    source: str,
    event_type: str | None,
    received_at: int,
    body: bytes,
) -> bytes:
    """A command's JSON value; ``body`` is already-validated JSON and is embedded as is."""
    head = orjson.dumps(
        {
            "command": command,
            "key": key,
            "effect_key": effect_key,
            "source": source,
            "event_type": event_type,
            "received_at": received_at,
        }
    )
    return head[:-1] + b',"event":' + body.strip() + b"}"


def audit_value(
    *,
    key: str | None,
    outcome: str,
    partition: int,
    offset: int,
    received_at: int,
    first_seen_at: int | None,
    source: str | None = None,
    event_type: str | None = None,
    expires_at: int | None = None,
    reason: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> bytes:
    """An audit record's JSON value: one per input record."""
    record: dict[str, Any] = {
        "key": key,
        "outcome": outcome,
        "partition": partition,
        "offset": offset,
        "received_at": received_at,
        "first_seen_at": first_seen_at,
        "source": source,
        "event_type": event_type,
        "expires_at": expires_at,
    }
    if reason is not None:
        record["reason"] = reason
    if extra:
        record.update(extra)
    return orjson.dumps(record)


def dlq_value(delivery: Delivery, *, error: str, reason: str) -> bytes:
    """A DLQ record: the original record (value byte for byte in base64) plus the error and reason."""
    try:
        text: str | None = delivery.value.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return orjson.dumps(
        {
            "error": error,
            "reason": reason,
            "topic": delivery.topic,
            "partition": delivery.partition,
            "offset": delivery.offset,
            "timestamp": delivery.timestamp,
            "key": delivery.key.decode("utf-8", "replace") if delivery.key is not None else None,
            "headers": dict(delivery.headers),
            "value": text,
            "value_base64": base64.b64encode(delivery.value).decode(),
        }
    )


def parse_json_object(body: bytes) -> dict[str, Any] | None:
    """The body as a JSON object, or ``None`` when it is not one."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None
