"""Shared by the alternative contenders: the command they produce for a first sighting.

Every alternative does the same per-record work the worker does for a first
copy: parse the JSON body and wrap it in the command envelope of the contract
(``{"command", "key", "effect_key", "source", "event_type", "received_at",
"event"}``), keyed by the idempotency key. They skip what only the worker
does (the audit record per delivery, signature checks, DLQ routing).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson


def header(headers: Any, name: str) -> bytes | None:
    """A header's value from aiokafka (pairs), faust (a mapping) or quix (pairs or None) headers."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
    for key, value in pairs:
        if key == name:
            return value if isinstance(value, bytes) else str(value).encode()
    return None


def command(key: bytes, body: bytes, headers: Any) -> bytes:
    """The command record value for the first copy of ``key``."""
    event = orjson.loads(body)
    text = key.decode()
    received = header(headers, "received-at")
    source = header(headers, "source")
    return orjson.dumps(
        {
            "command": "handle",
            "key": text,
            "effect_key": text,
            "source": source.decode() if source else text.split(":", 1)[0],
            "event_type": event.get("type"),
            "received_at": int(received) if received else None,
            "event": event,
        }
    )
