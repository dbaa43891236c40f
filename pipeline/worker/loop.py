"""The dedupe worker: one group consumer per process feeding the partitions it owns.

The loop owns the consumer (fetch, seek, pause, resume) and the group's
callbacks, and keeps one record per owned partition (:class:`Owned`);
everything about one partition (store, producer, transaction, stage, lifecycle)
belongs to its :class:`~pipeline.worker.partition.Partition`.

On assignment each new partition is paused and opened in the background, all
of them concurrently (store, fencing producer, restore); once READY it is
moved to the group's committed offset and resumed. A partition that cannot be
opened within ``open_timeout`` stops the worker with one line and a non-zero
exit: it never stays in the group with a partition it does not serve.

On revocation the revoked partitions leave the table at once (an opening one
is cancelled: no producer is started for it after that), then their open
transactions are committed before the callback returns. Between a revocation
and the next assignment the group is rebalancing: aiokafka still shows the old
assignment, so nothing is opened again meanwhile. A BROKEN partition is closed
and opened again while the group still assigns it here; a FENCED one is closed,
and the worker rejoins the group, which assigns every partition anew. A clean
stop commits what is open; a stop after an exception aborts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import TypeVar

from aiohttp import web
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError

from pipeline.errors import BrokerUnavailableError, PartitionUnservedError, PipelineError
from pipeline.kafka import internals
from pipeline.kafka.admin import topic_layout
from pipeline.kafka.clients import worker_consumer
from pipeline.kafka.partitioner import KeyPartitioner, owner_partition
from pipeline.state.directory import StateDirLock, StoreOpener
from pipeline.state.restore import RestoreBudget
from pipeline.state.store import PartitionStore
from pipeline.topology import Topology
from pipeline.worker import http as worker_http
from pipeline.worker.classify import Classifier
from pipeline.worker.context import PartitionContext
from pipeline.worker.emitter import OutputTopics
from pipeline.worker.fetch import LoopFetch
from pipeline.worker.health import STOPPED, Health, partition_health
from pipeline.worker.lifecycle import PartitionState
from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.observe import forget_partition, observe_lag, observe_store
from pipeline.worker.pacing import caught_up, poll_ms
from pipeline.worker.partition import Partition
from pipeline.worker.settings import WorkerSettings
from pipeline.worker.standbys import StandbyReplicas

log = logging.getLogger(__name__)

_T = TypeVar("_T")
_Positions = dict[TopicPartition, tuple[Partition, int]]  # each partition and its generation
COMMITTED_RETRY_S = 1.0  # between attempts to read a partition's committed offset


@dataclass
class Owned:
    """One partition this worker owns, and what the loop runs for it."""

    part: Partition
    opening: asyncio.Task[None] | None = None
    committing: asyncio.Task[None] | None = None
    paused: bool = False  # by the loop, because records piled up
    disk_measured_at: float = 0.0


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    """aiokafka swallows what a listener raises: failures are handed to the worker, never raised here."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self.worker.partitions_revoked(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self.worker.partitions_assigned(assigned)


