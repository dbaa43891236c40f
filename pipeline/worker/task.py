"""One active task: a partition this worker serves, with the only hold on its store, stage and queue.

Its life is a checked state machine (:mod:`pipeline.worker.lifecycle`); the task table
(:mod:`pipeline.worker.tasks`) opens and closes it, and the executor
(:mod:`pipeline.worker.executor`) has it handle its queued records into the worker's
transaction. A task decides nothing about a failure beyond itself: it raises, and the
executor decides what the worker's transaction does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from aiokafka import TopicPartition

from pipeline.errors import PartitionUnservedError, PipelineError, StoreCorruptError
from pipeline.state import directory
from pipeline.state.partition_transaction import PartitionTransaction
from pipeline.state.store import PartitionStore
from pipeline.state.transaction import PartCommitted, Transaction
from pipeline.worker.context import PartitionContext
from pipeline.worker.lifecycle import Lifecycle, PartitionState
from pipeline.worker.metrics import Tally
from pipeline.worker.opening import OPEN_ERRORS, restore_to_serve, retry
from pipeline.worker.poison import PoisonTracker
from pipeline.worker.stage import Stage

log = logging.getLogger(__name__)

State = PartitionState


class ActiveTask:
    """A served partition: store, stage, part of the transaction, fetched records, poison, lifecycle."""

    def __init__(self, tp: TopicPartition, *, changelog: TopicPartition, context: PartitionContext) -> None:
        self.tp = tp
        self.name = f"{tp.topic}-{tp.partition}"
        self.changelog = changelog
        self.context = context
        self.settings = context.worker_settings
        self.metrics = context.metrics
        self.lifecycle = Lifecycle.partition(self.name)
        self.identity = context.identity(tp, changelog)
        self.queue: list[Any] = []  # fetched, not yet handled
        self.queued_bytes = 0
        self.position = 0  # the offset the consumer was last moved to
        self.caught_up = False  # everything fetched is handled and the log's stable end reached
        self.paused = False  # by the loop, because records piled up
        self.poison = PoisonTracker(self.name)
        self.tally = Tally(context.metrics)  # outcomes in the open transaction: flushed at its commit
        self.progress_at = time.monotonic()  # last commit, or last moment with nothing to do
        self.disk_measured_at = 0.0
        self.behind_warned_at = float("-inf")  # when stream time was last said to be behind the margin
        self.store: PartitionStore | None = None
        self.part: PartitionTransaction | None = None
        self.stage: Stage | None = None
        self.released_at: int | None = None  # the checked offset its store left on disk (release)
        self._wipe = False  # the store cannot be read: wipe it when released

    # -- state -----------------------------------------------------------------------
    @property
    def state(self) -> PartitionState:
        """The lifecycle state."""
        return self.lifecycle.state

    @property
    def serving(self) -> bool:
        """READY: its records are handled."""
        return self.lifecycle.serving

    @property
    def in_transaction(self) -> bool:
        """Whether the worker's open transaction holds records of this task."""
        return self.part is not None and self.part.in_transaction

    @property
    def can_work(self) -> bool:
        """READY with queued records that the transaction has room for (not held at a bisecting limit)."""
        if self.state is not State.READY or not self.queue:
            return False
        limit = self.poison.limit
        return limit is None or self.part is None or self.part.records < limit

    @property
    def at_limit(self) -> bool:
        """Bisecting, and the open transaction holds as many of its records as it may."""
        limit = self.poison.limit
        return limit is not None and self.part is not None and self.part.records >= limit

    def stuck(self, now: float) -> bool:
        """Serving, with work waiting, and no commit for ``stuck_after`` seconds."""
        busy = bool(self.queue) or self.in_transaction
        return self.serving and busy and now - self.progress_at > self.settings.stuck_after

    # -- opening ---------------------------------------------------------------------
    async def open(self, txn: Transaction, deadline: float) -> None:
        """OPENING → RESTORING → READY: the store opened and restored to its changelog's end, each step
        retried with backoff until ``deadline``.

        Raises :class:`PartitionUnservedError` (the task is then CLOSED) when an error is not
        retriable or the deadline passes.
        """
        try:
            await retry(self._open_store, deadline, f"{self.name}: open", self.settings.store_lock_wait)
            self.lifecycle.move(State.RESTORING)
            await retry(self._restore, deadline, f"{self.name}: restore", self.settings.store_lock_wait)
        except OPEN_ERRORS as exc:
            self.close()
            raise PartitionUnservedError(f"partition {self.name} cannot be served: {exc}") from exc
        except BaseException:
            self.close()
            raise
        store = self._held()
        self.part = self.context.part_for(self.tp, txn, store, self.changelog)
        self.stage = self.context.stage_for(self.tp, self.part, self.tally)
        self.lifecycle.move(State.READY)
        self.progress_at = time.monotonic()

    async def _open_store(self) -> None:
        if self.store is None:  # restored first: written, not read, until READY
            self.store = self.context.open_store_of(self.tp, self.identity, follow=False)

    async def _restore(self) -> None:
        """Replay the changelog into the store (opened to follow it), then open the store to be served."""
        store = self._held()
        if store.closed:  # reopening it failed on an earlier attempt
            store = self.store = self.context.open_store_of(self.tp, self.identity, follow=False)
        restorer = self.context.require_restorer()
        applied = await restore_to_serve(
            store,
            self.changelog,
            identity=self.identity,
            opener=self.context.open_store,
            keep=self._keep,
            restorer=restorer,
            progress_every=self.settings.restore_progress_every,
            remaining=self.metrics.restore_remaining.labels(self.tp.topic, str(self.tp.partition)),
        )
        self.metrics.restore_records.inc(applied)

    def _keep(self, store: PartitionStore) -> None:
        """Hold ``store``, one that replaced the last while restoring."""
        self.store = store

    def _held(self) -> PartitionStore:
        if self.store is None:
            raise PipelineError(f"{self.name}: no store")
        return self.store

    def positioned(self, offset: int) -> None:
        """The consumer was moved to ``offset`` (the committed offset, or a rewind)."""
        self.position = offset

    # -- records ---------------------------------------------------------------------
    def feed(self, records: Sequence[Any]) -> None:
        """Queue fetched records."""
        self.queue.extend(records)
        self.queued_bytes += sum(r.serialized_value_size + max(r.serialized_key_size, 0) for r in records)

    def _take(self, count: int) -> list[Any]:
        taken, self.queue = self.queue[:count], self.queue[count:]
        if self.queue:
            self.queued_bytes -= sum(r.serialized_value_size + max(r.serialized_key_size, 0) for r in taken)
        else:
            self.queued_bytes = 0
        return taken

    async def work(self) -> None:
        """Handle queued records (up to the bisecting limit) into the worker's transaction.

        Raises what handling raises (:class:`~pipeline.worker.stage.HandlerFailedError` naming a
        record, a store error, the producer's errors): the executor aborts the transaction.
        """
        part, stage = self.part, self.stage
        if not self.can_work or part is None or stage is None:
            return
        room = len(self.queue)
        if self.poison.limit is not None:
            room = max(self.poison.limit - part.records, 0)
        records = self._take(room)
        part.taken(records[0].offset)
        await stage.handle(records, self.poison.poison)

    def rewind(self, offset: int) -> None:
        """Its records in the aborted transaction, and those queued, are to be fetched again from ``offset``."""
        self.tally.clear()  # the redo counts them again
        self.queue = []
        self.queued_bytes = 0
        self.position = offset
        self.caught_up = False

    def committed(self, result: PartCommitted, end: int | None) -> None:
        """The worker's transaction committed this task's records up to ``end``: count them, and say
        whether the store write after it failed (the task is then BROKEN)."""
        self.tally.flush()  # the Kafka side is committed: these outcomes happened
        self.progress_at = time.monotonic()
        self.poison.committed(end)
        self.metrics.batch_records.observe(result.records)
        if result.expired:
            self.metrics.keys_expired.inc(result.expired)
        if result.store_error is not None:
            self.broken(result.store_error)

    def idle(self) -> None:
        """Nothing to do now: counts as progress (a task without work is never stuck)."""
        if not self.queue and not self.in_transaction:
            self.progress_at = time.monotonic()

    def broken(self, exc: BaseException) -> None:
        """Its store failed (or cannot be read: ``StoreCorruptError`` wipes it on release): BROKEN, reopened."""
        if isinstance(exc, StoreCorruptError):
            self._wipe = True
        if self.state is State.READY:
            log.warning("%s: %s; reopening it", self.name, exc)
            self.lifecycle.move(State.BROKEN)

    # -- closing ---------------------------------------------------------------------
    def close(self) -> None:
        """Release the store (its lock) and go CLOSED; what the transaction held of it is the executor's."""
        if self.lifecycle.closed:
            return
        self.lifecycle.move(State.CLOSED)  # every state but CLOSED may close
        store, self.store = self.store, None
        self.part = None
        self.stage = None
        self.queue = []
        self.queued_bytes = 0
        if store is not None:  # what it holds if checked against the changelog (a restore not done: unknown)
            self.released_at = directory.release(store, wipe=self._wipe, name=self.name)
        log.info("%s: closed", self.name)
