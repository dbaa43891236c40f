"""The dedupe worker: one group consumer per process feeding the partitions it owns.

The loop owns the consumer (fetch, seek, pause, resume) and the group's
callbacks; everything about one partition (store, producer, transaction,
stage, lifecycle) belongs to its :class:`~pipeline.worker.partition.Partition`.

On assignment each new partition is paused and opened in the background, all
of them concurrently (store, fencing producer, restore); once READY it is
moved to the group's committed offset and resumed. A partition that cannot be
opened within ``open_timeout`` stops the worker with one line and a non-zero
exit: it never stays in the group with a partition it does not serve. On
revocation a partition's open transaction is committed before the callback
returns. A clean stop commits what is open; a stop after an exception aborts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, TypeVar

from aiohttp import web
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError

from pipeline import native
from pipeline.config import WorkerSettings
from pipeline.errors import BrokerUnavailableError, PartitionUnservedError, PipelineError
from pipeline.kafka.admin import topic_layout
from pipeline.kafka.clients import worker_consumer
from pipeline.kafka.partitioner import KeyPartitioner, owner_partition
from pipeline.topology import Topology
from pipeline.worker import http as worker_http
from pipeline.worker.classify import Classifier
from pipeline.worker.emitter import OutputTopics
from pipeline.worker.fetch import LoopFetch
from pipeline.worker.health import partition_health
from pipeline.worker.lifecycle import PartitionState
from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.observe import forget_partition, observe_lag, observe_store
from pipeline.worker.pacing import caught_up, poll_ms
from pipeline.worker.partition import Partition

log = logging.getLogger(__name__)

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
        self, settings: WorkerSettings, topology: Topology, *, metrics: WorkerMetrics | None = None
    ) -> None:
        self.settings = settings.for_topology(topology.app)
        self.topology = topology
        self.metrics = metrics or WorkerMetrics.create()
        self._partitions: dict[TopicPartition, Partition] = {}
        self._opening: dict[TopicPartition, asyncio.Task[None]] = {}
        self._paused: set[TopicPartition] = set()  # by the loop, because records piled up
        self._unserved_since: dict[TopicPartition, float] = {}
        self._stopping = asyncio.Event()
        self._fetch = LoopFetch(max_records=self.settings.fetch_records, snapshot=self._positions)
        self._fatal: PipelineError | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._outputs: OutputTopics | None = None
        self._classifier: Classifier | None = None
        self._http: web.AppRunner | None = None
        self._commits: dict[TopicPartition, asyncio.Task[None]] = {}

    # -- lifecycle ---------------------------------------------------------------
    async def start(self) -> None:
        """Learn the topics' partition counts and size limits, join the group, serve HTTP."""
        counts, limits = await topic_layout(self.settings.bootstrap, self.topology)
        partitioner = KeyPartitioner()
        self._outputs = OutputTopics(counts, partitioner, limits)
        self._classifier = Classifier(
            self.topology, partitioner, input_partitions=counts[self.topology.topics.input]
        )
        consumer = worker_consumer(self.settings)
        try:
            await consumer.start()
        except KafkaError as exc:
            await consumer.stop()
            raise BrokerUnavailableError(f"cannot reach Kafka at {self.settings.bootstrap}: {exc}") from None
        self._consumer = consumer
        consumer.subscribe([source for source, _ in self._stages()], listener=_Rebalance(self))
        if self.settings.metrics_port is not None:
            await self._serve_http(self.settings.metrics_port, counts)
        log.info(
            "worker started: group %s, input %s (%s partitions); %s",
            self.settings.group,
            self.topology.topics.input,
            counts[self.topology.topics.input],
            native.describe(),
        )
        outdated = native.stale()
        if outdated:
            log.warning(
                "compiled modules older than their sources (edited since the build, which still runs): "
                "%s; compile them again with scripts/bootstrap",
                ", ".join(outdated),
            )

    async def _serve_http(self, port: int, counts: dict[str, int]) -> None:
        app = worker_http.build_app(
            lambda: {
                (tp.topic, tp.partition): part.store
                for tp, part in self._partitions.items()
                if part.serving and part.store is not None
            },
            lambda topic, key: owner_partition(key, counts[topic]),
            [source for source, _ in self._stages()],
            self.metrics.registry,
            self.health,
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

    def stop(self) -> None:
        """Ask the loop to finish its transactions and exit."""
        self._stopping.set()
        self._fetch.wake()

    def health(self) -> tuple[bool, dict[str, Any]]:
        """Healthy when every assigned partition is served and none is stuck; the details either way."""
        consumer = self._consumer
        if consumer is None:
            return False, {"status": "stopped"}
        return partition_health(consumer.assignment(), self._partitions, failed=self._fatal is not None)

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
        wait = poll_ms(self._partitions, commit_interval=self.settings.commit_interval)
        hurry = self._stopping.is_set() or self._fatal is not None
        batches, before = await self._fetch.next(consumer, wait, hurry=hurry)
        for tp, records in batches.items():
            part = self._partitions.get(tp)
            if part is None or not part.serving:
                continue  # not ours, or not positioned yet: fetched again after its seek
            if before.get(tp) != (part, part.generation):
                # a failed commit moved this partition back while we fetched: what came is stale
                # (or already from the new position, so move there once more)
                self._seek(tp, part.rewound_to)
                continue
            part.feed(records)
            self._backpressure(part)
        for part in list(self._partitions.values()):
            if part.queue and part.state is PartitionState.READY:
                await part.work()
                self._backpressure(part)
                observe_lag(self.metrics, consumer, part)
        if self.settings.commit_policy == "caught-up":
            for tp, part in self._partitions.items():
                part.caught_up = caught_up(consumer, part, fetched=tp in batches)
        self._commit_due()
        await self._reap()
        self._watch()

    def _positions(self) -> _Positions:
        """Each partition and its generation, as a fetch begins (records of an older one are stale)."""
        return {tp: (part, part.generation) for tp, part in self._partitions.items()}

    def _backpressure(self, part: Partition) -> None:
        """Pause a partition whose queue reached ``fetch_records``; resume it once the queue drains."""
        consumer = self._require(self._consumer)
        tp = part.tp
        if tp not in consumer.assignment():
            return
        limit = self.settings.fetch_records
        if len(part.queue) >= limit and tp not in self._paused:
            consumer.pause(tp)
            self._paused.add(tp)
        elif len(part.queue) < limit and tp in self._paused:
            self._paused.discard(tp)
            consumer.resume(tp)

    def _seek(self, tp: TopicPartition, offset: int) -> None:
        """Move ``tp``'s fetch position (after an abort); a partition no longer assigned is left alone."""
        consumer = self._require(self._consumer)
        part = self._partitions.get(tp)
        if part is not None:
            part.rewound_to = offset
        if tp in consumer.assignment():
            consumer.seek(tp, offset)

    def _commit_due(self) -> None:
        """Commit each due partition in the background; the loop goes on with the others meanwhile."""
        for tp, part in self._partitions.items():
            if tp in self._commits or not part.due():
                continue
            self._commits[tp] = asyncio.create_task(self._commit(part))

    async def _commit(self, part: Partition) -> None:
        """A background commit; what it cannot recover from stops the worker instead of a stuck partition."""
        try:
            await part.commit()
            if part.serving and part.store is not None:
                observe_store(self.metrics, part)
            self._backpressure(part)
        except PipelineError as exc:
            self._fail(exc)
        finally:
            if self._commits.get(part.tp) is asyncio.current_task():
                del self._commits[part.tp]
            self._fetch.wake()  # records held for this commit are handled now, not at the next fetch

    async def _reap(self) -> None:
        """Close BROKEN and FENCED partitions; open a BROKEN one again while it is still assigned."""
        consumer = self._require(self._consumer)
        for tp, part in list(self._partitions.items()):
            if part.state not in (PartitionState.BROKEN, PartitionState.FENCED):
                continue
            fenced = part.state is PartitionState.FENCED
            if tp in consumer.assignment():
                consumer.pause(tp)
            await self._close(tp, commit=False)
            if not fenced and tp in consumer.assignment():
                log.warning("%s: reopening", part.name)
                self._begin_open(tp)

    def _watch(self) -> None:
        """Stop the worker when an assigned partition stays unserved past ``open_timeout``."""
        consumer = self._require(self._consumer)
        now = time.monotonic()
        assigned = consumer.assignment()
        for tp in list(self._unserved_since):
            if tp not in assigned or (tp in self._partitions and self._partitions[tp].serving):
                del self._unserved_since[tp]
        for tp in assigned:
            part = self._partitions.get(tp)
            if part is not None and (part.serving or tp in self._opening):
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
        for task in list(self._opening.values()):
            task.cancel()
        await self._fetch.close()
        await asyncio.gather(*self._opening.values(), *self._commits.values(), return_exceptions=True)
        await self._close_all(set(self._partitions), commit=commit)
        await consumer.stop()
        if self._http is not None:
            await self._http.cleanup()
            self._http = None
        self._consumer = None
        log.info("worker stopped")

    # -- rebalances ----------------------------------------------------------------
    async def partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        """Commit each revoked partition's open transaction, then release its producer and store."""
        if revoked:
            log.info("partitions revoked: %s", sorted(f"{tp.topic}-{tp.partition}" for tp in revoked))
        for tp in revoked:
            task = self._opening.pop(tp, None)
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, PipelineError):
                    await task
            self._paused.discard(tp)
            self._unserved_since.pop(tp, None)
        await self._close_all(revoked, commit=True)

    async def partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        """Pause each new partition and open them all concurrently, in the background.

        The consumer may fetch while a partition opens; a record handled before
        the seek to the committed offset would be handled at the wrong position,
        so the partition stays paused until it is READY and positioned.
        """
        consumer = self._require(self._consumer)
        fresh = sorted((tp for tp in assigned if tp not in self._partitions), key=lambda t: t.partition)
        if not fresh:
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
            settings=self.settings,
            topology=self.topology,
            classifier=self._require(self._classifier),
            outputs=self._require(self._outputs),
            metrics=self.metrics,
            seek=self._seek,
        )
        self._partitions[tp] = part
        self.metrics.partitions.set(len(self._partitions))
        self._opening[tp] = asyncio.create_task(self._open(part))

    async def _open(self, part: Partition) -> None:
        """Open ``part``, move it to the committed offset and resume it; a failure stops the worker."""
        consumer = self._require(self._consumer)
        tp = part.tp
        try:
            await part.open()
            if tp not in consumer.assignment() or self._partitions.get(tp) is not part:
                await part.close(commit=False)
                return
            committed = await consumer.committed(tp)
        except PartitionUnservedError as exc:
            self._fail(exc)
            return
        except KafkaError as exc:
            await part.close(commit=False)
            if tp in consumer.assignment():
                self._fail(PartitionUnservedError(f"partition {part.name}: cannot read its offset: {exc}"))
            return
        finally:
            if self._opening.get(tp) is asyncio.current_task():
                del self._opening[tp]
        if committed is None:
            await consumer.seek_to_beginning(tp)
            part.rewound_to = await consumer.position(tp)
        else:
            consumer.seek(tp, committed)
            part.rewound_to = committed
        self._paused.discard(tp)
        consumer.resume(tp)
        log.info("%s: ready at committed offset %s", tp, committed)

    def _fail(self, exc: PipelineError) -> None:
        log.error("%s", exc)
        if self._fatal is None:
            self._fatal = exc
        self._fetch.wake()

    async def _close_all(self, tps: set[TopicPartition], *, commit: bool) -> None:
        await asyncio.gather(*(self._close(tp, commit=commit) for tp in tps if tp in self._partitions))

    async def _close(self, tp: TopicPartition, *, commit: bool) -> None:
        part = self._partitions.pop(tp, None)
        if part is None:
            return
        task = self._commits.get(tp)
        if task is not None:
            with contextlib.suppress(PipelineError, KafkaError):
                await task
        async with part.lock:
            await part.close(commit=commit)
        forget_partition(self.metrics, tp)
        self.metrics.partitions.set(len(self._partitions))

    @staticmethod
    def _require(value: _T | None) -> _T:
        if value is None:
            raise PipelineError("the worker is not started")
        return value
