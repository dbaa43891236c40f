"""The records the pipeline reads and writes, as the contract in docs/design.md gives them.

Input records: key ``<source>:<id>`` (or empty), value the raw body, headers
``source``, ``received-at`` and ``http-<name>``. Output records: commands,
audit records and DLQ records, all JSON.

Everything read from an input record is validated here, at the boundary: a value out
of its range becomes :attr:`Delivery.problem` (a DLQ reason and a message), never an
exception, and nothing read from a record can make an output value unserialisable.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import orjson

from pipeline.errors import InvalidHeaderError

HTTP_PREFIX = "http-"
SOURCE_HEADER = "source"
RECEIVED_AT_HEADER = "received-at"
IDEMPOTENCY_KEY_HEADER = "idempotency-key"
REROUTED_FROM_HEADER = "rerouted-from"

Headers = Sequence[tuple[str, bytes | None]]  # a consumer may hand over a header without a value

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
    head = _dumps(
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
    return _dumps(record)


#: Bytes a record takes on the wire beyond its key, value and headers, at most (aiokafka's
#: batch header and record overhead, and the length prefixes of key, value and header count).
RECORD_OVERHEAD = 128
_HEADER_OVERHEAD = 10  # the length prefixes of a header's name and value


def record_size(key: bytes | None, value: bytes, headers: Headers) -> int:
    """An upper bound of a record's size on the wire, for size checks before sending it."""
    size = RECORD_OVERHEAD + len(value) + (len(key) if key is not None else 0)
    for name, raw in headers:
        size += _HEADER_OVERHEAD + len(name.encode("utf-8", "surrogatepass"))
        if raw is not None:
            size += len(raw)
    return size


#: The longest ``error`` of a DLQ record, in characters.
ERROR_MAX_CHARS = 1000
#: ``dlq_value`` leaves this much of ``max_bytes`` for Kafka's per-record overhead.
DLQ_HEADROOM = 1024
#: The smallest ``max_bytes`` whose DLQ records ``dlq_value`` keeps within bounds.
DLQ_MIN_MAX_BYTES = 4096
# in a truncated DLQ record, the most each text takes once JSON-encoded (quotes included)
_ERROR_CAP, _REASON_CAP, _TOPIC_CAP, _KEY_CAP, _HEADER_NAME_CAP = 1024, 128, 320, 512, 128
_HEADERS_FLAG = len(',"headers_truncated":true')


def dlq_value(delivery: Delivery, *, error: str, reason: str, max_bytes: int | None = None) -> bytes:
    """A DLQ record: the original record (value byte for byte in base64) plus the error and reason.

    ``error`` is cut to :data:`ERROR_MAX_CHARS`. With ``max_bytes`` (at least
    :data:`DLQ_MIN_MAX_BYTES`), the value is at most ``max_bytes - DLQ_HEADROOM - len(key)``
    bytes, so it fits a record of ``max_bytes`` keyed by the delivery's key (a key longer than
    ``max_bytes - DLQ_MIN_MAX_BYTES`` does not fit, whatever the value). A record that would be
    larger drops the value text, cuts ``value_base64`` to a prefix of the body and adds
    ``truncated``, ``value_bytes`` and ``value_sha256`` (of the whole body); when the headers
    are too large too, their names and values are cut (``headers_truncated``), and an overlong
    key text is cut (``key_truncated``).
    """
    if len(error) > ERROR_MAX_CHARS:
        error = error[: ERROR_MAX_CHARS - 1] + "…"
    body = delivery.value
    record: dict[str, Any] = {
        "error": error,
        "reason": reason,
        "topic": delivery.topic,
        "partition": delivery.partition,
        "offset": delivery.offset,
        "timestamp": delivery.timestamp,
        "key": delivery.key.decode("utf-8", "replace") if delivery.key is not None else None,
        "headers": dict(delivery.headers),
    }
    budget: int | None = None
    if max_bytes is not None:
        budget = max(max_bytes - len(delivery.key or b""), DLQ_MIN_MAX_BYTES) - DLQ_HEADROOM
        if (len(body) + 2) // 3 * 4 > budget:  # the base64 alone is too large: no need to try
            return _dlq_truncated(record, body, budget)
    try:
        text: str | None = body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    full = _dumps({**record, "value": text, "value_base64": base64.b64encode(body).decode()})
    if budget is None or len(full) <= budget:
        return full
    return _dlq_truncated(record, body, budget)


