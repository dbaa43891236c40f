"""The commit order of one input partition, in one place.

For a batch of records from one partition:

1. each record is decided against the store *and* the batch's own staged
   claims (:meth:`PartitionCheckpoint.lookup`, :meth:`PartitionCheckpoint.stage`);
2. commands, changelog, audit and DLQ records are appended to the open
   transaction (:meth:`PartitionCheckpoint.emit`);
3. :meth:`PartitionCheckpoint.commit` sends the consumer offset into the
   transaction and commits it;
4. only then are the staged claims written to RocksDB, in one ``WriteBatch``
   with the changelog offset they reflect.

A crash before 3 aborts everything (the broker aborts the transaction when
the next producer with this transactional id starts). A crash between 3 and
4 is repaired on restart by replaying the changelog from the stored offset.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import IllegalOperation, KafkaError, ProducerFenced

from pipeline.errors import PartitionFencedError, PipelineError
from pipeline.state.decision import Entry
from pipeline.state.store import Change, PartitionStore

log = logging.getLogger(__name__)

Header = tuple[str, bytes | None]
SEND_BYTES = 128 * 1024  # a batch this big is sent at the next drain instead of at the commit
_NO_HEADERS: list[Header] = []  # aiokafka's C batch builder takes only a list; it never changes it


class TransactionFailedError(PipelineError):
    """A transaction could not be committed; it was aborted and the batch must be redone."""

    retriable = True
    reason = "transaction-failed"


class PartitionCheckpoint:
    """Stages one partition's batch and commits it: Kafka transaction first, then the store."""

    def __init__(
        self,
        *,
        tp: TopicPartition,
        group: str,
        producer: AIOKafkaProducer,
        store: PartitionStore,
        changelog: TopicPartition,
    ) -> None:
        self.tp = tp
        self.group = group
        self.producer = producer
        self.store = store
        self.changelog = changelog
        self._staged: dict[bytes, Change] = {}
        self._batches: dict[tuple[str, int], Any] = {}
        self._full: list[tuple[tuple[str, int], Any]] = []
        self._futures: list[asyncio.Future[Any]] = []
        self._changelog_sent: list[tuple[asyncio.Future[Any], int]] = []
        self.in_transaction = False
        self.broken = False  # the producer cannot continue: close and reopen the partition
        self.opened_at = 0.0
        self.first_offset: int | None = None
        self.next_offset: int | None = None
        self.records = 0
        self.stream_time = store.stream_time

    # -- reads -----------------------------------------------------------------
    def lookup(self, keys: list[bytes]) -> dict[bytes, Entry]:
        """Current entries of ``keys``: staged in this batch first, then the store."""
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
        try:
            await self.producer.begin_transaction()
        except ProducerFenced as exc:
            raise PartitionFencedError(f"{self.tp}: fenced by a newer producer") from exc
        self.in_transaction = True
        self.opened_at = time.monotonic()
        self.records = 0

    def stage(self, key: bytes, entry: Entry, previous: Entry | None) -> bytes:
        """Remember ``key``'s new state (it reaches the store only after the commit); returns its bytes."""
        earlier = self._staged.get(key)
        value = entry.encode()
        self._staged[key] = Change(entry, earlier.previous if earlier else previous, value)
        return value

    def consumed(self, offset: int, timestamp: int) -> None:
        """Mark input ``offset`` as handled in this transaction."""
        if self.first_offset is None:
            self.first_offset = offset
        self.next_offset = offset + 1
        self.records += 1
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
        """Append a record to the open transaction (batched per topic-partition; sent by :meth:`drain`)."""
        if headers is None:
            headers = _NO_HEADERS
        slot = (topic, partition)
        batch = self._batches.get(slot)
        if batch is None:
            batch = self._batches[slot] = self.producer.create_batch()
        if batch.append(key=key, value=value, timestamp=timestamp, headers=headers) is None:
            self._full.append((slot, batch))
            batch = self._batches[slot] = self.producer.create_batch()
            if batch.append(key=key, value=value, timestamp=timestamp, headers=headers) is None:
                raise PipelineError(f"a record of {len(value)} bytes does not fit in one batch for {topic}")

    async def drain(self) -> None:
        """Hand the full batches, and those past :data:`SEND_BYTES`, to the producer (in the order they filled).

        The producer's batches may grow to the largest record size (4 MiB), so a
        whole transaction would otherwise be sent at its commit and the commit
        would wait for all of it; sent early, it travels while the next records
        are handled.
        """
        for slot, batch in list(self._batches.items()):
            if batch.size() >= SEND_BYTES:
                self._full.append((slot, batch))
                del self._batches[slot]
        full, self._full = self._full, []
        for slot, batch in full:
            await self._send(slot, batch)

    async def _send(self, slot: tuple[str, int], batch: Any) -> None:
        count = batch.record_count()
        if count == 0:
            return
        future = await self.producer.send_batch(batch, slot[0], partition=slot[1])
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
                    raise result

    def due(self, *, interval: float, max_records: int) -> bool:
        """Whether the open transaction is old or big enough to commit."""
        return self.in_transaction and (
            self.records >= max_records or time.monotonic() - self.opened_at >= interval
        )

    async def commit(self) -> int:
        """Commit the transaction with the consumer offset, then write the store.

        Returns the number of input records committed. Raises
        :class:`PartitionFencedError` when another producer took the partition
        (drop it, never retry) and :class:`TransactionFailedError` after
        aborting on any other failure (redo the batch from ``first_offset``).
        """
        if not self.in_transaction:
            return 0
        if self.broken:
            raise TransactionFailedError(
                f"{self.tp}: the producer is unusable; the partition must be reopened"
            )
        try:
            await self._flush()
            if self.next_offset is not None:
                await self.producer.send_offsets_to_transaction({self.tp: self.next_offset}, self.group)
            await self.producer.commit_transaction()
        except ProducerFenced as exc:
            self._reset()
            raise PartitionFencedError(f"{self.tp}: fenced by a newer producer") from exc
        except (KafkaError, IllegalOperation) as exc:
            await self.abort()
            raise TransactionFailedError(f"{self.tp}: transaction aborted: {exc!r}") from exc
        changelog_offset = None
        if self._changelog_sent:
            future, count = self._changelog_sent[-1]
            changelog_offset = future.result().offset + count - 1
        self.store.write(self._staged, changelog_offset=changelog_offset, stream_time=self.stream_time)
        committed = self.records
        self._reset()
        return committed

    async def abort(self) -> None:
        """Abort the open transaction and forget everything staged."""
        if self.in_transaction and not self.broken:
            try:
                await self.producer.abort_transaction()
            except ProducerFenced:
                log.info("%s: abort after fencing; nothing to abort", self.tp)
            # aiokafka asserts on the transition when its sender died (fatal state): same remedy
            except (KafkaError, IllegalOperation, AssertionError) as exc:
                self.broken = True
                log.warning("%s: abort failed (%r); the producer will be replaced", self.tp, exc)
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
        self.first_offset = None
        self.next_offset = None
        self.records = 0
        self.stream_time = self.store.stream_time
