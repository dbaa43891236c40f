"""Replaying a changelog partition into a store: the one path that writes fetched changelog records.

Restores (:func:`pipeline.state.restore.restore`) and standby replicas
(:func:`pipeline.state.restore.catch_up`) both replay through :class:`Replay`, so
a store is written the same way whoever holds it.

The fast path. aiokafka's consumer turns every record into a
``ConsumerRecord`` in Python, which alone caps a process at about 300,000
records/s; a replay needs only key, value, offset and timestamp. So the
changelog is read with raw fetches (:class:`~pipeline.kafka.changelog.ChangelogReader`)
and the fetched record batches are read as they are (aiokafka's C record
reader), with the read_committed rules applied here: control batches skipped,
batches of aborted transactions dropped.

Pipelined. With ``prefetch``, the next fetch is sent as soon as a fetch's
batches are counted (before its records are read and written), so the broker
reads and sends it while this process writes the previous one.

Records are written undecoded (``PartitionStore.write_raw``) in batches of up
to :data:`WRITE_RECORDS`, each carrying the offset it reaches, so an
interrupted replay resumes there. The only things read out of an entry are its
``expires_at`` (which bucket it goes to) and its ``last_seen`` (stream time),
found by scans for ``"x":`` and ``"l":`` rather than a JSON decode.

Stream time comes from the entries, never from the record timestamps: a
changelog record is stamped when it is written (so its retention runs from the
claim), and on a topic with ``message.timestamp.type=LogAppendTime`` the broker
stamps it again; either time would run ahead of the active copy's stream time,
and a replayed store would expire keys the active copy still holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import CorruptRecordException, KafkaError, OffsetOutOfRangeError
from aiokafka.record.control_record import ABORT_MARKER, ControlRecord
from prometheus_client import Gauge

from pipeline.errors import StoreStaleError
from pipeline.kafka.changelog import ChangelogReader
from pipeline.kafka.internals import RawFetch
from pipeline.state.decision import Entry
from pipeline.state.store import PartitionStore

log = logging.getLogger(__name__)

WRITE_RECORDS = 20_000  # records per WriteBatch: larger ones stall on RocksDB's memtable flushes
RETRIES = 10  # fetches in a row that may fail (leader moves, connection drops) before giving up
RETRY_BACKOFF = 0.5
_EXPIRES = b'"x":'
_LAST_SEEN = b'"l":'

Hold = Callable[[], contextlib.AbstractAsyncContextManager[None]]  # held around each fetch and its writes


def _integer_field(value: bytes, marker: bytes) -> int | None:
    """The integer after ``marker`` (``"x":``) in an encoded :class:`Entry`, or None when it is not there
    as ``Entry.encode`` writes it (``"x":<integer>,``, before any string field)."""
    start = value.find(marker)
    if start >= 0:
        digits = value[start + len(marker) : value.find(b",", start)]
        if digits.isdigit():
            return int(digits)
    return None


def expires_at(value: bytes) -> int:
    """The ``expires_at`` of an encoded :class:`Entry`, without decoding the rest; anything unexpected
    falls back to :meth:`Entry.decode` (which raises ``ValueError`` on a non-entry)."""
    found = _integer_field(value, _EXPIRES)
    return Entry.decode(value).expires_at if found is None else found


def last_seen(value: bytes) -> int:
    """The ``last_seen`` of an encoded :class:`Entry` (the latest record time it reflects), without
    decoding the rest; falls back to :meth:`Entry.decode` as :func:`expires_at` does."""
    found = _integer_field(value, _LAST_SEEN)
    return Entry.decode(value).last_seen if found is None else found


class Replay:
    """One partition's replay from ``store``'s position: raw fetches, read_committed filtering, batched writes."""

    def __init__(
        self,
        store: PartitionStore,
        reader: ChangelogReader,
        changelog: TopicPartition,
        *,
        prefetch: bool = True,
        quiet: bool = False,
    ) -> None:
        self.store = store
        self.reader = reader
        self.changelog = changelog
        self.prefetch = prefetch
        self.quiet = quiet  # no start and end lines (a standby's rounds)
        self.position = store.changelog_offset + 1  # the next offset to fetch
        self._ahead: asyncio.Task[RawFetch] | None = None  # the next fetch, sent while this one is applied
        self._ahead_at = -1  # ... from this offset

    async def run(
        self,
        end: int,
        *,
        progress_every: float = 5.0,
        remaining: Gauge | None = None,
        hold: Hold | None = None,
    ) -> int:
        """Replay up to ``end`` (exclusive); return the records applied (tombstones included).

        ``hold``, when given, is entered around each fetch and its writes (a standby
        holds its share of the restore budget only while it reads), and no fetch is
        sent ahead then.
        """
        changelog, start = self.changelog, self.position
        total = end - start
        applied = 0
        started = last_report = time.monotonic()
        if not self.quiet:
            log.info("restore %s: reading offsets %s..%s", changelog, start, end - 1)
        failures = 0
        try:
            while self.position < end:
                try:
                    if hold is None:
                        applied += await self._step(end, prefetch=self.prefetch)
                    else:
                        async with hold():
                            applied += await self._step(end, prefetch=False)
                except KafkaError as exc:
                    self._drop_ahead()
                    failures += 1
                    if failures > RETRIES:
                        raise
                    log.warning("restore %s: fetch failed (%r); retrying", changelog, exc)
                    await asyncio.sleep(RETRY_BACKOFF)
                    await self.reader.refresh()
                    continue
                failures = 0
                left = max(end - self.position, 0)
                if remaining is not None:
                    remaining.set(left)
                now = time.monotonic()
                if now - last_report >= progress_every and not self.quiet:
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
        finally:
            self._drop_ahead()
        if not self.quiet:
            log.info(
                "restore %s: done in %.1fs: %s records applied from offsets %s..%s "
                "(the others were transaction markers or aborted)",
                changelog,
                time.monotonic() - started,
                applied,
                start,
                end - 1,
            )
        return applied

    async def _step(self, end: int, *, prefetch: bool) -> int:
        """Fetch from the position (or take the fetch sent ahead for it) and apply it; with
        ``prefetch``, send the next fetch before applying this one. Returns the records read."""
        at = self.position
        ahead, self._ahead = self._ahead, None
        if ahead is not None and self._ahead_at == at:
            fetched = await ahead
        else:
            _forget(ahead)
            fetched = await self.reader.fetch(self.changelog, at)
        if fetched.error is OffsetOutOfRangeError:
            await self._skip_to_log_start()
            return 0
        if fetched.error is not None:
            raise fetched.error(f"fetch {self.changelog} at {at}")
        if fetched.records is None:
            return 0
        records = fetched.records
        batches = []
        while records.has_next():
            batches.append(records.next_batch())
        if prefetch and batches and batches[-1].next_offset < end:
            self._ahead_at = batches[-1].next_offset
            self._ahead = asyncio.ensure_future(self.reader.fetch(self.changelog, self._ahead_at))
            await asyncio.sleep(0)  # the task sends its request now, before the writes below hold the loop
        return await self._apply(batches, list(fetched.aborted))

    def _drop_ahead(self) -> None:
        ahead, self._ahead = self._ahead, None
        _forget(ahead)

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

    async def _apply(self, batches: list[Any], aborted: list[tuple[int, int]]) -> int:
        """Write one fetch's committed records; return how many were read (tombstones included)."""
        store = self.store
        position = self.position
        stream_time = store.stream_time
        aborted_producers: set[int] = set()
        entries: list[tuple[bytes, bytes, int]] = []
        append = entries.append
        applied = 0
        for batch in batches:
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
                cut = value.find(
                    _EXPIRES
                )  # expires_at() and last_seen(), inlined: this loop runs for every record
                digits = value[cut + 4 : value.find(b",", cut)]
                append((key, value, int(digits) if cut > 0 and digits.isdigit() else expires_at(value)))
                cut = value.find(_LAST_SEEN, cut)
                digits = value[cut + 4 : value.find(b",", cut)]
                seen = int(digits) if cut > 0 and digits.isdigit() else last_seen(value)
                stream_time = max(stream_time, seen)
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


def _forget(task: asyncio.Task[RawFetch] | None) -> None:
    """Cancel a fetch sent ahead that will not be used (its failure, if it failed already, is dropped)."""
    if task is None:
        return
    if task.done():
        if not task.cancelled():
            task.exception()  # retrieved: a fetch nobody waits for is no error
    else:
        task.cancel()


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
