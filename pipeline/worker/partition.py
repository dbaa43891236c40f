"""One owned partition: the only owner of its store, transactional producer, transaction and stage.

Its life is a checked state machine (:mod:`pipeline.worker.lifecycle`). The
loop feeds it records (:meth:`Partition.feed`), asks it to handle them
(:meth:`Partition.work`) and to commit (:meth:`Partition.commit`), and reads
back where the consumer must go (the ``seek`` callback it was given). What it
does on each failure:

- handling one record raises: abort, rewind, and redo with that record as
  poison (to the DLQ alone);
- a commit the broker refuses: abort and rewind; a retriable error (broker
  down, timeouts) is simply redone, and a non-retriable one that repeats
  from the same offset bisects the transaction until the offending record is
  alone, and that record goes to the DLQ (``unproducible``);
- fenced: FENCED, dropped by the loop;
- the producer went fatal, or the store write after a Kafka commit failed:
  BROKEN, closed and opened again by the loop (restore repairs the store).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import (
    IllegalOperation,
    KafkaError,
)

from pipeline.config import WorkerSettings
from pipeline.errors import (
    PartitionFencedError,
    PartitionUnservedError,
    PipelineError,
    StoreError,
)
from pipeline.kafka.clients import transactional_producer
from pipeline.state.store import PartitionStore
from pipeline.state.transaction import PartitionTransaction, TransactionFailedError
from pipeline.topology import Topology
from pipeline.worker.classify import Classifier
from pipeline.worker.effect_stage import EffectStage
from pipeline.worker.emitter import OutputTopics
from pipeline.worker.event_stage import EventStage
from pipeline.worker.lifecycle import Lifecycle, PartitionState
from pipeline.worker.metrics import Tally, WorkerMetrics
from pipeline.worker.opening import OPEN_ERRORS, open_store, retry
from pipeline.worker.poison import RECORD_ERRORS, PoisonTracker
from pipeline.worker.restore import restore
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
        settings: WorkerSettings,
        topology: Topology,
        classifier: Classifier,
        outputs: OutputTopics,
        metrics: WorkerMetrics,
        seek: Callable[[TopicPartition, int], None],
    ) -> None:
        self.tp = tp
        self.name = f"{tp.topic}-{tp.partition}"
        self.changelog = changelog
        self.settings = settings.for_topology(topology.app)
        self.topology = topology
        self.classifier = classifier
        self.outputs = outputs
        self.metrics = metrics
        self._seek = seek
        self.lifecycle = Lifecycle(self.name)
        self.lock = asyncio.Lock()
        self.queue: list[Any] = []  # fetched, not yet handled (held while a commit runs)
        self.generation = 0  # moves at every seek: records fetched before it are stale
        self.rewound_to = 0  # where the last seek moved the consumer (the loop keeps it)
        self.caught_up = False  # everything fetched is handled and the log's end reached (the loop says)
        self.poison = PoisonTracker(self.name)
        self.tally = Tally(metrics)  # outcomes of the open transaction: flushed at commit, cleared at abort
        self.progress_at = time.monotonic()  # last commit, or last moment with nothing to do
        self.disk_measured_at = 0.0
        self.store: PartitionStore | None = None
        self.producer: AIOKafkaProducer | None = None
        self.txn: PartitionTransaction | None = None
        self.stage: Stage | None = None

    # -- state -----------------------------------------------------------------------
    @property
    def state(self) -> PartitionState:
        """The lifecycle state."""
        return self.lifecycle.state

    @property
    def state_since(self) -> float:
        """When the partition entered its state (``time.monotonic()``): a commit's start while COMMITTING."""
        return self.lifecycle.since

    @property
    def serving(self) -> bool:
        """READY or COMMITTING."""
        return self.lifecycle.serving

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
        if self.store is None:
            self.store = open_store(self.settings, self.topology, self.tp, self.changelog)
        if self.producer is None:
            txn_id = f"{self.topology.app}-{self.settings.group}-{self.tp.topic}-{self.tp.partition}"
            producer = transactional_producer(self.settings, txn_id)
            try:
                await producer.start()  # InitProducerId: fences the previous owner, aborts its transaction
            except BaseException:
                await _stop_quietly(producer, self.name)
                raise
            self.producer = producer

    async def _restore(self) -> None:
        store, producer = self.store, self.producer
        if store is None or producer is None:
            raise PipelineError(f"{self.name}: restore before open")
        remaining = self.metrics.restore_remaining.labels(self.tp.topic, str(self.tp.partition))
        applied = await restore(
            store,
            self.changelog,
            bootstrap=self.settings.bootstrap,
            fetch_bytes=self.settings.restore_fetch_bytes,
            progress_every=self.settings.restore_progress_every,
            remaining=remaining,
        )
        self.metrics.restore_records.inc(applied)
        self.txn = PartitionTransaction(
            tp=self.tp,
            group=self.settings.group,
            producer=producer,
            store=store,
            changelog=self.changelog,
            limits=self.outputs.limits,
            send_bytes=self.settings.send_bytes,
        )
        self.stage = self._stage(self.txn)

    def _stage(self, txn: PartitionTransaction) -> Stage:
        if self.tp.topic == self.topology.topics.input:
            return EventStage(
                tp=self.tp,
                topology=self.topology,
                classifier=self.classifier,
                txn=txn,
                outputs=self.outputs,
                recorder=self.tally,
                chunk_records=self.settings.chunk_records,
            )
        return EffectStage(
            tp=self.tp,
            topology=self.topology,
            txn=txn,
            outputs=self.outputs,
            recorder=self.tally,
            chunk_records=self.settings.chunk_records,
        )

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

    async def work(self) -> None:
        """Handle queued records into the open transaction (up to the bisecting limit)."""
        async with self.lock:
            txn, stage = self.txn, self.stage
            if self.state is not State.READY or not self.queue or txn is None or stage is None:
                return
            room = len(self.queue)
            if self.poison.limit is not None:
                room = max(self.poison.limit - txn.records, 0)
                if room == 0:
                    return
            records, self.queue = self.queue[:room], self.queue[room:]
            try:
                await stage.handle(records, self.poison.poison)
            except HandlerFailedError as exc:
                await self._rewind(records[0].offset)
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
            except PartitionFencedError:
                self._fenced()
            except (KafkaError, IllegalOperation, TransactionFailedError) as exc:
                log.warning("%s: batch failed (%r); aborting and redoing", self.name, exc)
                await self._rewind(records[0].offset)
            except StoreError as exc:
                log.warning("%s: the store failed (%s); reopening", self.name, exc)
                await self._rewind(records[0].offset)
                if self.state is State.READY:
                    self.lifecycle.move(State.BROKEN)

    async def _rewind(self, first_fetched: int) -> None:
        """Abort the transaction and move the consumer back to its first record; BROKEN if that fails."""
        self.tally.clear()  # the redo counts them again
        txn = self.txn
        start = first_fetched
        if txn is not None:
            if txn.first_offset is not None:
                start = min(start, txn.first_offset)
            await txn.abort()
            if txn.broken:
                self.lifecycle.move(State.BROKEN)
                return
        self.queue.clear()
        self.generation += 1
        self._seek(self.tp, start)

    def _fenced(self) -> None:
        log.warning("%s: fenced by a newer owner; dropping the partition", self.name)
        self.lifecycle.move(State.FENCED)

    # -- commit ----------------------------------------------------------------------
    async def commit(self) -> None:
        """READY → COMMITTING → READY (or BROKEN, FENCED): commit the open transaction."""
        async with self.lock:
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
            except PartitionFencedError:
                self.tally.clear()
                self._fenced()
                return
            except TransactionFailedError as exc:
                self.tally.clear()
                self._commit_failed(exc, start, count)
                return
            except StoreError as exc:
                self.tally.flush()  # the Kafka side is committed: these outcomes happened
                log.warning("%s: the store write after the commit failed (%s); reopening", self.name, exc)
                self.lifecycle.move(State.BROKEN)
                return
            self.lifecycle.move(State.READY)
            self._committed(committed, expired, time.perf_counter() - began, end)

    def _committed(self, records: int, expired: int, seconds: float, end: int | None) -> None:
        self.tally.flush()
        self.progress_at = time.monotonic()
        self.poison.committed(end)
        self.metrics.commit_seconds.observe(seconds)
        self.metrics.batch_records.observe(records)
        if expired:
            self.metrics.keys_expired.inc(expired)

    def _commit_failed(self, exc: TransactionFailedError, start: int | None, count: int) -> None:
        """Rewind after a failed commit; bisect when a non-retriable failure repeats from one offset."""
        txn = self.txn
        if txn is None or txn.broken:
            log.warning("%s: %s; the producer will be replaced", self.name, exc)
            self.lifecycle.move(State.BROKEN)
            return
        self.lifecycle.move(State.READY)
        cause = exc.refused or exc
        if start is not None and isinstance(cause, RECORD_ERRORS):
            self.poison.commit_failed(start, count, cause)
        log.warning("%s: %s; redoing from offset %s (limit %s)", self.name, exc, start, self.poison.limit)
        self.queue.clear()
        self.generation += 1
        if start is not None:
            self._seek(self.tp, start)

    # -- closing ---------------------------------------------------------------------
    async def close(self, *, commit: bool) -> None:
        """Commit (or abort) what is open, release the producer and the store, and go CLOSED."""
        if self.lifecycle.closed:
            return
        txn = self.txn
        try:
            if txn is not None and txn.in_transaction:
                if commit and self.state is State.READY and not txn.broken:
                    try:
                        await txn.commit()
                        self.tally.flush()
                    except (PartitionFencedError, TransactionFailedError, StoreError) as exc:
                        log.warning("%s: could not commit on close: %s", self.name, exc)
                else:
                    await txn.abort()
        finally:
            self.lifecycle.move(State.CLOSED)  # every state but CLOSED may close
            await self._release()
            log.info("%s: closed", self.name)

    async def _release(self) -> None:
        producer, store = self.producer, self.store
        self.producer = self.store = None
        if producer is not None:
            await _stop_quietly(producer, self.name)
        if store is not None:
            with contextlib.suppress(StoreError):
                store.close()


async def _stop_quietly(producer: AIOKafkaProducer, name: str) -> None:
    try:
        await producer.stop()
    except (KafkaError, IllegalOperation, AssertionError, OSError) as exc:  # a producer that went fatal
        log.warning("%s: producer did not stop cleanly: %r", name, exc)
