"""The dedupe worker: one consumer per process, one transactional producer and store per partition.

Partitions come and go with the consumer group. On assignment a partition
gets its store (wiped and rebuilt when unreadable), a producer whose
``transactional_id`` is derived from the partition (starting it fences any
older owner), a restore from the changelog, and a seek to the group's
committed offset. On revocation its open transaction is committed (or
aborted) before the callback returns, and its producer and store are closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any, TypeVar

from aiohttp import web
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import IllegalOperation, KafkaError

from pipeline.config import WorkerSettings
from pipeline.errors import ConfigError, PartitionFencedError, PipelineError, StoreError
from pipeline.kafka.admin import partition_count
from pipeline.kafka.partitioner import KeyPartitioner, owner_partition
from pipeline.state.transaction import TransactionFailedError
from pipeline.topology import Topology
from pipeline.worker import http as worker_http
from pipeline.worker.classify import Classifier
from pipeline.worker.event_stage import OutputTopics
from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.partition import Partition, open_partition

log = logging.getLogger(__name__)

_T = TypeVar("_T")
DISK_MEASURE_EVERY = 10.0  # seconds between walks of a store's files


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
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
        self.settings = settings
        self.topology = topology
        self.metrics = metrics or WorkerMetrics.create()
        self._partitions: dict[TopicPartition, Partition] = {}
        self._stopping = asyncio.Event()
        self._consumer: AIOKafkaConsumer | None = None
        self._outputs: OutputTopics | None = None
        self._classifier: Classifier | None = None
        self._http: web.AppRunner | None = None
        self._commits: set[asyncio.Task[None]] = set()

    # -- lifecycle ---------------------------------------------------------------
    async def start(self) -> None:
        """Join the group and learn the output topics' partition counts."""
        topics = self.topology.topics
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.settings.bootstrap,
            group_id=self.settings.group,
            enable_auto_commit=False,
            isolation_level="read_committed",
            auto_offset_reset="earliest",
            max_poll_records=self.settings.max_batch,
            fetch_max_bytes=16 * 1024 * 1024,
            max_partition_fetch_bytes=4 * 1024 * 1024,
            session_timeout_ms=self.settings.session_timeout_ms,
            group_instance_id=self.settings.instance_id,
            heartbeat_interval_ms=max(self.settings.session_timeout_ms // 5, 300),
            client_id=f"pipeline-worker-{self.settings.group}",
        )
        await consumer.start()
        self._consumer = consumer
        names = [
            topics.input,
            topics.audit,
            topics.dlq,
            topics.changelog,
            *self.topology.command_topics(),
        ]
        if self.topology.has_effects:
            names += [topics.effects, topics.effects_changelog]
        counts = {}
        for name in names:
            count = await partition_count(self.settings.bootstrap, name)
            if count is None:
                await consumer.stop()
                raise StoreError(f"topic {name} does not exist: run 'pipeline topics create' first")
            counts[name] = count
        for source, changelog in self._stages():
            if counts[changelog] != counts[source]:
                await consumer.stop()
                raise StoreError(
                    f"changelog {changelog} has {counts[changelog]} partitions but {source} "
                    f"has {counts[source]}: they must match"
                )
        partitioner = KeyPartitioner()
        self._outputs = OutputTopics(counts, partitioner)
        self._classifier = Classifier(self.topology, partitioner, input_partitions=counts[topics.input])
        consumer.subscribe([source for source, _ in self._stages()], listener=_Rebalance(self))
        if self.settings.metrics_port is not None:
            await self._serve_http(self.settings.metrics_port, counts)
        log.info(
            "worker started: group %s, input %s (%s partitions)",
            self.settings.group,
            topics.input,
            counts[topics.input],
        )

    async def _serve_http(self, port: int, counts: dict[str, int]) -> None:
        app = worker_http.build_app(
            lambda: {(tp.topic, tp.partition): part.store for tp, part in self._partitions.items()},
            lambda topic, key: owner_partition(key, counts[topic]),
            [source for source, _ in self._stages()],
            self.metrics.registry,
        )
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.settings.http_host, port).start()
        except OSError as exc:
            await runner.cleanup()
            raise ConfigError(f"cannot serve metrics on port {port}: {exc}") from None
        self._http = runner
        log.info("metrics and inspect endpoint on port %s", port)

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

    async def run(self) -> None:
        """Consume, decide and commit until stopped; then commit what is open and leave the group."""
        consumer = self._require(self._consumer)
        try:
            while not self._stopping.is_set():
                ready = any(p.pending and not p.committing for p in self._partitions.values())
                batches = await consumer.getmany(
                    timeout_ms=0 if ready else int(self.settings.commit_interval * 500),
                    max_records=self.settings.max_batch,
                )
                # Handling one partition yields to the loop, and a background commit that fails
                # meanwhile moves its partition back (or a reopen replaces it): records fetched
                # before that are stale and must not be handled, whatever partition they are for.
                fetched = {tp: (part, part.seeks) for tp, part in self._partitions.items()}
                for tp, records in batches.items():
                    part = self._partitions.get(tp)
                    if part is not None and (part, part.seeks) != fetched.get(tp):
                        continue
                    if part is not None and (part.committing or part.pending):
                        self._hold(part, records)
                    else:
                        await self._handle(tp, records)
                for part in list(self._partitions.values()):
                    if part.pending and not part.committing:
                        records, part.pending = part.pending, []
                        await self._handle(part.tp, records)
                self._commit_due()
        finally:
            if self._commits:
                await asyncio.gather(*self._commits, return_exceptions=True)
            await self._shutdown()

    async def _shutdown(self) -> None:
        consumer = self._consumer
        if consumer is None:
            return
        await self._close_partitions(set(self._partitions), commit=True)
        await consumer.stop()
        if self._http is not None:
            await self._http.cleanup()
            self._http = None
        self._consumer = None
        log.info("worker stopped")

    # -- the loop ----------------------------------------------------------------
    async def _handle(self, tp: TopicPartition, records: Sequence[Any]) -> None:
        part = self._partitions.get(tp)
        if part is None:
            return  # revoked while the fetch was in flight: the new owner reprocesses these
        async with part.lock:
            if part.closed:
                return
            first = records[0].offset
            expected = part.checkpoint.next_offset
            if expected is not None and first < expected:
                # Never handle a record twice in one transaction: this would mean a stale fetch.
                log.error("%s: fetched offset %s behind the transaction's %s; skipping", tp, first, expected)
                records = [r for r in records if r.offset >= expected]
                if not records:
                    return
            try:
                await part.processor.handle(records)
                self._observe_lag(tp, records[-1].offset)
            except PartitionFencedError:
                await self._drop_fenced(part)
            except (KafkaError, IllegalOperation, TransactionFailedError) as exc:
                start = part.checkpoint.first_offset if part.checkpoint.first_offset is not None else first
                log.warning("%s: batch failed (%r); aborting and redoing from offset %s", tp, exc, start)
                await part.checkpoint.abort()
                if part.checkpoint.broken:
                    await self._reopen_locked(part)
                else:
                    self._seek(part, min(start, first))

    def _observe_lag(self, tp: TopicPartition, last_offset: int) -> None:
        highwater = self._require(self._consumer).highwater(tp)
        if highwater is not None:
            self.metrics.lag.labels(tp.topic, str(tp.partition)).set(max(highwater - last_offset - 1, 0))

    def _forget_gauges(self, tp: TopicPartition) -> None:
        """Stop reporting a partition this worker no longer owns."""
        for gauge, labels in (
            (self.metrics.lag, (tp.topic, str(tp.partition))),
            (self.metrics.store_keys, (f"{tp.topic}-{tp.partition}",)),
            (self.metrics.store_bytes, (f"{tp.topic}-{tp.partition}",)),
        ):
            with contextlib.suppress(KeyError):  # never reported
                gauge.remove(*labels)

    def _observe_store(self, part: Partition) -> None:
        labels = f"{part.tp.topic}-{part.tp.partition}"
        self.metrics.store_keys.labels(labels).set(part.store.key_count())
        now = time.monotonic()
        if now - part.disk_measured_at > DISK_MEASURE_EVERY:
            part.disk_measured_at = now
            self.metrics.store_bytes.labels(labels).set(part.store.disk_bytes())

    def _seek(self, part: Partition, offset: int) -> None:
        """Move ``part`` back to ``offset`` after an aborted transaction; drop what was fetched before."""
        part.pending.clear()  # fetched before the seek: they come again after it
        part.seeks += 1
        self._require(self._consumer).seek(part.tp, offset)

    def _hold(self, part: Partition, records: Sequence[Any]) -> None:
        """Keep records fetched while ``part`` commits, in order; pause it if they pile up."""
        part.pending.extend(records)
        consumer = self._require(self._consumer)
        if (
            len(part.pending) >= self.settings.max_batch
            and not part.paused
            and part.tp in consumer.assignment()
        ):
            consumer.pause(part.tp)
            part.paused = True

    def _commit_due(self) -> None:
        """Commit each partition whose transaction is due, in the background.

        The loop keeps fetching and handling the other partitions meanwhile. A
        committing partition's records are held (:meth:`_hold`) and handled
        once its commit is done; its lock serialises the rest.
        """
        interval, size = self.settings.commit_interval, self.settings.max_batch
        for part in list(self._partitions.values()):
            if part.committing or not part.checkpoint.due(interval=interval, max_records=size):
                continue
            part.committing = True
            task = asyncio.create_task(self._commit(part))
            self._commits.add(task)
            task.add_done_callback(self._commits.discard)

    async def _commit(self, part: Partition) -> None:
        consumer = self._require(self._consumer)
        try:
            async with part.lock:
                await self._commit_locked(part)
        finally:
            part.committing = False
            if part.paused:
                part.paused = False
                if not part.closed and part.tp in consumer.assignment():
                    consumer.resume(part.tp)

    async def _commit_locked(self, part: Partition) -> None:
        """Commit ``part``'s transaction; the caller holds its lock."""
        if part.closed or not part.checkpoint.in_transaction:
            return
        start = part.checkpoint.first_offset
        began = time.perf_counter()
        try:
            records = await part.checkpoint.commit()
        except PartitionFencedError:
            await self._drop_fenced(part)
            return
        except TransactionFailedError as exc:
            log.warning("%s: %s; redoing from offset %s", part.tp, exc, start)
            if part.checkpoint.broken:
                await self._reopen_locked(part)
            elif start is not None:
                self._seek(part, start)
            return
        self.metrics.commit_seconds.observe(time.perf_counter() - began)
        self.metrics.batch_records.observe(records)
        expired = part.store.expire()
        if expired:
            self.metrics.keys_expired.inc(expired)
        self._observe_store(part)

    async def _drop_fenced(self, part: Partition) -> None:
        """Drop a partition another owner took over; the caller holds its lock."""
        log.warning("%s: fenced by a newer owner; dropping the partition", part.tp)
        consumer = self._require(self._consumer)
        if part.tp in consumer.assignment():
            consumer.pause(part.tp)
        await self._close_locked(part, commit=False)

    # -- rebalances ----------------------------------------------------------------
    async def partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        """Commit (or abort) each revoked partition's transaction, then close its producer and store."""
        if revoked:
            log.info("partitions revoked: %s", sorted(tp.partition for tp in revoked))
        await self._close_partitions(revoked, commit=True)

    async def partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        """Open, fence, restore and position each newly assigned partition.

        The partitions stay paused until they are ready: the consumer may
        fetch while this callback runs, and a record handled before the seek
        to the committed offset would be handled at the wrong position.
        """
        consumer = self._require(self._consumer)
        fresh = sorted((tp for tp in assigned if tp not in self._partitions), key=lambda t: t.partition)
        if not fresh:
            return
        log.info("partitions assigned: %s", [tp.partition for tp in fresh])
        consumer.pause(*fresh)
        for tp in fresh:
            part = await self._open(tp)
            committed = await consumer.committed(tp)
            if committed is None:
                await consumer.seek_to_beginning(tp)
            else:
                consumer.seek(tp, committed)
            self._partitions[tp] = part
            consumer.resume(tp)
            log.info("%s: ready at committed offset %s", tp, committed)
        self.metrics.partitions.set(len(self._partitions))

    async def _reopen_locked(self, part: Partition) -> None:
        """Replace a partition whose producer cannot continue; the caller holds its lock.

        The partition is closed without committing and opened again in the
        background like a fresh assignment: a new producer with the same
        transactional id, a restore, and a seek to the committed offset.
        """
        log.warning("%s: replacing its producer", part.tp)
        consumer = self._require(self._consumer)
        if part.tp in consumer.assignment():
            consumer.pause(part.tp)
        await self._close_locked(part, commit=False)
        task = asyncio.create_task(self._reassign(part.tp))
        self._commits.add(task)
        task.add_done_callback(self._commits.discard)

    async def _reassign(self, tp: TopicPartition) -> None:
        consumer = self._require(self._consumer)
        for attempt in range(1, 31):
            if tp not in consumer.assignment() or tp in self._partitions or self._stopping.is_set():
                return
            try:
                await self.partitions_assigned({tp})
            except (KafkaError, PipelineError) as exc:
                log.warning("%s: reopening failed (attempt %s): %r", tp, attempt, exc)
                await asyncio.sleep(min(attempt, 5))
            else:
                return

    async def _close_partitions(self, tps: set[TopicPartition], *, commit: bool) -> None:
        for tp in list(tps):
            part = self._partitions.get(tp)
            if part is not None:
                await self._close(part, commit=commit)

    async def _close(self, part: Partition, *, commit: bool) -> None:
        async with part.lock:
            await self._close_locked(part, commit=commit)

    async def _close_locked(self, part: Partition, *, commit: bool) -> None:
        """Close ``part``; the caller holds its lock."""
        if part.closed:
            return
        part.closed = True
        self._partitions.pop(part.tp, None)
        if commit:
            try:
                await part.checkpoint.commit()
            except (PartitionFencedError, TransactionFailedError) as exc:
                log.warning("%s: could not commit on close: %s", part.tp, exc)
        else:
            await part.checkpoint.abort()
        await part.release()
        self._forget_gauges(part.tp)
        self.metrics.partitions.set(len(self._partitions))
        log.info("%s: closed", part.tp)

    async def _open(self, tp: TopicPartition) -> Partition:
        return await open_partition(
            tp,
            changelog=TopicPartition(dict(self._stages())[tp.topic], tp.partition),
            settings=self.settings,
            topology=self.topology,
            classifier=self._require(self._classifier),
            outputs=self._require(self._outputs),
            metrics=self.metrics,
        )

    @staticmethod
    def _require(value: _T | None) -> _T:
        if value is None:
            raise PipelineError("the worker is not started")
        return value
