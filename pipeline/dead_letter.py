"""DLQ records: a DLQ record always fits its topic.

A DLQ record carries the original record (its body twice: as text and in
base64; its headers as text and, byte for byte, in ``headers_base64``) with the
error and the reason, so ``pipeline dlq replay`` can produce the original again
(marked with :data:`REPLAYED_FROM_HEADER`). When that would not fit the DLQ
topic's limit, the body is truncated and the record carries its length and
sha256 instead (``truncated``, ``value_bytes``, ``value_sha256``), so bad input
can never block a partition.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from typing import Any

import orjson

from pipeline.contract import Delivery, Headers, dumps_safe, json_safe

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
    larger drops the value text and ``headers_base64``, cuts ``value_base64`` to a prefix of the body and adds
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
    full = dumps_safe(
        {
            **record,
            "value": text,
            "value_base64": base64.b64encode(body).decode(),
            "headers_base64": headers_base64(delivery.raw_headers),
        }
    )
    if budget is None or len(full) <= budget:
        return full
    return _dlq_truncated(record, body, budget)


def headers_base64(headers: Headers) -> list[tuple[str, str | None]]:
    """Every header as ``(name, base64 of the value or None)``: order, case and repeats kept."""
    return [(name, None if raw is None else base64.b64encode(raw).decode()) for name, raw in headers]


def _dlq_truncated(record: dict[str, Any], body: bytes, budget: int) -> bytes:
    """The DLQ record of ``dlq_value`` cut to at most ``budget`` bytes (at least 3,072)."""
    record = json_safe(record)
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
