"""Restore a partition's store from its changelog (read_committed), with progress.

The fast path. aiokafka's consumer turns every record into a
``ConsumerRecord`` in Python, which alone caps a process at about 300,000
records/s; a restore needs only key, value, offset and timestamp. So the
restore consumer (``restore_consumer``: its connection settings, fetch sizes
and ``end_offsets``) is never assigned the partition; instead its client
sends the fetch requests and the fetched record batches are read as they are
(aiokafka's C record reader), with the read_committed rules applied here:
control batches skipped, batches of aborted transactions dropped.

Records are written undecoded (``PartitionStore.write_raw``) in batches of up
to :data:`WRITE_RECORDS`, each carrying the offset it reaches, so an
interrupted restore resumes there. The only thing read out of an entry is its
``expires_at`` (which bucket it goes to), found by a scan for ``"x":`` rather
than a JSON decode. The worker restores all its partitions at once
(``asyncio.gather``), one consumer each.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import (
    CorruptRecordException,
    KafkaError,
    NotLeaderForPartitionError,
    OffsetOutOfRangeError,
    for_code,
)
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.record.control_record import ABORT_MARKER, ControlRecord
from aiokafka.record.memory_records import MemoryRecords
from prometheus_client import Gauge

from pipeline.errors import BrokerUnavailableError
from pipeline.kafka.clients import restore_consumer
from pipeline.state.decision import Entry
from pipeline.state.store import PartitionStore

log = logging.getLogger(__name__)

WRITE_RECORDS = 20_000  # records per WriteBatch: larger ones stall on RocksDB's memtable flushes
READ_COMMITTED = 1
FETCH_WAIT_MS = 200
RETRIES = 10  # fetches in a row that may fail (leader moves, connection drops) before giving up
RETRY_BACKOFF = 0.5
_EXPIRES = b'"x":'


def expires_at(value: bytes) -> int:
    """The ``expires_at`` of an encoded :class:`Entry`, without decoding the rest.

    ``Entry.encode`` writes ``"x":<integer>,`` before any string field, so the
    first ``"x":`` is the field; anything unexpected falls back to
    :meth:`Entry.decode` (which raises ``ValueError`` on a non-entry).
    """
    start = value.find(_EXPIRES)
    if start >= 0:
        digits = value[start + 4 : value.find(b",", start)]
        if digits.isdigit():
            return int(digits)
    return Entry.decode(value).expires_at


async def restore(
    store: PartitionStore,
    changelog: TopicPartition,
    *,
    bootstrap: str,
    fetch_bytes: int = 32 * 1024 * 1024,
    progress_every: float = 5.0,
    remaining: Gauge | None = None,
) -> int:
    """Replay ``changelog`` from the store's offset to its end; return the records applied.

    ``remaining`` is an already labelled Gauge child, set to the records left
    (0 at the end). Progress goes to the log every ``progress_every`` seconds
    with the rate and an ETA. Tombstones and key-less records are skipped.
    Raises :class:`BrokerUnavailableError` when the broker cannot be reached.
    """
    consumer = restore_consumer(bootstrap, fetch_bytes=fetch_bytes)
    try:
        await consumer.start()
        end = (await consumer.end_offsets([changelog]))[changelog]  # the last stable offset
        start = store.changelog_offset + 1
        if start >= end:
            if remaining is not None:
                remaining.set(0)
            return 0
        replay = _Replay(store, consumer, changelog, fetch_bytes, start, end)
        applied = await replay.run(progress_every, remaining)
    except KafkaError as exc:
        raise BrokerUnavailableError(f"restore {changelog}: {exc!r}") from exc
    finally:
        await consumer.stop()
    store.expire()
    if remaining is not None:
        remaining.set(0)
    return applied


class _Replay:
    """One partition's replay: raw fetches, read_committed filtering, batched raw writes."""

    def __init__(
        self,
        store: PartitionStore,
        consumer: AIOKafkaConsumer,
        changelog: TopicPartition,
        fetch_bytes: int,
        start: int,
        end: int,
    ) -> None:
        self.store = store
        self.consumer = consumer
        self.client: Any = consumer._client  # the consumer's connections; its own fetcher stays idle
        self.changelog = changelog
        self.fetch_bytes = fetch_bytes
        self.partition_bytes = min(fetch_bytes, 16 * 1024 * 1024)  # as restore_consumer
        self.start = start
        self.end = end
        self.position = start  # the next offset to fetch

    async def run(self, progress_every: float, remaining: Gauge | None) -> int:
        """Replay up to ``end``; return the records applied."""
        changelog, start, end = self.changelog, self.start, self.end
        total = end - start
        applied = 0
        started = last_report = time.monotonic()
        log.info("restore %s: replaying offsets %s..%s (%s records)", changelog, start, end - 1, total)
        failures = 0
        while self.position < end:
            try:
                fetched = await self._fetch()
            except KafkaError as exc:
                failures += 1
                if failures > RETRIES:
                    raise
                log.warning("restore %s: fetch failed (%r); retrying", changelog, exc)
                await asyncio.sleep(RETRY_BACKOFF)
                await self.client.force_metadata_update()
                continue
            failures = 0
            if fetched is None:
                continue
            applied += await self._apply(*fetched)
            left = max(end - self.position, 0)
            if remaining is not None:
                remaining.set(left)
            now = time.monotonic()
            if now - last_report >= progress_every:
                last_report = now
                rate = applied / max(now - started, 1e-6)
                log.info(
                    "restore %s: %s/%s records, %.0f records/s, ETA %.0fs",
                    changelog,
                    self.position - start,
                    total,
                    rate,
                    left / max(rate, 1e-6),
                )
        elapsed = time.monotonic() - started
        log.info("restore %s: done, %s records in %.1fs", changelog, applied, elapsed)
        return applied

    async def _fetch(self) -> tuple[MemoryRecords, list[tuple[int, int]]] | None:
        """One fetch from the partition's leader: its records and aborted transactions, or None."""
        tp = self.changelog
        leader = self.client.cluster.leader_for_partition(tp)
        if leader is None or leader == -1:
            await self.client.add_topic(tp.topic)
            leader = self.client.cluster.leader_for_partition(tp)
            if leader is None or leader == -1:
                raise NotLeaderForPartitionError(f"no leader for {tp}")
        request = FetchRequest(
            FETCH_WAIT_MS,
            1,
            self.fetch_bytes,
            READ_COMMITTED,
            [(tp.topic, [(tp.partition, self.position, self.partition_bytes)])],
        )
        response = await self.client.send(leader, request)
        for _topic, partitions in response.topics:
            for partition, error_code, _highwater, *data in partitions:
                if partition != tp.partition:
                    continue
                error = for_code(error_code)
                if error is OffsetOutOfRangeError:
                    await self._skip_to_log_start()
                    return None
                if error_code != 0:
                    raise error(f"fetch {tp} at {self.position}")
                # v4-v10: [lso, (log_start,) aborted, records]; v11: [lso, log_start, aborted, replica, records]
                aborted = data[2] if response.API_VERSION >= 11 else data[-2]
                return MemoryRecords(data[-1]), sorted(aborted or [], key=lambda pair: pair[1])
        return None

    async def _skip_to_log_start(self) -> None:
        """The stored offset fell out of the changelog's retention: start again at its first offset."""
        first = (await self.consumer.beginning_offsets([self.changelog]))[self.changelog]
        if first <= self.position:  # out of range past the end: the log was truncated under us
            raise OffsetOutOfRangeError(f"restore {self.changelog}: offset {self.position} is out of range")
        log.warning(
            "restore %s: offset %s is before the log start %s (retention); continuing there",
            self.changelog,
            self.position,
            first,
        )
        self.position = first

    async def _apply(self, records: MemoryRecords, aborted: list[tuple[int, int]]) -> int:
        """Write one fetch's committed records; return how many were read (tombstones included)."""
        store = self.store
        position = self.position
        stream_time = store.stream_time
        aborted_producers: set[int] = set()
        entries: list[tuple[bytes, bytes, int]] = []
        append = entries.append
        applied = 0
        while records.has_next():
            batch = records.next_batch()
            if not batch.validate_crc():
                raise CorruptRecordException(
                    f"restore {self.changelog}: bad CRC at offset {batch.base_offset}"
                )
            if not _committed(batch, aborted, aborted_producers):
                position = batch.next_offset
                continue
            # The fetch may begin inside its first batch: skip what was already applied.
            batch_records = batch if batch.base_offset >= position else _from(batch, position)
            for record in batch_records:
                applied += 1
                value = record.value
                key = record.key
                if value is None or key is None:
                    continue
                cut = value.find(_EXPIRES)  # expires_at(), inlined: this loop runs for every record
                digits = value[cut + 4 : value.find(b",", cut)]
                append((key, value, int(digits) if cut > 0 and digits.isdigit() else expires_at(value)))
            stream_time = max(stream_time, batch.max_timestamp)
            position = batch.next_offset
            if len(entries) >= WRITE_RECORDS:
                store.write_raw(entries, changelog_offset=position - 1, stream_time=stream_time)
                entries = []
                append = entries.append
                self.position = position
                await asyncio.sleep(0)  # let the other partitions' restores run
        if position - 1 > store.changelog_offset:
            store.write_raw(entries, changelog_offset=position - 1, stream_time=stream_time)
        self.position = max(position, self.position)
        return applied


def _from(batch: Any, position: int) -> Iterator[Any]:
    """The records of ``batch`` at or after ``position``."""
    return (record for record in batch if record.offset >= position)


def _committed(batch: Any, aborted: list[tuple[int, int]], aborted_producers: set[int]) -> bool:
    """Whether ``batch`` holds committed data (read_committed): not a control batch, not an aborted transaction.

    ``aborted`` is the fetch's (producer id, first offset) list, oldest first;
    it and ``aborted_producers`` carry the state from batch to batch, as in
    aiokafka's own fetcher.
    """
    producer = batch.producer_id
    if producer is not None and producer >= 0:
        while aborted and aborted[0][1] <= batch.base_offset:
            aborted_producers.add(aborted.pop(0)[0])
        if batch.is_control_batch:
            if ControlRecord.parse(next(batch).key) == ABORT_MARKER:
                aborted_producers.discard(producer)
            return False
        if batch.is_transactional and producer in aborted_producers:
            return False
    return not batch.is_control_batch