def _dlq_truncated(record: dict[str, Any], body: bytes, budget: int) -> bytes:
    """The DLQ record of ``dlq_value`` cut to at most ``budget`` bytes (at least 3,072)."""
    record = _json_safe(record)
    key = record["key"]
    out: dict[str, Any] = {
        "error": _fit(record["error"], _ERROR_CAP),
        "reason": _fit(record["reason"], _REASON_CAP),
        "topic": _fit(record["topic"], _TOPIC_CAP),
        "partition": record["partition"],
        "offset": record["offset"],
        "timestamp": record["timestamp"],
        "key": None if key is None else _fit(key, _KEY_CAP),
        "headers": {},
        "value": None,
        "value_base64": "",
        "truncated": True,
        "value_bytes": len(body),
        "value_sha256": hashlib.sha256(body).hexdigest(),
    }
    if out["key"] != key:
        out["key_truncated"] = True
    skeleton = len(orjson.dumps(out))
    headers: dict[str, str] = record["headers"]
    entries = len(orjson.dumps(headers)) - 2  # without the braces the skeleton has
    if skeleton + entries <= budget:
        out["headers"] = headers
    else:
        out["headers"] = _fit_headers(headers, budget - skeleton - _HEADERS_FLAG)
        out["headers_truncated"] = True
    room = budget - len(orjson.dumps(out))
    out["value_base64"] = base64.b64encode(body[: max(room, 0) // 4 * 3]).decode()
    result = orjson.dumps(out)
    if len(result) > budget:  # not reached (the sizes above are exact); the bound is the contract
        out.update(headers={}, value_base64="", headers_truncated=True)
        result = orjson.dumps(out)
    return result


def _fit_headers(headers: Mapping[str, str], room: int) -> dict[str, str]:
    """Headers whose JSON entries take at most ``room`` bytes: the smallest are kept whole first,
    the others share what is left, names and values cut; a header with no room left is dropped."""
    by_size = sorted(enumerate(headers.items()), key=lambda e: len(e[1][0]) + len(e[1][1]))
    kept: list[tuple[int, str, str]] = []
    left = len(by_size)
    for index, (name, value) in by_size:
        share = room // left  # each entry takes at most its share, so ``room`` stays >= 0
        left -= 1
        if share < 6:  # not even '"":"",'
            continue
        cut_name = _fit(name, min(_HEADER_NAME_CAP, share - 4))
        name_bytes = len(orjson.dumps(cut_name))
        cut_value = _fit(value, share - name_bytes - 2)
        room -= name_bytes + len(orjson.dumps(cut_value)) + 2
        kept.append((index, cut_name, cut_value))
    kept.sort()
    return {name: value for _, name, value in kept}


def _fit(text: str, cap: int) -> str:
    """The longest prefix of ``text`` whose JSON encoding (quotes included) takes at most ``cap`` bytes."""
    text = text[:cap]  # a character takes at least a byte
    if len(orjson.dumps(text)) <= cap:
        return text
    low, high = 0, len(text)  # text[:low] fits, text[:high] does not
    while high - low > 1:
        middle = (low + high) // 2
        if len(orjson.dumps(text[:middle])) <= cap:
            low = middle
        else:
            high = middle
    return text[:low]


_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1  # what orjson serialises


def _dumps(record: dict[str, Any]) -> bytes:
    """``record`` as JSON; an integer beyond 64 bits becomes null and a lone surrogate '?'."""
    try:
        return orjson.dumps(record)
    except orjson.JSONEncodeError:
        return orjson.dumps(_json_safe(record))


def _json_safe(value: Any) -> Any:
    """``value`` with what orjson refuses replaced: an integer beyond 64 bits, a lone surrogate."""
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, int) and not isinstance(value, bool):
        return value if _INT_MIN <= value <= _INT_MAX else None
    if isinstance(value, dict):
        return {_json_safe(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def parse_json_object(body: bytes) -> dict[str, Any] | None:
    """The body as a JSON object, or ``None`` when it is not one."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None
