"""The broker model's logs: each topic's configuration, and each partition's log of record batches.

A partition's log keeps the producers' batches as they came (real v2 batches), the transaction
markers as control batches, the last stable offset, the aborted transactions a read_committed fetch
is told of, the idempotent producers' sequence numbers (a retried batch is acknowledged once), and
its segments, which retention deletes by time (``segments.py``).
"""

from __future__ import annotations

import asyncio
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from tests.simulation.codes import (
    INVALID_PRODUCER_EPOCH,
    INVALID_TIMESTAMP,
    MESSAGE_TOO_LARGE,
    NONE,
    OUT_OF_ORDER_SEQUENCE,
)
from tests.simulation.records import ABORT, ProducedBatch, StoredBatch, at_offset, marker, stamped_on_append
from tests.simulation.segments import Segments

NO_LIMIT = 2**63 - 1
LOG_APPEND_TIME = "LogAppendTime"


@dataclass
class TopicConfig:
    max_message_bytes: int = 1_048_588
    timestamp_after_max_ms: int = NO_LIMIT
    timestamp_before_max_ms: int = NO_LIMIT
    timestamp_type: str = "CreateTime"  # or LogAppendTime: the broker stamps what it appends
    cleanup_policy: str = "delete"
    retention_ms: int | None = None  # None: kept for ever (the model deletes only where a topic says)
    segment_bytes: int = 1 << 30

    def as_dict(self) -> dict[str, str]:
        return {
            "max.message.bytes": str(self.max_message_bytes),
            "message.timestamp.after.max.ms": str(self.timestamp_after_max_ms),
            "message.timestamp.before.max.ms": str(self.timestamp_before_max_ms),
            "message.timestamp.type": self.timestamp_type,
            "cleanup.policy": self.cleanup_policy,
            "retention.ms": str(-1 if self.retention_ms is None else self.retention_ms),
            "segment.bytes": str(self.segment_bytes),
        }

    def checks_timestamps(self) -> bool:
        """Whether appends are checked against the timestamp bounds (not with LogAppendTime: the broker
        stamps them itself)."""
        return self.timestamp_type != LOG_APPEND_TIME

    def refuses_timestamp(self, timestamp: int, now_ms: int) -> bool:
        """Whether an append at ``now_ms`` refuses a record of ``timestamp`` (its bounds, KIP-937)."""
        if not self.checks_timestamps():
            return False
        return timestamp > now_ms + self.timestamp_after_max_ms or (
            self.timestamp_before_max_ms != NO_LIMIT and timestamp < now_ms - self.timestamp_before_max_ms
        )


@dataclass
class _ProducerEntry:
    epoch: int
    next_sequence: int = 0
    recent: deque[tuple[int, int, int]] = field(default_factory=lambda: deque(maxlen=5))  # seq, base, count