class Worker:
    """Runs the dedupe loop until :meth:`stop` (or SIGTERM through the CLI)."""

    def __init__(
        self,
        settings: WorkerSettings,
        topology: Topology,
        *,
        metrics: WorkerMetrics | None = None,
        open_store: StoreOpener = PartitionStore.open,
    ) -> None:
        self.settings = settings.for_topology(topology.app)
        self.topology = topology
        self.metrics = metrics or WorkerMetrics.create()
        self._open_store = open_store
        self._dir_lock = StateDirLock(self.settings.state_dir, topology, self.settings.group)
        self._owned: dict[TopicPartition, Owned] = {}
        self._unserved_since: dict[TopicPartition, float] = {}  # assigned partitions not served yet
        self._rebalancing = False  # between a revocation and the next assignment
        self._stopping = asyncio.Event()
        self._fetch = LoopFetch(max_records=self.settings.fetch_records, snapshot=self._positions)
        self._fatal: PipelineError | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._context: PartitionContext | None = None
        self._standbys: StandbyReplicas | None = None
        self._http: web.AppRunner | None = None

    # -- lifecycle ---------------------------------------------------------------
    async def start(self) -> None:
        """Take the state dir, learn the topics' partition counts, limits and ids, join the group, serve HTTP."""
        self._dir_lock.acquire()
        try:
            await self._start()
        except BaseException:
            self._dir_lock.release()
            raise

    async def _start(self) -> None:
        layout = await topic_layout(self.settings.bootstrap, self.topology)
        partitioner = KeyPartitioner()
        outputs = OutputTopics(layout.counts, partitioner, layout.limits, layout.timestamps)
        classifier = Classifier(
            self.topology, partitioner, input_partitions=layout.counts[self.topology.topics.input]
        )
        self._context = PartitionContext(
            settings=self.settings,
            topology=self.topology,
            classifier=classifier,
            outputs=outputs,
            metrics=self.metrics,
            cluster=layout.cluster,
            topic_ids=layout.topic_ids,
            open_store=self._open_store,
            budget=RestoreBudget(self.settings.restore_budget_bytes),
            member=self._member,
        )
        standbys = self._standbys = StandbyReplicas(
            self._context, dict(self._stages()), self._served_positions
        )
        standbys.scan()
        consumer = worker_consumer(self.settings, assignor=standbys.assignor)
        try:
            await consumer.start()
        except KafkaError as exc:
            await internals.stop_consumer(consumer)
            raise BrokerUnavailableError(f"cannot reach Kafka at {self.settings.bootstrap}: {exc}") from None
        self._consumer = consumer
        consumer.subscribe([source for source, _ in self._stages()], listener=_Rebalance(self))
        if self.settings.metrics_port is not None:
            await self._serve_http(self.settings.metrics_port, layout.counts)
        log.info(
            "worker started: group %s, input %s (%s partitions)",
            self.settings.group,
            self.topology.topics.input,
            layout.counts[self.topology.topics.input],
        )

    async def _serve_http(self, port: int, counts: dict[str, int]) -> None:
        app = worker_http.build_app(
            lambda: {
                (tp.topic, tp.partition): owned.part.store
                for tp, owned in self._owned.items()
                if owned.part.serving and owned.part.store is not None
            },
            lambda topic, key: owner_partition(key, counts[topic]),
            [source for source, _ in self._stages()],
            self.metrics.registry,
            self.health,
            self._require(self._standbys).describe,
        )
        self._http = await worker_http.serve(app, self.settings.http_host, port)
        log.info("metrics and inspect endpoint on port %s", worker_http.bound_port(self._http))

    def _stages(self) -> list[tuple[str, str]]:
        """Each consumed topic with the changelog of its seen-set."""
        topics = self.topology.topics
        stages = [(topics.input, topics.changelog)]
        if self.topology.has_effects:
            stages.append((topics.effects, topics.effects_changelog))
        return stages

    def standby_partitions(self) -> set[TopicPartition]:
        """The partitions this worker keeps a standby replica of now."""
        return set(self._standbys.held) if self._standbys is not None else set()

    def stop(self) -> None:
        """Ask the loop to finish its transactions and exit."""
        self._stopping.set()
        self._fetch.wake()

    def health(self) -> Health:
        """Ready when every assigned partition is served and none is stuck; alive unless stuck or failed."""
        consumer = self._consumer
        if consumer is None:
            return STOPPED
        parts = {tp: owned.part for tp, owned in self._owned.items()}
        standbys = self._standbys.describe() if self._standbys is not None else None
        return partition_health(
            consumer.assignment(),
            parts,
            failed=self._fatal is not None,
            stopping=self._stopping.is_set(),
            standbys=standbys,
        )

    async def run(self) -> None:
        """Consume, decide and commit until stopped; commit what is open (abort after a failure)."""
        consumer = self._require(self._consumer)
        clean = False
        try:
            while not self._stopping.is_set():
                if self._fatal is not None:
                    raise self._fatal
                await self._cycle(consumer)
            clean = True
        finally:
            await self._shutdown(commit=clean)

    async def _cycle(self, consumer: AIOKafkaConsumer) -> None:
        """One fetch, the records fed to their partitions, handled, and the due commits started."""
        parts = [owned.part for owned in self._owned.values()]
        wait = poll_ms(parts, commit_interval=self.settings.commit_interval)
        hurry = self._stopping.is_set() or self._fatal is not None
        batches, before = await self._fetch.next(consumer, wait, hurry=hurry)
        for tp, records in batches.items():
            owned = self._owned.get(tp)
            if owned is None or not owned.part.serving:
                continue  # not ours, or not positioned yet: fetched again after its seek
            part = owned.part
            if before.get(tp) != (part, part.generation):
                # a failed commit moved this partition back while we fetched: what came is stale
                # (or already from the new position, so move there once more)
                self._seek(tp, part.rewound_to)
                continue
            part.feed(records)
            self._backpressure(owned)
        for owned in list(self._owned.values()):
            if owned.part.can_work:
                await owned.part.work()
                self._backpressure(owned)
                observe_lag(self.metrics, consumer, owned.part)
        if self.settings.commit_policy == "caught-up":
            for tp, owned in self._owned.items():
                owned.part.set_caught_up(caught_up(consumer, owned.part, fetched=tp in batches))
        self._commit_due()
        await self._reap()
        self._watch()
        self._require(self._standbys).observe()
        await asyncio.sleep(0)  # a fetch with nothing to wait for returns at once: let the commits run

    async def _member(self) -> bool | None:
        """Whether the group still counts this worker a member of its generation (None: not known)."""
        consumer = self._consumer
        return None if consumer is None else await internals.generation_current(consumer)

    def _served_positions(self) -> dict[TopicPartition, int]:
        """The changelog position of each open store of a partition this worker serves (for its group)."""
        return {
            tp: owned.part.store.changelog_offset
            for tp, owned in self._owned.items()
            if owned.part.store is not None and not owned.part.store.closed
        }

    def _positions(self) -> _Positions:
        """Each partition and its generation, as a fetch begins (records of an older one are stale)."""
        return {tp: (owned.part, owned.part.generation) for tp, owned in self._owned.items()}

    def _backpressure(self, owned: Owned) -> None:
        """Pause a partition whose queue reached ``fetch_records`` or ``queue_bytes``; resume it once it drains."""
        consumer = self._require(self._consumer)
        part = owned.part
        tp = part.tp
        if tp not in consumer.assignment():
            return
        full = (
            len(part.queue) >= self.settings.fetch_records or part.queued_bytes >= self.settings.queue_bytes
        )
        if full and not owned.paused:
            consumer.pause(tp)
            owned.paused = True
        elif not full and owned.paused:
            owned.paused = False
            consumer.resume(tp)

    def _seek(self, tp: TopicPartition, offset: int) -> None:
        """Move ``tp``'s fetch position (after an abort); a partition no longer assigned is left alone."""
        consumer = self._require(self._consumer)
        if tp in consumer.assignment():
            consumer.seek(tp, offset)

    def _commit_due(self) -> None:
        """Commit each due partition in the background; the loop goes on with the others meanwhile."""
        for owned in self._owned.values():
            if owned.committing is None and owned.part.due():
                owned.committing = asyncio.create_task(self._commit(owned))

    async def _commit(self, owned: Owned) -> None:
        """A background commit; what it cannot recover from stops the worker instead of a stuck partition."""
        part = owned.part
        try:
            await part.commit()
            if part.serving and part.store is not None:
                owned.disk_measured_at = observe_store(self.metrics, part, owned.disk_measured_at)
            if self._owned.get(part.tp) is owned:
                self._backpressure(owned)
        except PipelineError as exc:
            self._fail(exc)
        finally:
            if owned.committing is asyncio.current_task():
                owned.committing = None
            self._fetch.wake()  # records held for this commit are handled now, not at the next fetch

    async def _reap(self) -> None:
        """Close BROKEN and FENCED partitions; open a BROKEN one again while the group still assigns it here."""
        consumer = self._require(self._consumer)
        for tp, owned in list(self._owned.items()):
            state = owned.part.state
            if state not in (PartitionState.BROKEN, PartitionState.FENCED):
                continue
            if tp in consumer.assignment():
                consumer.pause(tp)
            del self._owned[tp]
            await self._close(owned, commit=False)
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

    def _watch(self) -> None:
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
                self._fatal = PartitionUnservedError(
                    f"partition {tp.topic}-{tp.partition} is assigned but not served for "
                    f"{self.settings.open_timeout:g}s"
                )

    async def _shutdown(self, *, commit: bool) -> None:
        consumer = self._consumer
        if consumer is None:
            return
        self._stopping.set()  # after an exception too: no assignment opens anything from now on
        owned = list(self._owned.values())
        self._owned.clear()
        for entry in owned:
            if entry.opening is not None:
                entry.opening.cancel()
        await self._fetch.close()
        tasks = [t for entry in owned for t in (entry.opening, entry.committing) if t is not None]
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(self._close(entry, commit=commit) for entry in owned))
        if self._standbys is not None:
            await self._standbys.close()
        await internals.stop_consumer(consumer)
        if self._http is not None:
            await self._http.cleanup()
            self._http = None
        self._consumer = None
        self._dir_lock.release()
        log.info("worker stopped")

    # -- rebalances ----------------------------------------------------------------
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
        await asyncio.gather(*(self._close(owned, commit=True) for owned in gone))

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
            changelog=TopicPartition(dict(self._stages())[tp.topic], tp.partition),
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
        await self._close(owned, commit=False)

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

    def _fail(self, exc: PipelineError) -> None:
        log.error("%s", exc)
        if self._fatal is None:
            self._fatal = exc
        self._fetch.wake()

    async def _close(self, owned: Owned, *, commit: bool) -> None:
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

    @staticmethod
    def _require(value: _T | None) -> _T:
        if value is None:
            raise PipelineError("the worker is not started")
        return value
