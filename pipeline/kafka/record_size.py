"""The size of a record on the wire, bounded from above, for size checks before sending it.

A record the broker would refuse as too large fails its whole transaction, so the worker
checks each output (and each DLQ record) against its topic's ``max.message.bytes`` first.
``tests/unit/kafka/test_record_size.py`` keeps the bound above aiokafka's own estimate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

#: Bytes a record takes on the wire beyond its key, value and headers, at most (aiokafka's
#: batch header and record overhead, and the length prefixes of key, value and header count).
RECORD_OVERHEAD: Final = 128
_HEADER_OVERHEAD: Final = 10  # the length prefixes of a header's name and value


def record_size(key: bytes | None, value: bytes, headers: Sequence[tuple[str, bytes | None]]) -> int:
    """An upper bound of a record's size on the wire."""
    size = RECORD_OVERHEAD + len(value) + (len(key) if key is not None else 0)
    for name, raw in headers:
        size += _HEADER_OVERHEAD + len(name.encode("utf-8", "surrogatepass"))
        if raw is not None:
            size += len(raw)
    return size
