"""``pipeline dlq list``'s lines: one DLQ record per line, as text or JSON, and the summary.

The records themselves (choosing, rebuilding the original) are the read model
:mod:`pipeline.records.dlq`, shared with the console; its names are re-exported
here for ``pipeline/ops/dlq.py`` and the CLI.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

import orjson

from pipeline.records.dlq import (
    DLQ_REASONS,
    KEY_SHOWN,
    DlqEntry,
    DlqFilter,
    NotReplayableError,
    Original,
    one_line,
    parse_entry,
    parse_since,
    reasons_of,
    rebuild,
    records_of,
)

__all__ = [
    "DLQ_REASONS",
    "ERROR_SHOWN",
    "KEY_SHOWN",
    "DlqEntry",
    "DlqFilter",
    "NotReplayableError",
    "Original",
    "entry_json",
    "entry_line",
    "one_line",
    "parse_entry",
    "parse_since",
    "reasons_of",
    "rebuild",
    "records_of",
    "summary",
]

#: How many characters of the error a ``dlq list`` line shows.
ERROR_SHOWN = 100


def _time(ms: int) -> str:
    try:
        return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, OSError, ValueError):
        return str(ms)


def entry_line(entry: DlqEntry) -> str:
    """One ``dlq list`` line: DLQ partition:offset, time, reason, key, error (cut)."""
    key = one_line(entry.key, KEY_SHOWN) if entry.key is not None else "-"
    mark = " [truncated]" if entry.truncated else ""
    error = one_line(entry.error, ERROR_SHOWN)
    return f"{entry.partition}:{entry.offset}  {_time(entry.timestamp)}  {entry.reason}  {key}  {error}{mark}"


def entry_json(entry: DlqEntry) -> bytes:
    """One ``dlq list --json`` line."""
    value = entry.value
    return orjson.dumps(
        {
            "dlq_partition": entry.partition,
            "dlq_offset": entry.offset,
            "timestamp": entry.timestamp,
            "reason": entry.reason,
            "key": entry.key,
            "error": entry.error,
            "topic": value.get("topic"),
            "partition": value.get("partition"),
            "offset": value.get("offset"),
            "truncated": entry.truncated,
        }
    )


def summary(counts: Counter[str]) -> str:
    """``N records: reason n, ...``, most frequent reason first."""
    total = sum(counts.values())
    parts = ", ".join(f"{reason} {n}" for reason, n in sorted(counts.items(), key=lambda rc: (-rc[1], rc[0])))
    return f"{total} record{'' if total == 1 else 's'}" + (f": {parts}" if parts else "")
