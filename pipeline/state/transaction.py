"""One partition's transaction: the only writer of its state, and the one place that owns the commit order.

For a batch of records from one partition:

1. each record is decided against the store *and* the batch's own staged
   claims (:meth:`PartitionTransaction.lookup`, :meth:`PartitionTransaction.staged`);
2. :meth:`PartitionTransaction.stage` remembers a key's new state and appends
   its changelog record; commands, audit, DLQ records and reroutes are
   appended with :meth:`PartitionTransaction.emit`, each checked against its
   topic's size limit first, and stamped with the current time instead of its
   own when its topic would refuse its timestamp;
3. :meth:`PartitionTransaction.commit`: flush → the consumer offset into the
   transaction → commit → one RocksDB ``WriteBatch`` (entries, changelog
   offset, stream time) → expiry of whole buckets.

A crash before the Kafka commit aborts everything (the broker aborts the
transaction when the next producer with this transactional id starts). A
crash, or a store error, after it is repaired by replaying the changelog from
the store's offset, which never runs ahead of what the store holds.

What can go wrong, and what each call raises then (the transaction is over,
aborted or committed, whenever one of them raises):

- :class:`~pipeline.errors.ProducerFencedError` and
  :class:`~pipeline.errors.ProducerUnusableError`, from the producer: the
  partition stops using it;
- :class:`TransactionFailedError`: the broker refused the transaction, which
  was aborted: redo the batch;
- :class:`~pipeline.errors.StoreError`: the store write after a successful
  Kafka commit failed: the store is behind its changelog until a restore.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from pipeline.errors import PipelineError, RecordTooLargeError
from pipeline.headers import ORIGINAL_TIMESTAMP_HEADER
from pipeline.kafka.record_size import RECORD_OVERHEAD, record_size
from pipeline.kafka.settings import MAX_MESSAGE_BYTES
from pipeline.kafka.transactional import TransactionalProducer
from pipeline.state.decision import Entry
from pipeline.state.store import Change, PartitionStore

log = logging.getLogger(__name__)

Header = tuple[str, bytes | None]
SEND_BYTES = 128 * 1024  # a batch this big is sent at the next drain instead of at the commit
#: How far inside a topic's ``message.timestamp.before.max.ms`` a kept timestamp must be: the
#: record reaches the broker a little after it is stamped.
BEFORE_MARGIN_MS = 300_000
_NO_HEADERS: list[Header] = []  # aiokafka's C batch builder takes only a list; it never changes it


def _wall() -> float:
    return time.time()


class TransactionFailedError(PipelineError):
    """A transaction could not be committed; it was aborted and the batch must be redone.

    Its ``__cause__`` is the broker's error when the broker refused it (the partition
    bisects on the ones a record causes).
    """

    retriable = True
    reason = "transaction-failed"


class PartitionTransaction:
    """Stages one partition's batch and commits it: Kafka transaction first, then the store."""

    def __init__(
        self,
        *,
        tp: TopicPartition,
        group: str,
        producer: TransactionalProducer,
        store: PartitionStore,
        changelog: TopicPartition,
        limits: Mapping[str, int] | None = None,
        timestamps: Mapping[str, tuple[int, int]] | None = None,
        send_bytes: int = SEND_BYTES,
        wall: Callable[[], float] | None = None,
    ) -> None:
        self.tp = tp
        self.group = group
        self.producer = producer
        self.store = store
        self.changelog = changelog
        self.limits: Mapping[str, int] = limits or {}  # topic -> largest record it takes
        self.timestamps: Mapping[str, tuple[int, int]] = timestamps or {}  # topic -> (before, after) ms
        self.send_bytes = send_bytes
        self.wall = wall or _wall
        self.restamp = False  # set while a record whose outputs the broker refused is redone: stamp them now
        self._staged: dict[bytes, Change] = {}
        self._batches: dict[tuple[str, int], Any] = {}
        self._full: list[tuple[tuple[str, int], Any]] = []
        self._futures: list[asyncio.Future[Any]] = []
        self._changelog_sent: list[tuple[asyncio.Future[Any], int]] = []
        self.in_transaction = False
        self.opened_at = 0.0
        self.first_offset: int | None = None
        self.next_offset: int | None = None
        self.records = 0
        self.stream_time = store.stream_time

    # -- reads -----------------------------------------------------------------
    def lookup(self, keys: list[bytes]) -> dict[bytes, Entry]:
        """Current entries of ``keys``: staged in this batch first, then the store (StoreError on a read failure)."""
        found = {key: self._staged[key].entry for key in keys if key in self._staged}
        missing = [key for key in keys if key not in found]
        if missing:
            found.update(self.store.get_many(missing))
        return found

    def staged(self, key: bytes) -> Entry | None:
        """The entry staged for ``key`` in this batch, if any."""
        change = self._staged.get(key)
        return change.entry if change else None

    # -- writes ----------------------------------------------------------------
    async def begin(self) -> None:
        """Open the partition's transaction if none is open."""
        if self.in_transaction:
            return
        await self.producer.begin()
        self.in_transaction = True
        self.opened_at = time.monotonic()
        self.records = 0

    def stage(self, key: bytes, entry: Entry, previous: Entry | None) -> None:
        """Remember ``key``'s new state and append its changelog record.

        The state reaches the store only after the commit; the changelog record
        (every change, so a restored store has the counts too) travels in the
        transaction itself. It is stamped with the time it is written, not the
        input's: the changelog's ``retention.ms`` runs on the broker's clock from
        the record timestamp, and a worker working through a backlog days old
        would otherwise write claims the broker deletes while they are still
        live. Stream time travels in the entry itself (its ``last_seen``), which
        is what a replay reads (:mod:`pipeline.state.replay`).
        """
        earlier = self._staged.get(key)
        value = entry.encode()
        self._staged[key] = Change(entry, earlier.previous if earlier else previous, value)
        changelog = self.changelog
        written = int(self.wall() * 1000)
        self.emit(changelog.topic, changelog.partition, key=key, value=value, timestamp=written)

    def fits(self, topic: str, key: bytes | None, value: bytes, headers: list[Header] | None = None) -> bool:
        """Whether a record of this size is within ``topic``'s limit."""
        limit = self.limits.get(topic)
        if limit is None:
            return True
        if headers:
            return record_size(key, value, headers) <= limit
        return RECORD_OVERHEAD + len(value) + (len(key) if key is not None else 0) <= limit

    def consumed(self, offset: int) -> None:
        """Mark input ``offset`` as handled in this transaction."""
        if self.first_offset is None:
            self.first_offset = offset
        self.next_offset = offset + 1
        self.records += 1

    def observe(self, timestamp: int) -> None:
        """Move stream time to ``timestamp`` (a valid record of this partition, its time already bounded)."""
        self.stream_time = max(self.stream_time, timestamp)

    def emit(
        self,
        topic: str,
        partition: int,
        *,
        key: bytes | None,
        value: bytes,
        timestamp: int,
        headers: list[Header] | None = None,
    ) -> None:
        """Append a record to the open transaction (batched per topic-partition; sent by :meth:`drain`).

        Raises :class:`RecordTooLargeError` when the record exceeds ``topic``'s limit:
        nothing is appended then, and the caller sends something smaller instead. A
        timestamp ``topic`` would refuse is replaced by the current time, the original
        kept in the ``original-timestamp`` header.
        """
        if not self.fits(topic, key, value, headers):
            raise RecordTooLargeError(
                f"a record of {len(value)} bytes is larger than {topic} takes ({self.limits[topic]} bytes)"
            )
        bounds = self.timestamps.get(topic)
        if self.restamp or bounds is not None:
            timestamp, headers = self._stamp(timestamp, headers, bounds)
        if headers is None:
            headers = _NO_HEADERS
        slot = (topic, partition)
        batch = self._batches.get(slot)
        if batch is None:
            batch = self._batches[slot] = self._new_batch(topic)
        if batch.append(key=key, value=value, timestamp=timestamp, headers=headers) is None:
            self._full.append((slot, batch))
            batch = self._batches[slot] = self._new_batch(topic)
            if batch.append(key=key, value=value, timestamp=timestamp, headers=headers) is None:
                raise PipelineError(f"a record of {len(value)} bytes does not fit in one batch for {topic}")

    def _new_batch(self, topic: str) -> Any:
        """An empty batch for ``topic``, no larger than the topic takes (the broker refuses a larger batch whole)."""
        return self.producer.batch(min(self.limits.get(topic, MAX_MESSAGE_BYTES), MAX_MESSAGE_BYTES))

    def _stamp(
        self, timestamp: int, headers: list[Header] | None, bounds: tuple[int, int] | None
    ) -> tuple[int, list[Header] | None]:
        now = int(self.wall() * 1000)
        if not self.restamp and bounds is not None:
            before, after = bounds
            if now - before + BEFORE_MARGIN_MS <= timestamp <= now + after:
                return timestamp, headers
        return now, [*(headers or ()), (ORIGINAL_TIMESTAMP_HEADER, str(timestamp).encode())]

    async def drain(self) -> None:
        """Hand the full batches, and those past ``send_bytes``, to the producer (in the order they filled).

        The producer's batches may grow to the largest record size (4 MiB), so a
        whole transaction would otherwise be sent at its commit and the commit
        would wait for all of it; sent early, it travels while the next records
        are handled.
        """
        for slot, batch in list(self._batches.items()):
            if batch.size() >= self.send_bytes:
                self._full.append((slot, batch))
                del self._batches[slot]
        full, self._full = self._full, []
        for slot, batch in full:
            await self._send(slot, batch)

    async def _send(self, slot: tuple[str, int], batch: Any) -> None:
        count = batch.record_count()
        if count == 0:
            return
        batch.close()  # complete: the producer sends it at once instead of lingering for more records
        future = await self.producer.send_batch(batch, slot[0], slot[1])
        self._futures.append(future)
        if slot == (self.changelog.topic, self.changelog.partition):
            self._changelog_sent.append((future, count))

    async def _flush(self) -> None:
        await self.drain()
        for slot in list(self._batches):
            await self._send(slot, self._batches.pop(slot))
        if self._futures:
            # read every result, so no failed future is left unretrieved; raise the first failure
            results = await asyncio.gather(*self._futures, return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException):
                    raise self.producer.outcome(result)

    def due(self, *, interval: float, max_records: int) -> bool:
        """Whether the open transaction is old or big enough to commit."""
        return self.in_transaction and (
            self.records >= max_records or time.monotonic() - self.opened_at >= interval
        )

    async def commit(self) -> tuple[int, int]:
        """Commit: flush, offsets, Kafka commit, then one ``WriteBatch`` to the store, then expiry.

        Returns (input records committed, keys expired). Raises as the module
        docstring says; whatever happens, the transaction is over when this
        returns or raises.
        """
        if not self.in_transaction:
            return 0, 0
        try:
            await self._flush()
            if self.next_offset is not None:
                await self.producer.send_offsets({self.tp: self.next_offset}, self.group)
            await self.producer.commit()
        except KafkaError as exc:
            await self.abort()
            raise TransactionFailedError(f"{self.tp}: transaction aborted: {exc!r}") from exc
        except BaseException:
            self._reset()
            raise
        committed = self.records
        try:
            changelog_offset = None
            if self._changelog_sent:
                future, count = self._changelog_sent[-1]
                changelog_offset = future.result().offset + count - 1
            self.store.write(self._staged, changelog_offset=changelog_offset, stream_time=self.stream_time)
            expired = self.store.expire()
        finally:
            self._reset()
        return committed, expired

    async def abort(self) -> None:
        """Abort the open transaction and forget everything staged (raises when only a new producer can)."""
        try:
            if self.in_transaction:
                if self._futures:  # aiokafka refuses to abort with sends in flight
                    await asyncio.gather(*self._futures, return_exceptions=True)
                await self.producer.abort()
        finally:
            self._reset()

    def _reset(self) -> None:
        for batch in [*self._batches.values(), *(b for _, b in self._full)]:
            batch.close()
        self._batches.clear()
        self._full.clear()
        self._futures.clear()
        self._changelog_sent.clear()
        self._staged.clear()
        self.in_transaction = False
        self.restamp = False
        self.first_offset = None
        self.next_offset = None
        self.records = 0
        self.stream_time = self.store.stream_time
