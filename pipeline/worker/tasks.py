"""The task table: every partition this worker serves (an :class:`~pipeline.worker.task.ActiveTask`)
and every one it keeps warm for another (the standbys), from assignment to release.

The group's rebalance callbacks come here (through the worker, under its lock). Each
assigned partition gets a task, paused, opened in the background
(:meth:`TaskTable._open`: the old per-partition transactional id fenced, the committed
offset read stable, the store restored to its changelog's end) and then moved to its
committed offset and resumed. A revoked one is closed at once. Between a revocation and
the next assignment (a rebalance under way) nothing is reopened: aiokafka still shows the
old assignment. A BROKEN task is closed and opened again while the group still assigns it
here; a partition assigned and unserved for ``open_timeout`` fails the worker
(:meth:`TaskTable.watch`).

The consumer is moved only from here: a task's committed offset when it opens, and its
first record in an aborted transaction (:meth:`TaskTable.apply`), each seek also dropping
what was fetched of it and not yet handed out (:meth:`~pipeline.worker.fetch.LoopFetch.forget`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from pipeline.cancelling import cancel_and_wait
from pipeline.errors import PartitionUnservedError, PipelineError
from pipeline.state.store import PartitionStore
from pipeline.state.transaction import Transaction
from pipeline.topology import CHANGELOG_MARGIN
from pipeline.worker.clients import legacy_transactional_id
from pipeline.worker.context import PartitionContext
from pipeline.worker.executor import Outcome
from pipeline.worker.fetch import LoopFetch
from pipeline.worker.io import GroupLink, WorkerIO
from pipeline.worker.lifecycle import PartitionState
from pipeline.worker.observe import forget_partition, observe_lag, observe_store, warn_if_behind
from pipeline.worker.opening import OPEN_ERRORS, retry
from pipeline.worker.pacing import caught_up
from pipeline.worker.standbys import StandbyReplicas
from pipeline.worker.task import ActiveTask

log = logging.getLogger(__name__)

MARGIN_MS = int(CHANGELOG_MARGIN.total_seconds() * 1000)  # how far the changelog outlasts the largest TTL


def _order(tp: TopicPartition) -> tuple[str, int]:
    return (tp.topic, tp.partition)


class TaskTable:
    """The worker's tasks, active and standby (see the module docstring)."""

    def __init__(
        self,
        context: PartitionContext,
        changelogs: Mapping[str, str],
        *,
        io: WorkerIO,
        consumer: AIOKafkaConsumer,
        group: GroupLink,
        txn: Transaction,
        standbys: StandbyReplicas,
        fetch: LoopFetch,
    ) -> None:
        self.context = context
        self.settings = context.worker_settings
        self.metrics = context.metrics
        self._changelogs = dict(changelogs)  # consumed topic -> the changelog of its seen-set
        self.io = io
        self.consumer = consumer
        self.group = group
        self.txn = txn
        self.standbys = standbys
        self.fetch = fetch
        self.tasks: dict[TopicPartition, ActiveTask] = {}
        self.opening: dict[TopicPartition, asyncio.Task[None]] = {}
        self.failure: PipelineError | None = None  # what stops the worker
        self.stopping = False  # nothing new opens (the next owner takes them)
        self._unserved_since: dict[TopicPartition, float] = {}
        self._rebalancing = False  # between a revocation and the next assignment

    # -- the group's word ----------------------------------------------------------------
    async def assigned(self, assigned: set[TopicPartition]) -> None:
        """Promote the standbys of partitions now served here, then open each new partition in the background.

        A new task stays paused until it is restored and positioned: a record handled before
        the seek to the committed offset would be handled at the wrong position.
        """
        self._rebalancing = False
        await self.standbys.assigned(assigned)  # a promoted standby closes its store first
        fresh = sorted((tp for tp in assigned if tp not in self.tasks), key=_order)
        if not fresh or self.stopping:
            return
        log.info("partitions assigned: %s", [f"{tp.topic}-{tp.partition}" for tp in fresh])
        for tp in fresh:
            self._begin_open(tp)

    async def revoked(self, revoked: Iterable[TopicPartition]) -> None:
        """Close the revoked tasks (the worker committed or aborted its transaction first)."""
        self._rebalancing = True
        gone = sorted(revoked, key=_order)
        if gone:
            log.info("partitions revoked: %s", [f"{tp.topic}-{tp.partition}" for tp in gone])
        for tp in gone:
            self._unserved_since.pop(tp, None)
            await self._cancel_opening(tp)
            task = self.tasks.pop(tp, None)
            if task is not None:
                self._release(task)

    async def _cancel_opening(self, tp: TopicPartition) -> None:
        opening = self.opening.pop(tp, None)
        if opening is not None:
            with contextlib.suppress(PipelineError):
                await cancel_and_wait(opening)

    def _assigned(self, tp: TopicPartition) -> bool:
        """Whether ``tp`` is this worker's now: assigned, and no rebalance under way."""
        return not self._rebalancing and tp in self.consumer.assignment()

    # -- opening -------------------------------------------------------------------------
    def _begin_open(self, tp: TopicPartition) -> None:
        self.consumer.pause(tp)
        task = ActiveTask(
            tp, changelog=TopicPartition(self._changelogs[tp.topic], tp.partition), context=self.context
        )
        task.paused = True
        self.tasks[tp] = task
        self.metrics.partitions.set(len(self.tasks))
        self.opening[tp] = asyncio.create_task(self._opening(task), name=f"open {task.name}")

    async def _opening(self, task: ActiveTask) -> None:
        """The opening task: :meth:`_open`, which handles every error it expects; a bug in it is logged whole
        and stops the worker naming the partition, never a partition left READY without a position, unseen."""
        try:
            await self._open(task)
        except Exception as exc:  # a bug (see the docstring)
            if isinstance(exc.__context__, GeneratorExit):
                raise  # no open failed: its coroutine is closed unfinished (its process gone), outside any loop
            log.exception("%s: opening failed", task.name)
            task.close()
            if self.tasks.get(task.tp) is task:
                self.fail(PartitionUnservedError(f"partition {task.name} cannot be served: {exc!r}"))

    async def _open(self, task: ActiveTask) -> None:
        """Open ``task`` and move the consumer to its committed offset; a failure stops the worker.

        The order matters. The old per-partition transactional id is fenced first (a worker of an
        older version that served the partition has its open transaction aborted); the committed
        offset is read stable (a transaction of the previous owner that holds it is waited out);
        only then is the changelog restored, to its log end, so that what the previous owner
        committed is in the store before this worker handles the partition's next record.
        """
        tp = task.tp
        deadline = time.monotonic() + self.settings.open_timeout
        lock_wait = self.settings.store_lock_wait
        try:
            await retry(lambda: self._fence_legacy(task), deadline, f"{task.name}: fence", lock_wait)
            committed = await self._committed(task, deadline)
            await task.open(self.txn, deadline)
            if not self._still_ours(task):
                self._drop_stale(task)
                return
            if committed is None:
                await self.consumer.seek_to_beginning(tp)
                position = await self.consumer.position(tp)
                if not self._still_ours(task):
                    self._drop_stale(task)
                    return
            else:
                self.consumer.seek(tp, committed)
                position = committed
            self.fetch.forget(tp)
            task.positioned(position)
            task.paused = False
            self.consumer.resume(tp)
            log.info("%s: ready at committed offset %s", task.name, committed)
        except PartitionUnservedError as exc:
            task.close()
            if self.tasks.get(tp) is task:
                self.fail(exc)
        except OPEN_ERRORS as exc:  # a step's retries ran out: never an opening that ends unnoticed
            task.close()
            if self.tasks.get(tp) is task:
                self.fail(PartitionUnservedError(f"partition {task.name} cannot be served: {exc}"))
        finally:
            if self.opening.get(tp) is asyncio.current_task():
                del self.opening[tp]

    async def _fence_legacy(self, task: ActiveTask) -> None:
        """Abort and fence what a worker of an older version (one producer per partition) holds open; a
        broker away raises (retried); a refusal retrying cannot change (authorization) is logged and passed."""
        app, group = self.context.topology.app, self.settings.group
        txn_id = legacy_transactional_id(app, group, task.tp.topic, task.tp.partition)
        try:
            await self.io.fence(self.txn.producer.client, txn_id)
        except KafkaError as exc:
            if exc.retriable:
                raise
            log.warning("%s: cannot fence %s (%r); going on", task.name, txn_id, exc)

    async def _committed(self, task: ActiveTask, deadline: float) -> int | None:
        """The group's committed offset of the task's partition, read stable, retried until ``deadline``."""
        found: dict[TopicPartition, int | None] = {}

        async def read() -> None:
            found.update(await self.group.committed([task.tp]))

        await retry(read, deadline, f"{task.name}: committed offset", self.settings.store_lock_wait)
        return found.get(task.tp)

    def _still_ours(self, task: ActiveTask) -> bool:
        return self.tasks.get(task.tp) is task and self._assigned(task.tp)

    def _drop_stale(self, task: ActiveTask) -> None:
        """Close a task revoked (or replaced) while it opened, and take it out of the table."""
        if self.tasks.get(task.tp) is task:
            del self.tasks[task.tp]
        self._release(task)

    def _release(self, task: ActiveTask) -> None:
        """Close a task out of the table: its store released, its gauges gone."""
        task.close()
        self.standbys.remember(task.tp, task.released_at)
        forget_partition(self.metrics, task.tp)
        self.metrics.partitions.set(len(self.tasks))

    # -- records ---------------------------------------------------------------------------
    def feed(self, batches: Mapping[TopicPartition, list[Any]]) -> None:
        """Hand each serving task what was fetched of it (nothing for a task opening or gone)."""
        for tp, records in batches.items():
            task = self.tasks.get(tp)
            if task is not None and task.serving and records:
                task.feed(records)

    def mark_caught_up(self, fetched: Iterable[TopicPartition]) -> None:
        """Each task's word on whether everything up to its log's stable end is handled."""
        got = set(fetched)
        for tp, task in self.tasks.items():
            task.caught_up = caught_up(self.consumer, task, fetched=tp in got)

    def apply(self, outcome: Outcome) -> None:
        """Move the tasks of an aborted transaction back to their first record in it; stop on a fatal."""
        for tp, offset in outcome.rewind.items():
            task = self.tasks.get(tp)
            if task is None or not task.serving:
                continue
            task.rewind(offset)
            if tp in self.consumer.assignment():
                self.consumer.seek(tp, offset)
                self.fetch.forget(tp)
        if outcome.rejoin:
            self.group.rejoin()
        if outcome.fatal is not None:
            self.fail(outcome.fatal)

    def backpressure(self) -> None:
        """Pause a task whose queue reached ``fetch_records`` or ``queue_bytes``; resume it once it drains."""
        assignment = self.consumer.assignment()
        for tp, task in self.tasks.items():
            if tp not in assignment or not task.serving:
                continue
            full = (
                len(task.queue) >= self.settings.fetch_records
                or task.queued_bytes >= self.settings.queue_bytes
            )
            if full and not task.paused:
                self.consumer.pause(tp)
                task.paused = True
            elif not full and task.paused:
                task.paused = False
                self.consumer.resume(tp)

    def mark_idle(self) -> None:
        """A task with nothing to do counts as making progress (it is never stuck)."""
        for task in self.tasks.values():
            task.idle()

    def observe(self) -> None:
        """The serving tasks' gauges after a commit: lag, store keys and bytes, stream time behind the clock."""
        for task in self.tasks.values():
            if task.serving and task.store is not None:
                observe_lag(self.metrics, self.consumer, task)
                task.disk_measured_at = observe_store(self.metrics, task, task.disk_measured_at)
                task.behind_warned_at = warn_if_behind(task, MARGIN_MS, task.behind_warned_at)

    # -- upkeep ----------------------------------------------------------------------------
    def reap(self) -> None:
        """Close BROKEN tasks (the transaction holds none of them: it was aborted or committed), and
        open each again while the group still assigns it here."""
        for tp, task in list(self.tasks.items()):
            if task.state is not PartitionState.BROKEN:
                continue
            self.consumer.pause(tp)
            del self.tasks[tp]
            self._release(task)
            if self._assigned(tp) and not self.stopping:
                log.warning("%s: reopening", task.name)
                self._begin_open(tp)

    def watch(self) -> None:
        """Fail the worker when an assigned partition stays unserved past ``open_timeout``."""
        now = time.monotonic()
        assigned = self.consumer.assignment() if not self._rebalancing else set()
        for tp in list(self._unserved_since):
            task = self.tasks.get(tp)
            if tp not in assigned or (task is not None and task.serving):
                del self._unserved_since[tp]
        for tp in assigned:
            task = self.tasks.get(tp)
            if task is not None and (task.serving or tp in self.opening):
                continue
            since = self._unserved_since.setdefault(tp, now)
            if now - since > self.settings.open_timeout:
                self.fail(
                    PartitionUnservedError(
                        f"partition {tp.topic}-{tp.partition} is assigned but not served for "
                        f"{self.settings.open_timeout:g}s"
                    )
                )

    def fail(self, exc: PipelineError) -> None:
        """Stop the worker with ``exc`` (the first failure is the one reported)."""
        log.error("%s", exc)
        if self.failure is None:
            self.failure = exc
        self.fetch.wake()

    def served_stores(self) -> dict[tuple[str, int], PartitionStore]:
        """The store of each partition served now (for ``/keys``)."""
        return {
            (tp.topic, tp.partition): task.store
            for tp, task in self.tasks.items()
            if task.serving and task.store is not None
        }

    def positions(self) -> dict[TopicPartition, int]:
        """The changelog position of each open store of a partition served here (for the group)."""
        return {
            tp: task.store.changelog_offset
            for tp, task in self.tasks.items()
            if task.store is not None and not task.store.closed
        }

    async def close(self) -> None:
        """Close every task (the worker stops; its transaction is committed or aborted already)."""
        self.stopping = True
        for tp in list(self.opening):
            await self._cancel_opening(tp)
        for tp in sorted(self.tasks, key=_order):
            self._release(self.tasks[tp])
        self.tasks.clear()
        await self.standbys.close()
