"""The dedupe worker: one group consumer per process feeding the partitions it owns.

The loop owns the consumer (fetch, seek, pause, resume): each cycle it feeds the
fetched records to their partitions, has them handled, pauses a partition whose
queue is full, and starts the commits that are due in the background. Which
partitions it owns, and their opening on assignment, release on revocation and
reopening after a failure, are :class:`~pipeline.worker.ownership.Ownership`'s;
everything about one partition (store, producer, transaction, stage, lifecycle)
belongs to its :class:`~pipeline.worker.partition.Partition`.

A partition that cannot be opened within ``open_timeout`` stops the worker with
one line and a non-zero exit: it never stays in the group with a partition it
does not serve. A clean stop commits what is open; a stop after an exception
aborts.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TypeVar

from aiohttp import web
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError

from pipeline.errors import BrokerUnavailableError, PipelineError
from pipeline.kafka import internals
from pipeline.kafka.admin import topic_layout
from pipeline.kafka.clients import worker_consumer
from pipeline.kafka.partitioner import KeyPartitioner, owner_partition
from pipeline.state.directory import StateDirLock, StoreOpener
from pipeline.state.restore import RestoreBudget
from pipeline.state.store import PartitionStore
from pipeline.topology import CHANGELOG_MARGIN, Topology
from pipeline.worker import http as worker_http
from pipeline.worker.classify import Classifier
from pipeline.worker.context import PartitionContext
from pipeline.worker.emitter import OutputTopics
from pipeline.worker.fetch import LoopFetch
from pipeline.worker.health import STOPPED, Health, partition_health
from pipeline.worker.metadata_refresh import MetadataRefresh
from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.observe import observe_lag, observe_store, warn_if_behind
from pipeline.worker.ownership import Owned, Ownership
from pipeline.worker.pacing import caught_up, poll_ms
from pipeline.worker.partition import Partition
from pipeline.worker.settings import WorkerSettings
from pipeline.worker.standbys import StandbyReplicas

log = logging.getLogger(__name__)

MARGIN_MS = int(
    CHANGELOG_MARGIN.total_seconds() * 1000
)  # how far the changelog's retention outlasts the largest TTL

_T = TypeVar("_T")
_Positions = dict[TopicPartition, tuple[Partition, int]]  # each partition and its generation


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
        self._stopping = asyncio.Event()
        self._table = Ownership(
            self.settings,
            self.metrics,
            dict(self._stages()),
            stopping=self._stopping,
            seek=self._seek,
            fail=self._fail,
        )
        self._fetch = LoopFetch(max_records=self.settings.fetch_records, snapshot=self._positions)
        self._fatal: PipelineError | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._context: PartitionContext | None = None
        self._standbys: StandbyReplicas | None = None
        self._metadata = MetadataRefresh()
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
            self._context, dict(self._stages()), self._served_positions, unplanned=self._metadata.missing
        )
        await standbys.scan()
        consumer = worker_consumer(self.settings, assignor=standbys.assignor)
        try:
            await consumer.start()
        except KafkaError as exc:
            await internals.stop_consumer(consumer)
            raise BrokerUnavailableError(f"cannot reach Kafka at {self.settings.bootstrap}: {exc}") from None
        self._consumer = consumer
        self._metadata.attach(consumer)
        self._table.attach(consumer, self._context, standbys)
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
                for tp, owned in self.owned.items()
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

    @property
    def owned(self) -> dict[TopicPartition, Owned]:
        """The partitions this worker owns now (:class:`~pipeline.worker.ownership.Ownership` changes it)."""
        return self._table.owned

    async def partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        """The group takes ``revoked`` away (at the start of every rebalance)."""
        await self._table.partitions_revoked(revoked)

    async def partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        """The group gives this worker ``assigned`` (at the end of every rebalance)."""
        await self._table.partitions_assigned(assigned)

    def stop(self) -> None:
        """Ask the loop to finish its transactions and exit."""
        self._stopping.set()
        self._fetch.wake()

    def health(self) -> Health:
        """Ready when every assigned partition is served and none is stuck; alive unless stuck or failed."""
        consumer = self._consumer
        if consumer is None:
            return STOPPED
        parts = {tp: owned.part for tp, owned in self.owned.items()}
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
        parts = [owned.part for owned in self.owned.values()]
        wait = poll_ms(parts, commit_interval=self.settings.commit_interval)
        hurry = self._stopping.is_set() or self._fatal is not None
        batches, before = await self._fetch.next(consumer, wait, hurry=hurry)
        for tp, records in batches.items():
            owned = self.owned.get(tp)
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
        for owned in list(self.owned.values()):
            if owned.part.can_work:
                await owned.part.work()
                self._backpressure(owned)
                observe_lag(self.metrics, consumer, owned.part)
        if self.settings.commit_policy == "caught-up":
            for tp, owned in self.owned.items():
                owned.part.set_caught_up(caught_up(consumer, owned.part, fetched=tp in batches))
        self._commit_due()
        await self._table.reap()
        self._table.watch()
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
            for tp, owned in self.owned.items()
            if owned.part.store is not None and not owned.part.store.closed
        }

    def _positions(self) -> _Positions:
        """Each partition and its generation, as a fetch begins (records of an older one are stale)."""
        return {tp: (owned.part, owned.part.generation) for tp, owned in self.owned.items()}

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
        for owned in self.owned.values():
            if owned.committing is None and owned.part.due():
                owned.committing = asyncio.create_task(self._commit(owned))

    async def _commit(self, owned: Owned) -> None:
        """A background commit; what it cannot recover from stops the worker instead of a stuck partition."""
        part = owned.part
        try:
            await part.commit()
            if part.serving and part.store is not None:
                owned.disk_measured_at = observe_store(self.metrics, part, owned.disk_measured_at)
                owned.behind_warned_at = warn_if_behind(part, MARGIN_MS, owned.behind_warned_at)
            if self.owned.get(part.tp) is owned:
                self._backpressure(owned)
        except PipelineError as exc:
            self._fail(exc)
        finally:
            if owned.committing is asyncio.current_task():
                owned.committing = None
            self._fetch.wake()  # records held for this commit are handled now, not at the next fetch

    async def _shutdown(self, *, commit: bool) -> None:
        consumer = self._consumer
        if consumer is None:
            return
        self._stopping.set()  # after an exception too: no assignment opens anything from now on
        owned = self._table.take_all()
        for entry in owned:
            if entry.opening is not None:
                entry.opening.cancel()
        await self._fetch.close()
        tasks = [t for entry in owned for t in (entry.opening, entry.committing) if t is not None]
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(self._table.close(entry, commit=commit) for entry in owned))
        if self._standbys is not None:
            await self._standbys.close()
        await self._metadata.close()
        await internals.stop_consumer(consumer)
        if self._http is not None:
            await self._http.cleanup()
            self._http = None
        self._consumer = None
        self._dir_lock.release()
        log.info("worker stopped")

    def _fail(self, exc: PipelineError) -> None:
        log.error("%s", exc)
        if self._fatal is None:
            self._fatal = exc
        self._fetch.wake()

    @staticmethod
    def _require(value: _T | None) -> _T:
        if value is None:
            raise PipelineError("the worker is not started")
        return value
