"""Which partitions a worker owns now: opening them on assignment, closing them on revocation, reopening.

:class:`Ownership` is the worker's table of owned partitions (:class:`Owned`) and the only
code that adds to it or takes from it. The group's rebalance callbacks come here
(through :class:`~pipeline.worker.loop.Worker`); each assigned partition is paused,
opened in the background and positioned at its committed offset; a revoked one is taken
out of the table at once, then committed and released. Between a revocation and the next
assignment (a rebalance under way) nothing is reopened: aiokafka still shows the old
assignment. A BROKEN partition is closed and opened again while the group still assigns it
here; a FENCED one makes the worker rejoin. A partition assigned and unserved for
``open_timeout`` fails the worker (:meth:`Ownership.watch`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from pipeline.errors import PartitionUnservedError, PipelineError
from pipeline.kafka import internals
from pipeline.worker.context import PartitionContext
from pipeline.worker.lifecycle import PartitionState
from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.observe import forget_partition
from pipeline.worker.partition import Partition
from pipeline.worker.settings import WorkerSettings
from pipeline.worker.standbys import StandbyReplicas

log = logging.getLogger(__name__)

_T = TypeVar("_T")
COMMITTED_RETRY_S = 1.0  # between attempts to read a partition's committed offset


@dataclass
class Owned:
    """One partition this worker owns, and what the loop runs for it."""

    part: Partition
    opening: asyncio.Task[None] | None = None
    committing: asyncio.Task[None] | None = None
    paused: bool = False  # by the loop, because records piled up
    disk_measured_at: float = 0.0
    behind_warned_at: float = float("-inf")  # when the loop last warned stream time fell behind the margin


class Ownership:
    """The partitions a worker owns, from assignment to release."""

    def __init__(
        self,
        settings: WorkerSettings,
        metrics: WorkerMetrics,
        changelogs: Mapping[str, str],
        *,
        stopping: asyncio.Event,
        seek: Callable[[TopicPartition, int], None],
        fail: Callable[[PipelineError], None],
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self._changelogs = dict(changelogs)  # consumed topic -> the changelog of its seen-set
        self._stopping = stopping  # set: nothing new opens (the next owner takes them)
        self._seek = seek
        self._fail = fail
        self._owned: dict[TopicPartition, Owned] = {}
        self._unserved_since: dict[TopicPartition, float] = {}  # assigned partitions not served yet
        self._rebalancing = False  # between a revocation and the next assignment
        self._consumer: AIOKafkaConsumer | None = None
        self._context: PartitionContext | None = None
        self._standbys: StandbyReplicas | None = None

    def attach(
        self, consumer: AIOKafkaConsumer, context: PartitionContext, standbys: StandbyReplicas
    ) -> None:
        """The worker's consumer, partition context and standbys, once it has started them."""
        self._consumer, self._context, self._standbys = consumer, context, standbys

    @property
    def owned(self) -> dict[TopicPartition, Owned]:
        """The partitions owned now (read it; only this class changes it)."""
        return self._owned

    def take_all(self) -> list[Owned]:
        """Every owned partition, taken out of the table (the worker stops)."""
        owned = list(self._owned.values())
        self._owned.clear()
        return owned

    async def partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        """Take the revoked partitions out of the table at once, then commit what they hold and release them."""
        self._rebalancing = True
        gone = [
            self._owned.pop(tp)
            for tp in sorted(revoked, key=lambda t: (t.topic, t.partition))
            if tp in self._owned
        ]
        if revoked:
            log.info("partitions revoked: %s", sorted(f"{tp.topic}-{tp.partition}" for tp in revoked))
        for tp in revoked:
            self._unserved_since.pop(tp, None)
        for owned in gone:
            if owned.opening is not None:
                owned.opening.cancel()
        for owned in gone:
            if owned.opening is not None:
                with contextlib.suppress(asyncio.CancelledError, PipelineError):
                    await owned.opening
        await asyncio.gather(*(self.close(owned, commit=True) for owned in gone))

    async def partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        """Pause each new partition and open them all concurrently, in the background.

        The consumer may fetch while a partition opens; a record handled before
        the seek to the committed offset would be handled at the wrong position,
        so the partition stays paused until it is READY and positioned.
        """
        self._rebalancing = False
        consumer = self._require(self._consumer)
        await self._require(self._standbys).assigned(assigned)  # a promoted standby closes first
        fresh = sorted((tp for tp in assigned if tp not in self._owned), key=lambda t: (t.topic, t.partition))
        if not fresh or self._stopping.is_set():  # stopping: nothing new opens (the next owner takes them)
            return
        log.info("partitions assigned: %s", [f"{tp.topic}-{tp.partition}" for tp in fresh])
        consumer.pause(*fresh)
        for tp in fresh:
            self._begin_open(tp)

    def _begin_open(self, tp: TopicPartition) -> None:
        consumer = self._require(self._consumer)
        consumer.pause(tp)
        part = Partition(
            tp,
            changelog=TopicPartition(self._changelogs[tp.topic], tp.partition),
            context=self._require(self._context),
            seek=self._seek,
        )
        owned = self._owned[tp] = Owned(part)
        self.metrics.partitions.set(len(self._owned))
        owned.opening = asyncio.create_task(self._open(owned))

    async def _open(self, owned: Owned) -> None:
        """Open the partition, move it to the committed offset and resume it; a failure stops the worker.

        ``owned.opening`` stays set until the partition is positioned, so that a revocation
        at any await on the way cancels it: a stale opening must never move the consumer.
        """
        part = owned.part
        tp = part.tp
        try:
            await part.open()
            committed = await self._committed(owned)
            if not self._still_ours(owned):
                await self._drop_stale(owned)
                return
            consumer = self._require(self._consumer)
            if committed is None:
                await consumer.seek_to_beginning(tp)
                position = await consumer.position(tp)
                if not self._still_ours(owned):
                    await self._drop_stale(owned)
                    return
            else:
                consumer.seek(tp, committed)
                position = committed
            part.positioned(position)
            owned.paused = False
            consumer.resume(tp)
            log.info("%s: ready at committed offset %s", part.name, committed)
        except PartitionUnservedError as exc:
            if self._owned.get(tp) is owned:
                self._fail(exc)
        finally:
            if owned.opening is asyncio.current_task():
                owned.opening = None

    def _still_ours(self, owned: Owned) -> bool:
        """Whether ``owned`` is still the table's entry for its partition, which the group still assigns here."""
        tp = owned.part.tp
        return self._owned.get(tp) is owned and self._assigned(tp)

    async def _drop_stale(self, owned: Owned) -> None:
        """Close a partition revoked (or replaced) while it opened, and take it out of the table."""
        tp = owned.part.tp
        if self._owned.get(tp) is owned:
            del self._owned[tp]
        await self.close(owned, commit=False)

    async def _committed(self, owned: Owned) -> int | None:
        """The group's committed offset of the partition, retried until ``open_timeout`` (the broker may be away)."""
        consumer = self._require(self._consumer)
        part = owned.part
        deadline = time.monotonic() + self.settings.open_timeout
        while True:
            try:
                committed: int | None = await consumer.committed(part.tp)
            except KafkaError as exc:
                if time.monotonic() > deadline:
                    await part.close(commit=False)
                    raise PartitionUnservedError(
                        f"partition {part.name}: cannot read its offset: {exc}"
                    ) from exc
                log.warning("%s: cannot read its committed offset yet (%r); retrying", part.name, exc)
                await asyncio.sleep(COMMITTED_RETRY_S)
            else:
                return committed

    async def close(self, owned: Owned, *, commit: bool) -> None:
        """Wait for the partition's commit, then close it (commit or abort what is open) and stop reporting it."""
        task = owned.committing
        if task is not None:
            with contextlib.suppress(PipelineError, KafkaError):
                await task
        await owned.part.close(commit=commit)
        if self._standbys is not None:
            self._standbys.remember(owned.part.tp, owned.part.position)
        forget_partition(self.metrics, owned.part.tp)
        self.metrics.partitions.set(len(self._owned))

    async def reap(self) -> None:
        """Close BROKEN and FENCED partitions; open a BROKEN one again while the group still assigns it here."""
        consumer = self._require(self._consumer)
        for tp, owned in list(self._owned.items()):
            state = owned.part.state
            if state not in (PartitionState.BROKEN, PartitionState.FENCED):
                continue
            if tp in consumer.assignment():
                consumer.pause(tp)
            del self._owned[tp]
            await self.close(owned, commit=False)
            if state is PartitionState.FENCED:
                log.warning(
                    "%s: fenced; rejoining the group, which assigns every partition anew", owned.part.name
                )
                internals.request_rejoin(consumer)
            elif self._assigned(tp) and tp not in self._owned:
                log.warning("%s: reopening", owned.part.name)
                self._begin_open(tp)

    def _assigned(self, tp: TopicPartition) -> bool:
        """Whether ``tp`` is this worker's now: assigned, and no rebalance under way."""
        return not self._rebalancing and tp in self._require(self._consumer).assignment()

    def watch(self) -> None:
        """Stop the worker when an assigned partition stays unserved past ``open_timeout``."""
        consumer = self._require(self._consumer)
        now = time.monotonic()
        assigned = consumer.assignment() if not self._rebalancing else set()
        for tp in list(self._unserved_since):
            owned = self._owned.get(tp)
            if tp not in assigned or (owned is not None and owned.part.serving):
                del self._unserved_since[tp]
        for tp in assigned:
            owned = self._owned.get(tp)
            if owned is not None and (owned.part.serving or owned.opening is not None):
                continue
            since = self._unserved_since.setdefault(tp, now)
            if now - since > self.settings.open_timeout:
                self._fail(
                    PartitionUnservedError(
                        f"partition {tp.topic}-{tp.partition} is assigned but not served for "
                        f"{self.settings.open_timeout:g}s"
                    )
                )

    @staticmethod
    def _require(value: _T | None) -> _T:
        if value is None:
            raise PipelineError("the worker is not started")
        return value