class PartitionLog:
    """One partition's log."""

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.batches: list[StoredBatch] = []
        self.end = 0  # the high watermark: the next offset
        self.log_start = 0
        self.open_txns: dict[int, int] = {}  # producer id -> first offset of its open transaction
        self.aborted: list[tuple[int, int, int]] = []  # producer id, first offset, marker offset
        self.producers: dict[int, _ProducerEntry] = {}
        self.changed = asyncio.Event()
        self.segments = Segments()
        self.deleted: list[tuple[int, bytes | None]] = []  # (offset, key) of records retention deleted

    def lso(self) -> int:
        return min(self.open_txns.values(), default=self.end)

    def offset_for_time(self, timestamp: int, upper: int) -> tuple[int, int]:
        """ListOffsets by time (``offsets_for_times``): the timestamp and offset of the first record, in log
        order from the log start, stamped at or after ``timestamp`` and below ``upper`` (the log end, or the
        LSO for a read_committed reader); (-1, -1) when there is none. As Kafka's time index: the first
        batch whose largest timestamp reaches it, then its first record that does; markers are no records."""
        for batch in self.batches:
            if batch.base_offset >= upper:
                break
            if batch.control is not None or batch.max_timestamp < timestamp:
                continue
            for record in batch.records:
                if record.timestamp >= timestamp and record.offset < upper:
                    return record.timestamp, record.offset
        return -1, -1

    def _notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def append(self, produced: ProducedBatch, config: TopicConfig, now_ms: int) -> tuple[int, int]:
        """Append one produced batch; return (error code, base offset)."""
        if len(produced.raw) > config.max_message_bytes:
            return MESSAGE_TOO_LARGE, -1
        if any(config.refuses_timestamp(record.timestamp, now_ms) for record in produced.records):
            return INVALID_TIMESTAMP, -1
        pid = produced.producer_id
        if pid >= 0:
            entry = self.producers.get(pid)
            if entry is not None and produced.producer_epoch < entry.epoch:
                return INVALID_PRODUCER_EPOCH, -1
            if entry is None or produced.producer_epoch > entry.epoch:
                if produced.base_sequence != 0:
                    return OUT_OF_ORDER_SEQUENCE, -1
                entry = self.producers[pid] = _ProducerEntry(produced.producer_epoch)
            for seq, base, _count in entry.recent:
                if seq == produced.base_sequence:
                    return NONE, base  # a retry of a batch already written: acknowledged again
            if produced.base_sequence != entry.next_sequence:
                return OUT_OF_ORDER_SEQUENCE, -1
        base = self.end
        if not config.checks_timestamps():
            produced = stamped_on_append(produced, now_ms)
        stored = at_offset(produced, base, now_ms)
        self.batches.append(stored)
        self.segments.appended(base, len(stored.raw), stored.max_timestamp, config.segment_bytes)
        self.end = stored.last_offset + 1
        if pid >= 0:
            entry = self.producers[pid]
            entry.recent.append((produced.base_sequence, base, produced.count))
            entry.next_sequence = produced.base_sequence + produced.count
            if produced.transactional and pid not in self.open_txns:
                self.open_txns[pid] = base
        self._notify()
        return NONE, base

    def append_marker(self, pid: int, epoch: int, kind: int, now_ms: int) -> None:
        offset = self.end
        stored = marker(offset, pid, epoch, kind, now_ms)
        self.batches.append(stored)
        self.segments.appended(offset, len(stored.raw), now_ms, NO_LIMIT)  # a marker never rolls a segment
        self.end = offset + 1
        first = self.open_txns.pop(pid, None)
        if kind == ABORT and first is not None:
            self.aborted.append((pid, first, offset))
        entry = self.producers.get(pid)
        if entry is None or epoch > entry.epoch:
            self.producers[pid] = _ProducerEntry(epoch)
        self._notify()

    def read(self, offset: int, max_bytes: int, *, committed: bool) -> tuple[bytes, list[tuple[int, int]]]:
        """Raw batches from ``offset`` (whole batches, at least one), and the aborted transactions in range."""
        upper = self.lso() if committed else self.end
        chunks: list[bytes] = []
        size = 0
        last = offset - 1
        for batch in self._from(offset):
            if batch.base_offset >= upper:
                break
            if chunks and size + len(batch.raw) > max_bytes:
                break
            chunks.append(batch.raw)
            size += len(batch.raw)
            last = batch.last_offset
        aborted: list[tuple[int, int]] = []
        if committed and chunks:
            aborted = [(pid, first) for pid, first, end in self.aborted if end >= offset and first <= last]
        return b"".join(chunks), aborted

    def _from(self, offset: int) -> list[StoredBatch]:
        batches = self.batches
        lo, hi = 0, len(batches)
        while lo < hi:  # the first batch whose last offset is at or after ``offset``
            mid = (lo + hi) // 2
            if batches[mid].last_offset < offset:
                lo = mid + 1
            else:
                hi = mid
        return batches[lo:]

    def retain(self, now_ms: int, retention_ms: int) -> int | None:
        """Delete the segments retention takes (:class:`~tests.simulation.segments.Segments`); the new log
        start offset, or None when nothing went."""
        start = self.segments.expire(now_ms, retention_ms, self.lso())
        if start is None:
            return None
        kept = self._from(start)
        for batch in self.batches[: len(self.batches) - len(kept)]:
            self.deleted.extend((record.offset, record.key) for record in batch.records)
        self.batches = list(kept)
        self.log_start = start
        self._notify()
        return start

    def caught_up(self, position: int) -> bool:
        """Whether a read_committed reader at ``position`` has nothing left to read: every batch from
        there up to the LSO is a marker or aborted (a consumer's committed offset stays before
        trailing markers, as Kafka's does)."""
        if position > self.lso():
            return False
        return all(r.offset < position for r in self.committed_records())

    def committed_records(self) -> list[Any]:
        """Every record a read_committed reader sees, in log order (for the oracle)."""
        aborted_ranges = {(pid, first): end for pid, first, end in self.aborted}
        aborted_open: dict[int, int] = {}
        upper = self.lso()
        out = []
        for batch in self.batches:
            if batch.base_offset >= upper:
                break
            if batch.control is not None:
                aborted_open.pop(batch.producer_id, None)
                continue
            pid = batch.producer_id
            if batch.transactional:
                if pid not in aborted_open and (pid, batch.base_offset) in aborted_ranges:
                    aborted_open[pid] = aborted_ranges[(pid, batch.base_offset)]
                if pid in aborted_open:
                    continue
            out.extend(batch.records)
        return out


class Topic:
    def __init__(self, name: str, partitions: int, config: TopicConfig) -> None:
        self.name = name
        self.id = uuid.uuid4()
        self.config = config
        self.reconfigured = False  # its limits changed while the workers ran (they learn limits at start)
        self.size_refusals = 0  # batches refused as larger than max.message.bytes
        self.partitions = [PartitionLog(name, p) for p in range(partitions)]
