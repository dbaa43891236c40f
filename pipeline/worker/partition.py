"""One owned partition: the only owner of its store, transactional producer, transaction and stage.

Its life is a checked state machine (:mod:`pipeline.worker.lifecycle`), and it is
the only writer of its own fields. The loop feeds it records
(:meth:`Partition.feed`), asks it to handle them (:meth:`Partition.work`), to
commit (:meth:`Partition.commit`) and to close (:meth:`Partition.close`, which
commits through the same path), and tells it where the consumer was positioned
(:meth:`Partition.positioned`). What it does on each failure:

- handling one record raises: abort, rewind, and redo with that record as
  poison (to the DLQ alone);
- a commit the broker refuses: abort and rewind; a retriable error (broker
  down, timeouts) is simply redone, and a non-retriable one that repeats
  from the same offset bisects the transaction until the offending record is
  alone, which is redone with its outputs stamped now (refused for its
  timestamp) or goes to the DLQ (``unproducible``, its DLQ record stamped now
  if that is refused for its timestamp); when even its DLQ record is refused
  otherwise, :class:`~pipeline.errors.PartitionUnservedError` stops the worker;
- fenced, anywhere (begin, send, offsets, commit, abort): FENCED; the loop
  closes it and never opens it again until the group assigns it again;
- the producer cannot continue, or the store failed: BROKEN, closed and opened
  again by the loop (a new producer aborts what the broker holds open; restore
  repairs the store).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from pipeline.errors import (
    BrokerUnavailableError,
    PartitionUnservedError,
    PipelineError,
    ProducerFencedError,
    ProducerUnusableError,
    StoreCorruptError,
    StoreError,
)
from pipeline.kafka.transactional import TransactionalProducer
from pipeline.state import directory
from pipeline.state.store import PartitionStore
from pipeline.state.transaction import PartitionTransaction, TransactionFailedError
from pipeline.worker.context import PartitionContext
from pipeline.worker.lifecycle import Lifecycle, PartitionState
from pipeline.worker.metrics import Tally
from pipeline.worker.opening import OPEN_ERRORS, restore_to_serve, retry
from pipeline.worker.poison import RECORD_ERRORS, PoisonTracker
from pipeline.worker.stage import HandlerFailedError, Stage

log = logging.getLogger(__name__)

State = PartitionState


class Partition:
    """An input (or effects) partition this worker owns, from OPENING to CLOSED."""

    def __init__(
        self,
        tp: TopicPartition,
        *,
        changelog: TopicPartition,
        context: PartitionContext,
        seek: Callable[[TopicPartition, int], None],
    ) -> None:
        self.tp = tp
        self.name = f"{tp.topic}-{tp.partition}"
        self.changelog = changelog
        self.context = context
        self.settings = context.worker_settings
        self.metrics = context.metrics
        self._seek = seek
        self.lifecycle = Lifecycle.partition(self.name)
        self.lock = asyncio.Lock()
        self.queue: list[Any] = []  # fetched, not yet handled (held while a commit runs)
        self.queued_bytes = 0
        self.generation = 0  # moves at every seek: records fetched before it are stale
        self.rewound_to = 0  # where the consumer was last moved to
        self.caught_up = False  # everything fetched is handled and the log's end reached
        self.poison = PoisonTracker(self.name)
        self.tally = Tally(context.metrics)  # outcomes of the open transaction: flushed at commit
        self.progress_at = time.monotonic()  # last commit, or last moment with nothing to do
        self.store: PartitionStore | None = None
        self.producer: TransactionalProducer | None = None
        self.txn: PartitionTransaction | None = None
        self.stage: Stage | None = None
        self._wipe = False  # the store cannot be read: wipe it when released
        self.identity = context.identity(tp, changelog)
        self.position: int | None = None  # the changelog offset its store left on disk holds (-1: wiped)

    # -- state -----------------------------------------------------------------------
    @property
    def state(self) -> PartitionState:
        """The lifecycle state."""
        return self.lifecycle.state

    @property
    def serving(self) -> bool:
        """READY or COMMITTING."""
        return self.lifecycle.serving

    @property
    def can_work(self) -> bool:
        """READY with queued records that the open transaction has room for (not held at a bisecting limit)."""
        if self.state is not State.READY or not self.queue:
            return False
        limit = self.poison.limit
        return limit is None or self.txn is None or self.txn.records < limit

    def stuck(self, now: float) -> bool:
        """Serving, with work waiting, and no commit for ``stuck_after`` seconds."""
        busy = bool(self.queue) or (self.txn is not None and self.txn.in_transaction)
        return self.serving and busy and now - self.progress_at > self.settings.stuck_after

    def due(self) -> bool:
        """Whether the open transaction should commit now (old, big, or at the bisecting limit)."""
        txn = self.txn
        if self.state is not State.READY or txn is None or not txn.in_transaction:
            return False
        limit = self.poison.limit
        if limit is not None and txn.records >= limit:
            return True
        if self.caught_up and not self.queue:
            return True
        return txn.due(interval=self.settings.commit_interval, max_records=self.settings.max_batch)

    def set_caught_up(self, caught_up: bool) -> None:
        """The loop's word on whether everything of the log's stable end is fetched and handled."""
        self.caught_up = caught_up

    def positioned(self, offset: int) -> None:
        """The consumer was moved to ``offset`` (the committed offset, once opened)."""
        self.rewound_to = offset

    # -- opening ---------------------------------------------------------------------
    async def open(self) -> None:
        """OPENING → RESTORING → READY, each step retried with backoff until ``open_timeout``.

        Raises :class:`PartitionUnservedError` (the partition is then CLOSED) when
        an error is not retriable or the deadline passes.
        """
        deadline = time.monotonic() + self.settings.open_timeout
        try:
            await retry(
                self._open_store_and_producer, deadline, f"{self.name}: open", self.settings.store_lock_wait
            )
            self.lifecycle.move(State.RESTORING)
            await retry(self._restore, deadline, f"{self.name}: restore", self.settings.store_lock_wait)
        except OPEN_ERRORS as exc:
            await self.close(commit=False)
            raise PartitionUnservedError(f"partition {self.name} cannot be served: {exc}") from exc
        except BaseException:
            await self.close(commit=False)
            raise
        self.lifecycle.move(State.READY)
        self.progress_at = time.monotonic()

    async def _open_store_and_producer(self) -> None:
        if self.store is None:  # restored first: written, not read, until READY
            self.store = self.context.open_store_of(self.tp, self.identity, follow=True)
        if self.producer is None:  # its start fences the previous owner and aborts its transaction
            self.producer = await self.context.start_producer(self.tp, self.name)

    async def _restore(self) -> None:
        """Replay the changelog into the store (opened to follow it), then open the store to be served."""
        store, producer = self.store, self.producer
        if store is None or producer is None:
            raise PipelineError(f"{self.name}: restore before open")
        if store.closed:  # reopening it to be served failed on an earlier attempt
            store = self.store = self.context.open_store_of(self.tp, self.identity, follow=True)
        options = self.context.restore_options(self.tp)
        keep, opener = self._keep, self.context.open_store
        applied = await restore_to_serve(
            store, self.changelog, identity=self.identity, opener=opener, keep=keep, **options
        )
        self.metrics.restore_records.inc(applied)
        self.txn = self.context.transaction_for(self.tp, producer, self._keep(), self.changelog)
        self.stage = self.context.stage_for(self.tp, self.txn, self.tally)

    def _keep(self, store: PartitionStore | None = None) -> PartitionStore:
        """Hold ``store`` (one that replaced the last while restoring), or return the one held."""
        if store is not None:
            self.store = store
        if self.store is None:
            raise PipelineError(f"{self.name}: no store")
        return self.store

    # -- records ---------------------------------------------------------------------
    def feed(self, records: Sequence[Any]) -> None:
        """Queue fetched records, dropping any the open transaction already holds (a stale fetch)."""
        txn = self.txn
        expected = txn.next_offset if txn is not None else None
        if expected is not None and records and records[0].offset < expected:
            log.error(
                "%s: fetched offset %s behind the transaction's %s", self.name, records[0].offset, expected
            )
            records = [r for r in records if r.offset >= expected]
        self.queue.extend(records)
        self.queued_bytes += sum(r.serialized_value_size + max(r.serialized_key_size, 0) for r in records)

    def _take(self, count: int) -> list[Any]:
        taken, self.queue = self.queue[:count], self.queue[count:]
        if self.queue:
            self.queued_bytes -= sum(r.serialized_value_size + max(r.serialized_key_size, 0) for r in taken)
        else:
            self.queued_bytes = 0
        return taken

    def _drop_queue(self) -> None:
        self.queue = []
        self.queued_bytes = 0

    async def work(self) -> None:
        """Handle queued records into the open transaction (up to the bisecting limit)."""
        async with self.lock:
            txn, stage = self.txn, self.stage
            if not self.can_work or txn is None or stage is None:
                return
            room = len(self.queue)
            if self.poison.limit is not None:
                room = max(self.poison.limit - txn.records, 0)
            records = self._take(room)
            try:
                await stage.handle(records, self.poison.poison)
            except HandlerFailedError as exc:
                await self._abort(records[0].offset)
                if not self.poison.handler_failed(exc.offset, exc.reason, exc.error):  # not even to the DLQ
                    raise PartitionUnservedError(
                        f"partition {self.name}: offset {exc.offset} cannot even go to the DLQ: {exc.error}"
                    ) from exc
                log.warning(
                    "%s: offset %s failed (%s); aborted, it goes to the DLQ alone",
                    self.name,
                    exc.offset,
                    exc.error,
                )
            except (KafkaError, TransactionFailedError) as exc:
                log.warning("%s: batch failed (%r); aborting and redoing", self.name, exc)
                await self._abort(records[0].offset)
            except StoreError as exc:
                await self._abort(records[0].offset)
                if isinstance(exc, StoreCorruptError):
                    self._wipe = True  # an entry it cannot read: rebuilt from the changelog on the reopen
                self._broken(exc)
            except ProducerFencedError as exc:
                self._fenced(exc)
            except ProducerUnusableError as exc:
                self._broken(exc)

    async def _abort(self, first_fetched: int) -> None:
        """Abort the open transaction and move the consumer back to its first record."""
        self.tally.clear()  # the redo counts them again
        txn = self.txn
        start = first_fetched
        if txn is not None:
            if txn.first_offset is not None:
                start = min(start, txn.first_offset)
            try:
                await txn.abort()
            except ProducerFencedError as exc:
                self._fenced(exc)
            except ProducerUnusableError as exc:
                self._broken(exc)
        self._rewind(start)

    def _rewind(self, offset: int) -> None:
        self._drop_queue()
        self.generation += 1
        self.rewound_to = offset
        self._seek(self.tp, offset)

    def _fenced(self, exc: BaseException) -> None:
        if self.state in (State.READY, State.COMMITTING):
            log.warning("%s: %s; dropping the partition until the group assigns it again", self.name, exc)
            self.lifecycle.move(State.FENCED)

    def _broken(self, exc: BaseException) -> None:
        if self.state in (State.READY, State.COMMITTING):
            log.warning("%s: %s; reopening it", self.name, exc)
            self.lifecycle.move(State.BROKEN)

    # -- commit ----------------------------------------------------------------------
    async def commit(self) -> None:
        """READY → COMMITTING → READY (or BROKEN, FENCED): commit the open transaction.

        Raises :class:`PartitionUnservedError` when a record's outputs cannot be
        written even to the DLQ.
        """
        async with self.lock:
            await self._commit()

    async def _commit(self) -> None:
        txn = self.txn
        if self.state is not State.READY or txn is None:
            return
        if not txn.in_transaction:
            self.progress_at = time.monotonic()
            return
        self.lifecycle.move(State.COMMITTING)
        start, count, end = txn.first_offset, txn.records, txn.next_offset
        began = time.perf_counter()
        try:
            committed, expired = await txn.commit()
        except TransactionFailedError as exc:
            self.tally.clear()
            self.lifecycle.move(State.READY)
            try:
                self._commit_failed(exc, start, count)
            finally:
                if txn.producer.needs_replacing:
                    await self._replace_producer(txn)
            return
        except StoreError as exc:
            self.tally.flush()  # the Kafka side is committed: these outcomes happened
            self._broken(exc)  # restore brings the store level with the changelog
            return
        except ProducerFencedError as exc:
            self.tally.clear()
            self._fenced(exc)
            return
        except ProducerUnusableError as exc:
            self.tally.clear()
            self._broken(exc)
            return
        self.lifecycle.move(State.READY)
        self.tally.flush()
        self.progress_at = time.monotonic()
        self.poison.committed(end)
        self.metrics.commit_seconds.observe(time.perf_counter() - began)
        self.metrics.batch_records.observe(committed)
        if expired:
            self.metrics.keys_expired.inc(expired)

    def _commit_failed(self, exc: TransactionFailedError, start: int | None, count: int) -> None:
        """Rewind after a failed commit; bisect when a non-retriable failure repeats from one offset."""
        cause = exc.__cause__ or exc
        verdict = None
        if start is not None and isinstance(cause, RECORD_ERRORS):
            verdict = self.poison.commit_failed(start, count, cause)
        log.warning("%s: %s; redoing from offset %s (limit %s)", self.name, exc, start, self.poison.limit)
        if start is not None:
            self._rewind(start)
        else:
            self._drop_queue()
        if verdict is not None:
            raise PartitionUnservedError(f"partition {self.name}: {verdict}")

    async def _replace_producer(self, txn: PartitionTransaction) -> None:
        """Start a new producer in place of one whose sequence numbers no longer match the broker's,
        keeping everything else (the poison records and the bisection go on)."""
        log.warning("%s: the broker refused a batch outright; starting a new producer", self.name)
        await txn.producer.stop()
        try:
            producer = await self.context.start_producer(self.tp, self.name)
        except (KafkaError, ProducerFencedError, BrokerUnavailableError) as exc:
            self.producer = None
            self._broken(exc)
            return
        self.producer = txn.producer = producer

    # -- closing ---------------------------------------------------------------------
    async def close(self, *, commit: bool) -> None:
        """Commit (through :meth:`commit`'s path) or abort what is open, release the producer and store, go CLOSED."""
        async with self.lock:
            if self.lifecycle.closed:
                return
            try:
                if commit:
                    try:
                        await self._commit()
                    except PartitionUnservedError as exc:
                        log.warning("%s: could not commit on close: %s", self.name, exc)
                txn = self.txn
                if txn is not None and txn.in_transaction:
                    try:
                        await txn.abort()
                    except (ProducerFencedError, ProducerUnusableError, KafkaError) as exc:
                        log.info("%s: nothing more to abort on close (%s)", self.name, exc)
            finally:
                self.lifecycle.move(State.CLOSED)  # every state but CLOSED may close
                await self._release()
                log.info("%s: closed", self.name)

    async def _release(self) -> None:
        producer, store = self.producer, self.store
        self.producer = self.store = None
        if producer is not None:
            await producer.stop()
        if store is not None:
            self.position = directory.release(store, wipe=self._wipe, name=self.name)
