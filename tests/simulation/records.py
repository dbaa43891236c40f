"""Kafka record batches as the simulated broker stores and serves them: the real v2 bytes.

The producers' batches are kept byte for byte (with the base offset the broker
assigns written in), and transaction markers are real control batches, so the
consumers and the restore read exactly what a broker would send them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field, replace

from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.record.util import calc_crc32c

ATTRIBUTES_OFFSET = 21
CRC_OFFSET = 17
MAX_TIMESTAMP_OFFSET = 35
CONTROL_MASK = 0x20
LOG_APPEND_TIME_MASK = 0x08  # attributes bit 3: the broker stamped the batch (message.timestamp.type)
ABORT, COMMIT = 0, 1


@dataclass(frozen=True, slots=True)
class Record:
    """One record of a stored batch, decoded (for the oracle and the trace)."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    appended: int = 0  # the broker's wall clock (ms) when its batch was appended (for the oracle)

    def header(self, name: str) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None


@dataclass(slots=True)
class StoredBatch:
    """A batch in a partition's log."""

    base_offset: int
    last_offset: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    transactional: bool
    control: int | None  # ABORT or COMMIT for a marker, else None
    max_timestamp: int
    raw: bytes
    records: list[Record] = field(default_factory=list)
    appended: int = 0  # the broker's wall clock (ms) when it was appended

    @property
    def count(self) -> int:
        return self.last_offset - self.base_offset + 1


@dataclass(frozen=True, slots=True)
class ProducedBatch:
    """What a produce request carried for one partition, decoded."""

    raw: bytes
    producer_id: int
    producer_epoch: int
    base_sequence: int
    transactional: bool
    count: int
    records: list[Record]
    max_timestamp: int


def decode_produced(raw: bytes) -> list[ProducedBatch]:
    """The batches of one partition's ``records`` field in a produce request."""
    batches = []
    memory = MemoryRecords(raw)
    start = 0
    while memory.has_next():
        batch = memory.next_batch()
        records = [
            Record(r.offset, r.timestamp, r.key, r.value, tuple((n, v) for n, v in r.headers)) for r in batch
        ]
        size = 12 + struct.unpack_from(">i", raw, start + 8)[0]
        batches.append(
            ProducedBatch(
                raw=raw[start : start + size],
                producer_id=batch.producer_id,
                producer_epoch=batch.producer_epoch,
                base_sequence=batch.base_sequence,
                transactional=batch.is_transactional,
                count=batch.last_offset_delta + 1,
                records=records,
                max_timestamp=batch.max_timestamp,
            )
        )
        start += size
    return batches


def at_offset(produced: ProducedBatch, base_offset: int, appended: int = 0) -> StoredBatch:
    """``produced`` as stored at ``base_offset`` (the broker writes the offset; the CRC does not cover it),
    appended at ``appended`` (ms, the broker's clock)."""
    raw = struct.pack(">q", base_offset) + produced.raw[8:]
    records = [
        Record(base_offset + i, r.timestamp, r.key, r.value, r.headers, appended)
        for i, r in enumerate(produced.records)
    ]
    return StoredBatch(
        base_offset=base_offset,
        last_offset=base_offset + produced.count - 1,
        producer_id=produced.producer_id,
        producer_epoch=produced.producer_epoch,
        base_sequence=produced.base_sequence,
        transactional=produced.transactional,
        control=None,
        max_timestamp=produced.max_timestamp,
        raw=raw,
        records=records,
        appended=appended,
    )


def stamped_on_append(produced: ProducedBatch, now_ms: int) -> ProducedBatch:
    """``produced`` as a topic with ``message.timestamp.type=LogAppendTime`` stores it: the type bit set
    and the batch's max timestamp the broker's clock (the CRC recomputed); every record then reads as
    stamped then, as Kafka's clients read such a batch."""
    raw = bytearray(produced.raw)
    attributes = struct.unpack_from(">h", raw, ATTRIBUTES_OFFSET)[0] | LOG_APPEND_TIME_MASK
    struct.pack_into(">h", raw, ATTRIBUTES_OFFSET, attributes)
    struct.pack_into(">q", raw, MAX_TIMESTAMP_OFFSET, now_ms)
    struct.pack_into(">I", raw, CRC_OFFSET, calc_crc32c(bytes(raw[ATTRIBUTES_OFFSET:])))
    records = [Record(r.offset, now_ms, r.key, r.value, r.headers, r.appended) for r in produced.records]
    return replace(produced, raw=bytes(raw), records=records, max_timestamp=now_ms)


def plain_batch(
    records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]],
    *,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
) -> bytes:
    """A batch of ``(key, value, headers, timestamp)`` records (base offset 0, for the broker to set)."""
    builder = DefaultRecordBatchBuilder(2, 0, 0, producer_id, producer_epoch, base_sequence, 16 * 1024 * 1024)
    for i, (key, value, headers, timestamp) in enumerate(records):
        builder.append(i, timestamp=timestamp, key=key, value=value, headers=headers)
    return bytes(builder.build())


def marker(offset: int, producer_id: int, producer_epoch: int, kind: int, timestamp: int) -> StoredBatch:
    """A transaction marker (a control batch of one record) at ``offset``."""
    builder = DefaultRecordBatchBuilder(2, 0, 1, producer_id, producer_epoch, -1, 1024)
    key = struct.pack(">hh", 0, kind)
    value = struct.pack(">hi", 0, 0)
    builder.append(0, timestamp=timestamp, key=key, value=value, headers=[])
    raw = bytearray(builder.build())
    struct.pack_into(">q", raw, 0, offset)
    attributes = struct.unpack_from(">h", raw, ATTRIBUTES_OFFSET)[0] | CONTROL_MASK
    struct.pack_into(">h", raw, ATTRIBUTES_OFFSET, attributes)
    struct.pack_into(">I", raw, CRC_OFFSET, calc_crc32c(bytes(raw[ATTRIBUTES_OFFSET:])))
    return StoredBatch(
        base_offset=offset,
        last_offset=offset,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=-1,
        transactional=True,
        control=kind,
        max_timestamp=timestamp,
        raw=bytes(raw),
        appended=timestamp,
    )
