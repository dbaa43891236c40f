"""Reading the DLQ for the console: every record up to a snapshot, chosen records, one record.

All reads are ``read_committed`` and bounded: :func:`scan` reads each partition
from its beginning (or the first record at ``since``) up to the snapshot's end
(``upto``), or to the end it had when the scan started, which it reports so a
page can carry it. A partition or offset the topic does not have is known
from the metadata and the partition's bounds, at once (:class:`NoSuchRecordError`),
never by waiting for a fetch.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Collection, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from pipeline.errors import PipelineError
from pipeline.kafka.admin import partition_count
from pipeline.kafka.clients import started_reader
from pipeline.kafka.internals import stop_consumer
from pipeline.records.dlq import DlqEntry, parse_entry
from pipeline.records.key_history import read_at

IDLE_S = 5.0  # a partition that yields nothing this long (below its end) is given up


class NoSuchRecordError(PipelineError):
    """The DLQ has no such partition or offset (or retention removed it)."""

    reason = "no-such-record"


@dataclass
class Snapshot:
    """The offsets a scan covered: from ``starts`` up to ``ends`` (exclusive), per partition."""

    starts: dict[int, int] = field(default_factory=dict)
    ends: dict[int, int] = field(default_factory=dict)


async def _count(bootstrap: str, topic: str) -> int:
    count = await partition_count(bootstrap, topic)
    if count is None:
        raise PipelineError(f"topic {topic} does not exist: run 'pipeline topics create' first")
    return count


@asynccontextmanager
async def reading(
    bootstrap: str, topic: str, partitions: Iterable[int]
) -> AsyncIterator[tuple[AIOKafkaConsumer, list[TopicPartition], dict[TopicPartition, int]]]:
    """A read_committed consumer assigned ``partitions`` of ``topic``, those partitions, and their ends now."""
    consumer = await started_reader(bootstrap)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        yield consumer, tps, (await consumer.end_offsets(tps) if tps else {})
    finally:
        await stop_consumer(consumer)


async def scan(
    bootstrap: str,
    topic: str,
    snapshot: Snapshot,
    *,
    since_ms: int | None = None,
    upto: Mapping[int, int] | None = None,
) -> AsyncIterator[DlqEntry]:
    """Every committed record of ``topic`` in ``snapshot``'s bounds, partition by partition in
    offset order; ``snapshot`` is filled before the first record is yielded."""
    count = await _count(bootstrap, topic)
    async with reading(bootstrap, topic, range(count)) as (consumer, tps, lasts):
        firsts = await consumer.beginning_offsets(tps)
        found = await consumer.offsets_for_times(dict.fromkeys(tps, since_ms)) if since_ms is not None else {}
        for tp in tps:
            end = lasts[tp] if upto is None else min(upto.get(tp.partition, 0), lasts[tp])
            at = found.get(tp)
            start = firsts[tp] if since_ms is None else (at.offset if at is not None else end)
            snapshot.starts[tp.partition], snapshot.ends[tp.partition] = start, max(end, start)
        for tp in tps:
            async for record in _read(
                consumer, tp, snapshot.starts[tp.partition], snapshot.ends[tp.partition]
            ):
                yield record


async def read_range(
    consumer: AIOKafkaConsumer, tp: TopicPartition, start: int, end: int
) -> AsyncIterator[ConsumerRecord[bytes, bytes]]:
    """The committed records of ``tp`` (assigned to ``consumer``) at offsets ``start`` to ``end``
    (exclusive); a partition that yields nothing for :data:`IDLE_S` below ``end`` is given up."""
    if start >= end:
        return
    consumer.seek(tp, start)
    last = time.monotonic()
    while await consumer.position(tp) < end and time.monotonic() - last < IDLE_S:
        batch = await consumer.getmany(tp, timeout_ms=300)
        for record in batch.get(tp, []):
            last = time.monotonic()
            if record.offset >= end:
                return
            yield record


async def _read(
    consumer: AIOKafkaConsumer, tp: TopicPartition, start: int, end: int
) -> AsyncIterator[DlqEntry]:
    async for record in read_range(consumer, tp, start, end):
        yield parse_entry(tp.partition, record.offset, record.timestamp, record.key, record.value)


async def read_records(
    bootstrap: str, topic: str, wanted: Collection[tuple[int, int]]
) -> AsyncIterator[DlqEntry]:
    """The DLQ records at ``wanted`` (``(partition, offset)``) that exist, partition by partition; each
    partition is read once, from the first offset wanted to the last."""
    count = await _count(bootstrap, topic)
    by_partition: dict[int, set[int]] = {}
    for partition, offset in wanted:
        if 0 <= partition < count and offset >= 0:
            by_partition.setdefault(partition, set()).add(offset)
    if not by_partition:
        return
    async with reading(bootstrap, topic, by_partition) as (consumer, tps, lasts):
        for tp in tps:
            offsets = by_partition[tp.partition]
            async for entry in _read(consumer, tp, min(offsets), min(max(offsets) + 1, lasts[tp])):
                if entry.offset in offsets:
                    yield entry


async def read_record(bootstrap: str, topic: str, partition: int, offset: int) -> DlqEntry:
    """The DLQ record at ``partition``/``offset``; :class:`NoSuchRecordError` at once when there is none."""
    where = f"{topic}:{partition}:{offset}"
    count = await _count(bootstrap, topic)
    if not 0 <= partition < count:
        raise NoSuchRecordError(f"no record at {where}: {topic} has partitions 0 to {count - 1}")
    stored = await read_at(bootstrap, topic, partition, offset)
    if stored is None:
        raise NoSuchRecordError(
            f"no record at {where}: past the partition's end, removed by retention, or not a record"
        )
    return parse_entry(partition, offset, stored.timestamp, stored.key, stored.value)
