"""Reading the DLQ for the console: every record up to a snapshot, chosen records, one record.

All reads are ``read_committed`` and bounded: :func:`scan` reads each partition
from its beginning (or the first record at ``since``) up to the snapshot's end
(``upto``), or to the end it had when the scan started, which it reports so a
page can carry it. A partition or offset the topic does not have is known
from the metadata and the partition's bounds, at once (:class:`NoSuchRecordError`),
never by waiting for a fetch.

A read never takes a silence for the end (issue 34, item 2, for ``dlq replay``): a
partition whose position stops short of its end for :data:`IDLE_S` (the broker away, a
leader election) raises :class:`~pipeline.kafka.bounded_read.ReadIncompleteError`, a
503 page; before, the read ended there, a page showed fewer records, and a redrive
marked the records it had not read "no longer in the DLQ" (not replayable).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Collection, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from pipeline.errors import PipelineError
from pipeline.kafka.admin import partition_count
from pipeline.kafka.bounded_read import Reader, ReadIncompleteError
from pipeline.kafka.clients import started_reader
from pipeline.kafka.internals import stop_consumer
from pipeline.records.dlq import DlqEntry, parse_entry
from pipeline.records.key_history import read_at

IDLE_S = 30.0  # a partition whose position stays short of its end this long: the read raises


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
    consumer: Reader, tp: TopicPartition, start: int, end: int, *, idle: float = IDLE_S
) -> AsyncIterator[ConsumerRecord[bytes, bytes]]:
    """The committed records of ``tp`` (assigned to ``consumer``) at offsets ``start`` to ``end``
    (exclusive). Progress is the consumer's position (it moves past transaction markers and aborted
    records, which give no record); short of ``end`` and not moving for ``idle`` seconds, the read
    raises :class:`ReadIncompleteError` naming the partition and how far it got."""
    if start >= end:
        return
    consumer.seek(tp, start)
    position, moved = start, time.monotonic()
    while position < end:
        if time.monotonic() - moved >= idle:
            raise ReadIncompleteError(tp.topic, {tp.partition: (position, end)}, idle, None)
        batch = await consumer.getmany(tp, timeout_ms=300)
        for record in batch.get(tp, []):
            if record.offset >= end:
                return
            yield record
        now_at = await consumer.position(tp)
        if now_at > position:
            position, moved = now_at, time.monotonic()


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
