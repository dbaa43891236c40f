"""The worker's one Kafka transaction, and the one place that owns the commit order.

A worker has one transactional producer and at most one open transaction, over every
partition it serves (eos-v2, KIP-447). Each partition that handles records takes its
part of it (:class:`~pipeline.state.partition_transaction.PartitionTransaction`: its
staged claims, its offsets, its stream time); every output record of every part goes
into this transaction's batches. :meth:`Transaction.commit` then does, in this order:

1. flush: every batch is sent and every send acknowledged;
2. the consumer offsets of every part, in the transaction (``TxnOffsetCommit`` with the
   group's generation and member id: a worker the group has moved on from is refused
   here, which fences a zombie);
3. commit (``EndTxn``);
4. per part, one RocksDB ``WriteBatch`` (entries, changelog offset, stream time), then the
   expiry of whole buckets.

A crash before 3 leaves an open transaction that the broker aborts (this worker's next
producer, which has the same transactional id, or the transaction timeout); a crash, or
a store error, after it leaves a store behind its changelog, which a restore repairs.

What each call raises (the transaction is over, aborted or committed, whenever one of them
raises, and every part is reset; only :class:`CommitUncertainError` leaves which one unknown):

- :class:`~pipeline.errors.ProducerFencedError`, :class:`~pipeline.errors.ProducerUnusableError`:
  this producer is done (the caller replaces it);
- :class:`~pipeline.errors.GroupGenerationFencedError`: the group no longer counts this worker a member
  of the generation its offsets carry (taken as the transaction opened): aborted, and the worker rejoins;
- :class:`TransactionFailedError`: the broker refused the transaction, which was aborted:
  redo its records;
- :class:`CommitUncertainError`: the commit (``EndTxn``) was sent and no answer says whether it
  took: the producer was fenced or died meanwhile, or the abort after it was refused. A new
  producer's ``InitProducerId`` completes a commit the broker had begun, so the transaction may
  have committed: its records must not be redone from memory; the tasks in it are reopened from
  the group's committed offsets and their changelogs;
- a part's :class:`~pipeline.errors.StoreError` after the Kafka commit is not raised but
  returned in :class:`Committed`: that part's store is behind, the others are written.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from pipeline.errors import (
    GroupGenerationFencedError,
    IllegalTransitionError,
    PipelineError,
    ProducerFencedError,
    ProducerUnusableError,
    StoreError,
)
from pipeline.headers import ORIGINAL_TIMESTAMP_HEADER
from pipeline.kafka.requests import GroupMetadata
from pipeline.kafka.settings import MAX_MESSAGE_BYTES
from pipeline.kafka.transactional import TransactionalProducer

log = logging.getLogger(__name__)

Header = tuple[str, bytes | None]
SEND_BYTES = 128 * 1024  # a batch this big is sent at the next drain instead of at the commit
#: How far inside a topic's ``message.timestamp.before.max.ms`` a kept timestamp must be: the
#: record reaches the broker a little after it is stamped.
BEFORE_MARGIN_MS = 300_000
_NO_HEADERS: list[Header] = []  # aiokafka's C batch builder takes only a list; it never changes it
Slot = tuple[str, int]


def _wall() -> float:
    return time.time()


class TransactionFailedError(PipelineError):
    """A transaction could not be committed; it was aborted and its records must be redone.

    Its ``__cause__`` is the broker's error when the broker refused it (a refusal caused by
    a record is isolated and bisected: :mod:`pipeline.worker.poison`).
    """

    retriable = True
    reason = "transaction-failed"


class CommitUncertainError(PipelineError):
    """The commit was sent and the transaction may have committed or not (see the module docstring).

    ``fenced``: the producer was fenced (the worker also rejoins its group). Its ``__cause__`` is
    the error that left the outcome unknown.
    """

    retriable = True
    reason = "commit-uncertain"

    def __init__(self, message: str, *, fenced: bool) -> None:
        super().__init__(message)
        self.fenced = fenced


def _uncertain(failure: BaseException, last: BaseException) -> CommitUncertainError:
    """The error for a commit sent whose outcome ``failure`` (and ``last``, the abort's refusal) left unknown."""
    return CommitUncertainError(
        f"the commit was sent and may have taken: {failure}", fenced=isinstance(last, ProducerFencedError)
    )


class TxnState(StrEnum):
    """Where the worker's transaction is."""

    IDLE = "idle"  # none open
    OPEN = "open"  # begun: parts stage and emit into it
    COMMITTING = "committing"  # flush, offsets, commit, stores


TXN_TRANSITIONS: Mapping[TxnState, frozenset[TxnState]] = {
    TxnState.IDLE: frozenset({TxnState.OPEN}),
    TxnState.OPEN: frozenset({TxnState.COMMITTING, TxnState.IDLE}),
    TxnState.COMMITTING: frozenset({TxnState.IDLE}),
}


class Part(Protocol):
    """A partition's part of the transaction (:class:`~pipeline.state.partition_transaction.PartitionTransaction`)."""

    tp: TopicPartition
    changelog_slot: Slot
    first_offset: int | None
    next_offset: int | None
    records: int

    def apply(self, changelog_offset: int | None) -> PartCommitted:
        """Write the committed part to its store."""
        ...

    def reset(self) -> None:
        """Forget what was staged."""
        ...


@dataclass(frozen=True, slots=True)
class PartCommitted:
    """What one part's commit did: its input records, the keys expiry dropped, its store's failure."""

    records: int
    expired: int = 0
    store_error: StoreError | None = None


@dataclass(slots=True)
class Committed:
    """Each part's outcome of a commit, by input partition."""

    parts: dict[TopicPartition, PartCommitted] = field(default_factory=dict)


class Transaction:
    """The worker's one transaction over its one producer (see the module docstring)."""

    def __init__(
        self,
        producer: TransactionalProducer,
        *,
        group: Callable[[], GroupMetadata],
        limits: Mapping[str, int] | None = None,
        timestamps: Mapping[str, tuple[int, int]] | None = None,
        send_bytes: int = SEND_BYTES,
        wall: Callable[[], float] | None = None,
    ) -> None:
        self.producer = producer
        self.group = group  # the group's generation and member ids now: taken as a transaction opens
        self._member: GroupMetadata | None = None  # ... by the open transaction
        # topic -> largest record it takes (the worker's own dict: it updates it when a limit changes)
        self.limits: Mapping[str, int] = limits if limits is not None else {}
        self.timestamps: Mapping[str, tuple[int, int]] = timestamps or {}  # topic -> (before, after) ms
        self.send_bytes = send_bytes
        self.wall = wall or _wall
        self.state = TxnState.IDLE
        self.opened_at = 0.0
        self.parts: dict[TopicPartition, Part] = {}  # the parts in the open transaction
        self._batches: dict[Slot, Any] = {}
        self._full: list[tuple[Slot, Any]] = []
        self._futures: list[asyncio.Future[Any]] = []
        self._last_sent: dict[Slot, tuple[asyncio.Future[Any], int]] = {}  # per changelog slot

    # -- state ---------------------------------------------------------------------------
    def _move(self, target: TxnState) -> None:
        if target not in TXN_TRANSITIONS[self.state]:
            raise IllegalTransitionError(f"transaction: no transition from {self.state} to {target}")
        self.state = target

    @property
    def open(self) -> bool:
        """Whether a transaction is open (begun, not yet committed or aborted)."""
        return self.state is not TxnState.IDLE

    @property
    def records(self) -> int:
        """Input records the open transaction holds, all parts together."""
        return sum(part.records for part in self.parts.values())

    def due(self, *, interval: float, max_records: int) -> bool:
        """Whether the open transaction is old or big enough to commit."""
        return self.state is TxnState.OPEN and (
            self.records >= max_records or time.monotonic() - self.opened_at >= interval
        )

    # -- writes --------------------------------------------------------------------------
    async def join(self, part: Part) -> None:
        """Open the transaction if none is open, and count ``part`` in it."""
        if self.state is TxnState.IDLE:
            member = self.group()
            await self.producer.begin()
            self._member = member
            self._move(TxnState.OPEN)
            self.opened_at = time.monotonic()
        self.parts[part.tp] = part

    def fits(self, topic: str, size: int) -> bool:
        """Whether a record of ``size`` bytes on the wire is within ``topic``'s limit."""
        limit = self.limits.get(topic)
        return limit is None or size <= limit

    def emit(
        self,
        topic: str,
        partition: int,
        *,
        key: bytes | None,
        value: bytes,
        timestamp: int,
        headers: list[Header] | None = None,
        restamp: bool = False,
    ) -> None:
        """Append a record to the open transaction (batched per topic-partition; sent by :meth:`drain`).

        A timestamp ``topic`` would refuse (or any, with ``restamp``) is replaced by the
        current time, the original kept in the ``original-timestamp`` header.
        """
        bounds = self.timestamps.get(topic)
        if restamp or bounds is not None:
            timestamp, headers = self._stamp(timestamp, headers, bounds, restamp)
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
        self, timestamp: int, headers: list[Header] | None, bounds: tuple[int, int] | None, restamp: bool
    ) -> tuple[int, list[Header] | None]:
        now = int(self.wall() * 1000)
        if not restamp and bounds is not None:
            before, after = bounds
            if now - before + BEFORE_MARGIN_MS <= timestamp <= now + after:
                return timestamp, headers
        return now, [*(headers or ()), (ORIGINAL_TIMESTAMP_HEADER, str(timestamp).encode())]

    async def drain(self) -> None:
        """Hand the full batches, and those past ``send_bytes``, to the producer (in the order they filled).

        A whole transaction would otherwise be sent at its commit and the commit would wait
        for all of it; sent early, it travels while the next records are handled.
        """
        for slot, batch in list(self._batches.items()):
            if batch.size() >= self.send_bytes:
                self._full.append((slot, batch))
                del self._batches[slot]
        full, self._full = self._full, []
        for slot, batch in full:
            await self._send(slot, batch)

    async def _send(self, slot: Slot, batch: Any) -> None:
        count = batch.record_count()
        if count == 0:
            return
        batch.close()  # complete: the producer sends it at once instead of lingering for more records
        future = await self.producer.send_batch(batch, slot[0], slot[1])
        self._futures.append(future)
        self._last_sent[slot] = (future, count)

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

    def last_offset(self, slot: Slot) -> int | None:
        """The offset of the last record this transaction wrote to ``slot`` (after a flush), if any."""
        sent = self._last_sent.get(slot)
        if sent is None:
            return None
        future, count = sent
        return int(future.result().offset) + count - 1

    # -- the end -------------------------------------------------------------------------
    async def commit(self) -> Committed:
        """Flush, every part's offsets, the Kafka commit, then each part's store (module docstring)."""
        committed = Committed()
        if self.state is not TxnState.OPEN:
            return committed
        self._move(TxnState.COMMITTING)
        parts = list(self.parts.values())
        ending = False  # EndTxn sent: from here a failure leaves the outcome unknown
        try:
            await self._flush()
            offsets = {p.tp: p.next_offset for p in parts if p.next_offset is not None}
            if offsets and self._member is not None:
                await self.producer.send_offsets(offsets, self._member)
            ending = True
            await self.producer.commit()
        except KafkaError as exc:
            try:
                await self.abort()  # accepted: the broker had not begun a commit
            except (ProducerFencedError, ProducerUnusableError) as refused:
                if ending:
                    raise _uncertain(exc, refused) from refused
                raise
            raise TransactionFailedError(f"transaction aborted: {exc!r}") from exc
        except GroupGenerationFencedError:
            await self.abort()  # the broker holds it open, abortable: only an abort ends it
            raise
        except (ProducerFencedError, ProducerUnusableError) as exc:
            self._reset()
            if ending:
                raise _uncertain(exc, exc) from exc
            raise
        except BaseException:
            self._reset()
            raise
        try:
            for part in parts:
                committed.parts[part.tp] = part.apply(self.last_offset(part.changelog_slot))
        finally:
            self._reset()
        return committed

    async def abort(self) -> None:
        """Abort the open transaction and reset every part (raises when only a new producer can)."""
        try:
            if self.state is not TxnState.IDLE:
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
        self._last_sent.clear()
        for part in self.parts.values():
            part.reset()
        self.parts.clear()
        self._member = None
        self.state = TxnState.IDLE
