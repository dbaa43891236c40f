"""Restore a partition's store from its changelog (read_committed), with progress.

The fast path. aiokafka's consumer turns every record into a
``ConsumerRecord`` in Python, which alone caps a process at about 300,000
records/s; a restore needs only key, value, offset and timestamp. So the
changelog is read with raw fetches (:class:`~pipeline.kafka.changelog.ChangelogReader`)
and the fetched record batches are read as they are (aiokafka's C record
reader), with the read_committed rules applied here: control batches skipped,
batches of aborted transactions dropped.

Records are written undecoded (``PartitionStore.write_raw``) in batches of up
to :data:`WRITE_RECORDS`, each carrying the offset it reaches, so an
interrupted restore resumes there. The only thing read out of an entry is its
``expires_at`` (which bucket it goes to), found by a scan for ``"x":`` rather
than a JSON decode.

The store is a cache of its changelog: a store whose position lies beyond the
changelog's end caches another log (:class:`~pipeline.errors.StoreStaleError`;
the caller rebuilds it). Restores share a :class:`RestoreBudget` in bytes, so a
worker given many partitions at once does not fetch for all of them at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import CorruptRecordException, KafkaError, OffsetOutOfRangeError
from aiokafka.record.control_record import ABORT_MARKER, ControlRecord
from aiokafka.record.memory_records import MemoryRecords
from prometheus_client import Gauge

from pipeline.errors import BrokerUnavailableError, StoreStaleError
from pipeline.kafka.changelog import ChangelogReader
from pipeline.state.decision import Entry
from pipeline.state.store import PartitionStore

log = logging.getLogger(__name__)

WRITE_RECORDS = 20_000  # records per WriteBatch: larger ones stall on RocksDB's memtable flushes
RETRIES = 10  # fetches in a row that may fail (leader moves, connection drops) before giving up
RETRY_BACKOFF = 0.5
_EXPIRES = b'"x":'


class RestoreBudget:
    """The bytes all of a worker's restores may fetch at once; each restore holds its fetch size."""

    def __init__(self, total_bytes: int) -> None:
        self.total = total_bytes
        self._free = total_bytes
        self._changed = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def hold(self, size: int) -> AsyncIterator[None]:
        """Wait until ``size`` bytes (at most the whole budget) are free, and hold them."""
        size = min(size, self.total)
        async with self._changed:
            await self._changed.wait_for(lambda: self._free >= size)
            self._free -= size
        try:
            yield
        finally:
            async with self._changed:
                self._free += size
                self._changed.notify_all()


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
    budget: RestoreBudget | None = None,
) -> int:
    """Replay ``changelog`` from the store's offset to its end; return the records applied.

    ``remaining`` is an already labelled Gauge child, set to the records left
    (0 at the end). Progress goes to the log every ``progress_every`` seconds
    with the rate and an ETA. Tombstones and key-less records are skipped.
    Raises :class:`BrokerUnavailableError` when the broker cannot be reached,
    and :class:`StoreStaleError` when the store is ahead of the changelog.
    """
    holding = budget.hold(fetch_bytes) if budget is not None else contextlib.nullcontext()
    async with holding:
        reader = ChangelogReader(bootstrap, fetch_bytes=fetch_bytes)
        try:
            await reader.start()
            end = await reader.end(changelog)  # the last stable offset
            start = store.changelog_offset + 1
            if start > end:
                raise StoreStaleError(
                    f"store {store.path} is at changelog offset {start - 1}, beyond the end of "
                    f"{changelog.topic}-{changelog.partition} ({end}): it caches another log"
                )
            if start == end:
                if remaining is not None:
                    remaining.set(0)
                return 0
            replay = _Replay(store, reader, changelog, start, end)
            applied = await replay.run(progress_every, remaining)
        except KafkaError as exc:
            raise BrokerUnavailableError(f"restore {changelog}: {exc!r}") from exc
        finally:
            await reader.stop()
    store.expire()
    if remaining is not None:
        remaining.set(0)
    return applied


class _Replay:
    """One partition's replay: raw fetches, read_committed filtering, batched raw writes."""

    def __init__(
        self, store: PartitionStore, reader: ChangelogReader, changelog: TopicPartition, start: int, end: int
    ) -> None:
        self.store = store
        self.reader = reader
        self.changelog = changelog
        self.start = start
        self.end = end
        self.position = start  # the next offset to fetch

    async def run(self, progress_every: float, remaining: Gauge | None) -> int:
        """Replay up to ``end``; return the records applied."""
        changelog, start, end = self.changelog, self.start, self.end
        total = end - start
        applied = 0
        started = last_report = time.monotonic()
        log.info("restore %s: reading offsets %s..%s", changelog, start, end - 1)
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
                await self.reader.refresh()
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
                    "restore %s: %s/%s offsets, %.0f records/s, ETA %.0fs",
                    changelog,
                    self.position - start,
                    total,
                    rate,
                    left / max(rate, 1e-6),
                )
        elapsed = time.monotonic() - started
        log.info(
            "restore %s: done in %.1fs: %s records applied from offsets %s..%s "
            "(the others were transaction markers or aborted)",
            changelog,
            elapsed,
            applied,
            start,
            end - 1,
        )
        return applied

    async def _fetch(self) -> tuple[MemoryRecords, list[tuple[int, int]]] | None:
        """One fetch: its records and aborted transactions, or None."""
        tp = self.changelog
        fetched = await self.reader.fetch(tp, self.position)
        if fetched.error is OffsetOutOfRangeError:
            await self._skip_to_log_start()
            return None
        if fetched.error is not None:
            raise fetched.error(f"fetch {tp} at {self.position}")
        if fetched.records is None:
            return None
        return fetched.records, fetched.aborted

    async def _skip_to_log_start(self) -> None:
        """The stored offset fell out of the changelog's retention: start again at its first offset."""
        first = await self.reader.beginning(self.changelog)
        if first <= self.position:  # out of range past the end: the log was truncated under us
            raise StoreStaleError(
                f"restore {self.changelog}: offset {self.position} is beyond the changelog's end"
            )
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
