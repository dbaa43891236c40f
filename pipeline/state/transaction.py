"""One partition's transaction: the only writer of its state, and the one place that owns the commit order.

For a batch of records from one partition:

1. each record is decided against the store *and* the batch's own staged
   claims (:meth:`PartitionTransaction.lookup`, :meth:`PartitionTransaction.staged`);
2. :meth:`PartitionTransaction.stage` remembers a key's new state and appends
   its changelog record; commands, audit, DLQ records and reroutes are
   appended with :meth:`PartitionTransaction.emit`, each checked against its
   topic's size limit first;
3. :meth:`PartitionTransaction.commit`: flush → the consumer offset into the
   transaction → commit → one RocksDB ``WriteBatch`` (entries, changelog
   offset, stream time) → expiry of whole buckets.

A crash before the Kafka commit aborts everything (the broker aborts the
transaction when the next producer with this transactional id starts). A
crash, or a store error, after it is repaired by replaying the changelog from
the store's offset, which never runs ahead of what the store holds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import IllegalOperation, KafkaError, ProducerFenced

from pipeline.dead_letter import RECORD_OVERHEAD, record_size
from pipeline.errors import PartitionFencedError, PipelineError, RecordTooLargeError, StoreError
from pipeline.state.decision import Entry, tuple_of
from pipeline.state.store import Change, PartitionStore

log = logging.getLogger(__name__)

Header = tuple[str, bytes | None]
SEND_BYTES = 128 * 1024  # a batch this big is sent at the next drain instead of at the commit
_NO_HEADERS: list[Header] = []  # aiokafka's C batch builder takes only a list; it never changes it


class TransactionFailedError(PipelineError):
    """A transaction could not be committed; it was aborted and the batch must be redone.

    ``refused``: the broker's error when the broker refused it (the partition bisects on
    the ones a record causes). Carried explicitly: compiled (mypyc), a coroutine that
    raises ``from`` an error after an ``await`` loses ``__cause__``.
    """

    retriable = True
    reason = "transaction-failed"

    def __init__(self, message: str, *, refused: BaseException | None = None) -> None:
        super().__init__(message)
        self.refused = refused


class PartitionTransaction:
    """Stages one partition's batch and commits it: Kafka transaction first, then the store."""

    def __init__(
        self,
        *,
        tp: TopicPartition,
        group: str,
        producer: AIOKafkaProducer,
        store: PartitionStore,
        changelog: TopicPartition,
        limits: Mapping[str, int] | None = None,
        send_bytes: int = SEND_BYTES,
    ) -> None:
        self.tp = tp
        self.group = group
        self.producer = producer
        self.store = store
        self.changelog = changelog
        self.limits: Mapping[str, int] = limits or {}  # topic -> largest record it takes
        self.send_bytes = send_bytes
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
        except AssertionError as exc:  # aiokafka asserts on its state machine once its sender went fatal
            self.broken = True
            raise TransactionFailedError(f"{self.tp}: the producer is unusable: {exc}") from exc
        self.in_transaction = True
        self.opened_at = time.monotonic()
        self.records = 0

    def stage(self, key: bytes, entry: Entry, previous: Entry | None, *, timestamp: int) -> None:
        """Remember ``key``'s new state and append its changelog record.

        The state reaches the store only after the commit; the changelog record
        (every change, so a restored store has the counts too) travels in the
        transaction itself.
        """
        earlier = self._staged.get(key)
        value = entry.encode()
        change: Change = tuple_of(Change, (entry, earlier.previous if earlier else previous, value))
        self._staged[key] = change
        changelog = self.changelog
        self.emit(changelog.topic, changelog.partition, key=key, value=value, timestamp=timestamp)

    def fits(self, topic: str, key: bytes | None, value: bytes, headers: list[Header] | None = None) -> bool:
        """Whether a record of this size is within ``topic``'s limit."""
        limit = self.limits.get(topic)
        if limit is None:
            return True
        if headers:
            return record_size(key, value, headers) <= limit
        return RECORD_OVERHEAD + len(value) + (len(key) if key is not None else 0) <= limit

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
        """Append a record to the open transaction (batched per topic-partition; sent by :meth:`drain`).

        Raises :class:`RecordTooLargeError` when the record exceeds ``topic``'s limit:
        nothing is appended then, and the caller sends something smaller instead.
        """
        if not self.fits(topic, key, value, headers):
            raise RecordTooLargeError(
                f"a record of {len(value)} bytes is larger than {topic} takes ({self.limits[topic]} bytes)"
            )
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

    async def commit(self) -> tuple[int, int]:
        """Commit: flush, offsets, Kafka commit, then one ``WriteBatch`` to the store, then expiry.

        Returns (input records committed, keys expired). Raises
        :class:`PartitionFencedError` when another producer took the partition
        (drop it, never retry); :class:`TransactionFailedError` after aborting on
        any other Kafka failure (redo the batch from ``first_offset``); and
        :class:`StoreError` when the store write after a successful Kafka commit
        failed (the store is behind the changelog: reopen and restore). Whatever
        happens, the transaction is over when this returns or raises.
        """
        if not self.in_transaction:
            return 0, 0
        if self.broken:
            self._reset()
            raise TransactionFailedError(
                f"{self.tp}: the producer is unusable; the partition must be reopened"
            )
        try:
            await self._flush_with_offsets()
            await self.producer.commit_transaction()
        except ProducerFenced as exc:
            self._reset()
            raise PartitionFencedError(f"{self.tp}: fenced by a newer producer") from exc
        except (KafkaError, IllegalOperation) as exc:
            await self.abort()
            raise TransactionFailedError(f"{self.tp}: transaction aborted: {exc!r}", refused=exc) from exc
        except AssertionError as exc:  # aiokafka's state machine once its sender went fatal
            self.broken = True  # nothing more can be sent with it: the partition is reopened
            self._reset()
            raise TransactionFailedError(f"{self.tp}: the producer is unusable: {exc}") from exc
        committed = self.records
        try:
            changelog_offset = None
            if self._changelog_sent:
                future, count = self._changelog_sent[-1]
                changelog_offset = future.result().offset + count - 1
            self.store.write(self._staged, changelog_offset=changelog_offset, stream_time=self.stream_time)
            expired = self.store.expire()
        except StoreError:
            self.broken = True  # the Kafka side is committed; only a restore brings the store level
            raise
        finally:
            self._reset()
        return committed, expired

    async def _flush_with_offsets(self) -> None:
        """Send what is staged, wait for the acknowledgements, then put the input offset into the transaction.

        In this order, not at the same time: a transaction begun right after the previous
        commit can meet that commit's markers still being written, and the group
        coordinator then refuses the offsets with COORDINATOR_NOT_AVAILABLE, which aiokafka
        retries only after ``retry_backoff_ms`` (100 ms). Sent after the records, the offsets
        meet that far less often (measured: p99 of a commit 43 against 120 ms).
        """
        await self._flush()
        if self.next_offset is not None:
            await self.producer.send_offsets_to_transaction({self.tp: self.next_offset}, self.group)

    async def abort(self) -> None:
        """Abort the open transaction and forget everything staged."""
        try:
            if self.in_transaction and not self.broken:
                await self._flush_quietly()
                await self.producer.abort_transaction()
        except ProducerFenced:
            log.info("%s: abort after fencing; nothing to abort", self.tp)
        # aiokafka asserts on the transition when its sender died (fatal state): same remedy
        except (KafkaError, IllegalOperation, AssertionError) as exc:
            self.broken = True
            log.warning("%s: abort failed (%r); the producer will be replaced", self.tp, exc)
        finally:
            self._reset()

    async def _flush_quietly(self) -> None:
        """Wait for what was sent before aborting (aiokafka refuses to abort with sends in flight)."""
        if self._futures:
            await asyncio.gather(*self._futures, return_exceptions=True)

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
