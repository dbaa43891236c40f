"""The records the pipeline reads and writes, as the contract in docs/design.md gives them.

Input records: key ``<source>:<id>`` (or empty), value the raw body, headers
``source``, ``received-at`` and ``http-<name>``. Output records: commands,
audit records and DLQ records, all JSON.

Everything read from an input record is validated here, at the boundary: a value out
of its range becomes :attr:`Delivery.problem` (a DLQ reason and a message), never an
exception, and nothing read from a record can make an output value unserialisable.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import orjson

from pipeline.errors import InvalidHeaderError
from pipeline.headers import HTTP_PREFIX, RECEIVED_AT_HEADER, REPLAYED_FROM_HEADER, SOURCE_HEADER

Headers = Sequence[tuple[str, bytes | None]]  # a consumer may hand over a header without a value

#: The command a route names when it names none (the command value's ``command``).
DEFAULT_COMMAND = "handle"
#: ``received-at`` is ms since the epoch between 2000-01-01 and 2200-01-01 UTC, in ASCII digits.
RECEIVED_AT_MIN_MS = 946_684_800_000
RECEIVED_AT_MAX_MS = 7_258_118_400_000
RECEIVED_AT_MAX_DIGITS = 15
#: A record timestamp is ms since the epoch, not negative and before 2200-01-01 UTC.
TIMESTAMP_MIN_MS = 0
TIMESTAMP_MAX_MS = RECEIVED_AT_MAX_MS
#: The longest ``source`` header, in bytes.
SOURCE_MAX_BYTES = 256

#: The DLQ reasons of :attr:`Delivery.problem`.
BAD_HEADER = InvalidHeaderError.reason
BAD_TIMESTAMP = "bad-timestamp"

_SHOWN_BYTES = 32  # how much of a bad header value a problem message quotes
_SOURCE_RULE = f"is not UTF-8 of at most {SOURCE_MAX_BYTES} bytes"


class Delivery:
    """One input record. ``source`` and ``received_at`` are read and validated on construction;
    the other headers are decoded (names lowercased) only when asked for, since most records need none.

    ``problem`` is ``None``, or ``(reason, message)`` when a header or the timestamp is out of
    its range (the record then belongs in the DLQ with that reason). The constructor never raises
    on header bytes. A header problem is reported before a timestamp problem.
    """

    __slots__ = (
        "_headers",
        "key",
        "offset",
        "partition",
        "problem",
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
        problem: tuple[str, str] | None = None
        received_at = timestamp
        if received is not None:
            ms = int(received) if len(received) <= RECEIVED_AT_MAX_DIGITS and received.isdigit() else -1
            if RECEIVED_AT_MIN_MS <= ms <= RECEIVED_AT_MAX_MS:
                received_at = ms
            else:
                problem = _bad_header(RECEIVED_AT_HEADER, "is not ms between 2000 and 2200", received)
        text: str | None = None
        if source is not None:
            try:
                text = source.decode("utf-8") if len(source) <= SOURCE_MAX_BYTES else None
            except UnicodeDecodeError:
                text = None
            if text is None:
                problem = problem or _bad_header(SOURCE_HEADER, _SOURCE_RULE, source)
        if problem is None and not TIMESTAMP_MIN_MS <= timestamp <= TIMESTAMP_MAX_MS:
            problem = _bad_timestamp(timestamp)
        #: The ``source`` header, if any (``None`` when empty or invalid).
        self.source = text or None
        #: When the ingress received it (ms), else the record timestamp.
        self.received_at = received_at
        #: ``(DLQ reason, message)`` when a header or the timestamp is out of range.
        self.problem = problem

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


def _bad_header(name: str, rule: str, raw: bytes) -> tuple[str, str]:
    """A header problem: the header, the rule it breaks and its value, cut, on one line."""
    shown = repr(raw) if len(raw) <= _SHOWN_BYTES else f"{raw[:_SHOWN_BYTES]!r}… ({len(raw)} bytes)"
    return BAD_HEADER, f"header {name!r} {rule}: {shown}"


def _bad_timestamp(timestamp: int) -> tuple[str, str]:
    """A timestamp problem (an integer too long for ``str`` is described, not shown)."""
    shown = str(timestamp) if -(10**30) < timestamp < 10**30 else f"a {timestamp.bit_length()}-bit integer"
    return BAD_TIMESTAMP, f"record timestamp {shown} is not ms between 1970 and 2200"


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
    head = dumps_safe(
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
    return dumps_safe(record)


_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1  # what orjson serialises


def dumps_safe(record: dict[str, Any]) -> bytes:
    """``record`` as JSON; an integer beyond 64 bits becomes null and a lone surrogate '?'."""
    try:
        return orjson.dumps(record)
    except orjson.JSONEncodeError:
        return orjson.dumps(json_safe(record))


def json_safe(value: Any) -> Any:
    """``value`` with what orjson refuses replaced: an integer beyond 64 bits, a lone surrogate."""
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, int) and not isinstance(value, bool):
        return value if _INT_MIN <= value <= _INT_MAX else None
    if isinstance(value, dict):
        return {json_safe(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def parse_json_object(body: bytes) -> dict[str, Any] | None:
    """The body as a JSON object, or ``None`` when it is not one."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def replayed_from(delivery: Delivery) -> dict[str, str]:
    """``{"replayed_from": <header>}`` for a record ``pipeline dlq replay`` produced, else empty.

    A scan of the raw header names (exact, as the replay writes it) first: the decoded
    header mapping costs, and only replayed records need it.
    """
    for name, _ in delivery.raw_headers:
        if name == REPLAYED_FROM_HEADER:
            value = delivery.headers.get(REPLAYED_FROM_HEADER)
            return {} if value is None else {"replayed_from": value}
    return {}
