"""The dedupe worker: one group consumer, one transactional producer, one loop (Kafka Streams' StreamThread).

Each cycle (:meth:`Worker._cycle`, under the worker's lock, which the rebalance callbacks
take too): fetch; hand the records to their tasks (:class:`~pipeline.worker.tasks.TaskTable`);
have the tasks handle them into the worker's one transaction
(:class:`~pipeline.worker.executor.TaskExecutor`); commit it when it is due; apply what a
failure asks (tasks moved back, a new producer, a rejoin); pause the tasks whose queues are
full; reopen broken ones. A partition that cannot be served within ``open_timeout`` stops
the worker with one line and a non-zero exit: it never stays in the group with a partition
it does not serve. A clean stop commits what is open; a stop after an exception aborts.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from typing import TypeVar

from aiohttp import web
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError

from pipeline.errors import BrokerUnavailableError, PipelineError
from pipeline.kafka import internals
from pipeline.kafka.partitioner import KeyPartitioner, owner_partition
from pipeline.state.directory import StateDirLock
from pipeline.state.restore import RestoreBudget, Restorer
from pipeline.state.transaction import Transaction
from pipeline.topology import Topology
from pipeline.worker import http as worker_http
from pipeline.worker.classify import Classifier, ClassifierFactory
from pipeline.worker.clients import worker_transactional_id
from pipeline.worker.context import PartitionContext
from pipeline.worker.emitter import OutputTopics
from pipeline.worker.executor import Outcome, TaskExecutor
from pipeline.worker.fetch import LoopFetch
from pipeline.worker.health import STOPPED, Health, partition_health
from pipeline.worker.identity import instance_taken
from pipeline.worker.io import WorkerIO, kafka_io
from pipeline.worker.limits import TopicLimits
from pipeline.worker.metadata_refresh import MetadataRefresh
from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.pacing import poll_ms
from pipeline.worker.producer import WorkerProducer
from pipeline.worker.settings import WorkerSettings
from pipeline.worker.standbys import StandbyReplicas
from pipeline.worker.task import ActiveTask
from pipeline.worker.tasks import TaskTable
from pipeline.worker.topic_watch import TopicWatch

log = logging.getLogger(__name__)

_T = TypeVar("_T")


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
        io: WorkerIO | None = None,
        classifier: ClassifierFactory = Classifier,
    ) -> None:
        """``io``: every way out of the process (:func:`~pipeline.worker.io.kafka_io` by default); ``classifier``:
        what builds the record classifier (the simulation's raises, to reach the handler-failure path)."""
        self.settings = settings.for_topology(topology.app)
        self.topology = topology
        self.metrics = metrics or WorkerMetrics.create()
        self.io = io or kafka_io()
        self._classifier = classifier
        self.transactional_id = worker_transactional_id(self.settings, topology.app)
        self._dir_lock = StateDirLock(self.settings.state_dir, topology, self.settings.group)
        self._lock = asyncio.Lock()  # one cycle, or one rebalance callback, at a time
        self._stopping = asyncio.Event()
        self._fetch = LoopFetch(max_records=self.settings.fetch_records)
        self._metadata = MetadataRefresh()
        self._producer = WorkerProducer(self.settings, self.io, self.transactional_id)
        self._consumer: AIOKafkaConsumer | None = None
        self._table: TaskTable | None = None
        self._executor: TaskExecutor | None = None
        self._restorer: Restorer | None = None
        self._http: web.AppRunner | None = None
        self._limits: TopicLimits | None = None  # each output topic's largest record (worker/limits.py)
        self._topic_watch: TopicWatch | None = None  # the configs it refuses to start on, read again

    # -- start -------------------------------------------------------------------------
    async def start(self) -> None:
        """Take the state dir, learn the topics, start the producer (which aborts what this worker's last
        run left open), join the group, serve HTTP."""
        self._dir_lock.acquire()
        try:
            await self._start()
        except BaseException:
            await self._release()
            raise

    async def _start(self) -> None:
        settings, io = self.settings, self.io
        layout = await io.layout(settings.bootstrap, self.topology)
        partitioner = KeyPartitioner()
        read_layout = functools.partial(io.layout, settings.bootstrap, self.topology)
        limits = self._limits = TopicLimits(layout.limits, read_layout)
        self._topic_watch = TopicWatch(
            read_layout, self.metrics.topic_config_refused, interval=settings.topic_check_interval
        )
        outputs = OutputTopics(layout.counts, partitioner, limits.by_topic, layout.timestamps)
        restorer = self._restorer = Restorer(
            lambda: io.changelog_reader(settings),
            RestoreBudget(settings.restore_budget_bytes),
            fetch_bytes=settings.restore_fetch_bytes,
        )
        context = PartitionContext(
            settings=settings,
            topology=self.topology,
            classifier=self._classifier(
                self.topology, partitioner, input_partitions=layout.counts[self.topology.topics.input]
            ),
            outputs=outputs,
            metrics=self.metrics,
            cluster=layout.cluster,
            topic_ids=layout.topic_ids,
            open_store=io.open_store,
            restorer=restorer,
            wall=io.wall,
        )
        standbys = StandbyReplicas(
            context, dict(self._stages()), self._served_positions, unplanned=self._metadata.missing
        )
        await standbys.scan()
        consumer = self._consumer = io.consumer(settings, assignor=standbys.assignor)
        try:
            await consumer.start()
        except KafkaError as exc:
            raise BrokerUnavailableError(f"cannot reach Kafka at {settings.bootstrap}: {exc}") from None
        group = io.group(consumer)
        try:
            producer = await self._producer.start()
        except KafkaError as exc:
            raise BrokerUnavailableError(f"cannot reach Kafka at {settings.bootstrap}: {exc}") from None
        txn = Transaction(
            producer,
            group=group.metadata,
            limits=limits.by_topic,
            timestamps=outputs.timestamps,
            send_bytes=settings.send_bytes,
            wall=io.wall,
        )
        self._executor = TaskExecutor(txn, settings, self.metrics)
        self._table = TaskTable(
            context,
            dict(self._stages()),
            io=io,
            consumer=consumer,
            group=group,
            txn=txn,
            standbys=standbys,
            fetch=self._fetch,
        )
        self._metadata.attach(consumer)
        consumer.subscribe([source for source, _ in self._stages()], listener=_Rebalance(self))
        if settings.metrics_port is not None:
            await self._serve_http(settings.metrics_port, layout.counts)
        self._topic_watch.start()
        log.info(
            "worker started: group %s, input %s (%s partitions), transactional id %s",
            settings.group,
            self.topology.topics.input,
            layout.counts[self.topology.topics.input],
            self.transactional_id,
        )

    async def _serve_http(self, port: int, counts: dict[str, int]) -> None:
        table = self._require(self._table)
        app = worker_http.build_app(
            table.served_stores,
            lambda topic, key: owner_partition(key, counts[topic]),
            [source for source, _ in self._stages()],
            self.metrics.registry,
            self.health,
            self.standby_states,
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

    def _served_positions(self) -> dict[TopicPartition, int]:
        return self._table.positions() if self._table is not None else {}

    # -- the group's word ----------------------------------------------------------------
    async def partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        """The group takes ``revoked`` away: the open transaction commits (or aborts) for every partition
        in it at once, then the revoked tasks close."""
        table = self._require(self._table)
        async with self._lock:
            if not self._producer.wanted:
                await self._settle(await self._require(self._executor).commit(table.tasks))
            else:
                await self._settle(await self._require(self._executor).abort())
            await table.revoked(revoked)

    async def partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        """The group gives this worker ``assigned``: each new partition opens in the background."""
        async with self._lock:
            await self._require(self._table).assigned(assigned)

    # -- the loop ------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask the loop to finish its transaction and exit."""
        self._stopping.set()
        self._fetch.wake()

    @property
    def tasks(self) -> dict[TopicPartition, ActiveTask]:
        """The partitions this worker serves or opens now, and their tasks."""
        return dict(self._table.tasks) if self._table is not None else {}

    def standby_partitions(self) -> set[TopicPartition]:
        """The partitions this worker keeps a standby replica of now."""
        return set(self._table.standbys.held) if self._table is not None else set()

    def standby_states(self) -> dict[str, dict[str, object]]:
        """Each standby (``<topic>-<partition>``): its state, position and lag, as ``/partitions`` shows them."""
        return self._table.standbys.describe() if self._table is not None else {}

    def health(self) -> Health:
        """Ready when every assigned partition is served and none is stuck; alive unless stuck or failed."""
        consumer, table = self._consumer, self._table
        if consumer is None or table is None:
            return STOPPED
        return partition_health(
            consumer.assignment(),
            table.tasks,
            failed=table.failure is not None,
            stopping=self._stopping.is_set(),
            standbys=table.standbys.describe(),
            warnings=self._topic_watch.warnings() if self._topic_watch is not None else (),
        )

    async def run(self) -> None:
        """Consume, decide and commit until stopped; commit what is open (abort after a failure)."""
        table = self._require(self._table)
        clean = False
        try:
            while not self._stopping.is_set():
                if table.failure is not None:
                    raise table.failure
                await self._cycle()
            clean = True
        except KafkaError as exc:
            taken = instance_taken(self.settings, exc)
            if taken is None:
                raise
            raise taken from None
        finally:
            await self._shutdown(commit=clean)

    async def _cycle(self) -> None:
        """One fetch; the records handled into the transaction; the commit when due; the upkeep."""
        consumer, table, executor = (
            self._require(self._consumer),
            self._require(self._table),
            self._require(self._executor),
        )
        if self._producer.wanted:  # before a fetch: what a fetch returns is never dropped
            async with self._lock:
                if not await self._producer.replace(executor.txn):
                    return
        wait = poll_ms(executor.eligible(table.tasks), commit_interval=self.settings.commit_interval)
        due_in = executor.due_in(table.tasks)
        if due_in is not None:  # a fetch never outwaits the open transaction's commit
            wait = max(min(wait, int(due_in * 1000)), 0)
        hurry = self._stopping.is_set() or table.failure is not None
        # a lingering transaction takes what came during its linger in one fetch, not a cycle per record
        gather = not hurry and wait > 0 and executor.lingering(table.tasks)
        batches = await self._fetch.next(consumer, wait, hurry=hurry, gather=gather)
        async with self._lock:
            table.feed(batches)
            await self._settle(await executor.process(table.tasks))
            table.backpressure()
            table.mark_caught_up(batches)
            if executor.due(table.tasks):
                await self._settle(await executor.commit(table.tasks))
                table.observe()
            table.mark_idle()
            table.reap()
            table.watch()
            table.standbys.observe()
        await asyncio.sleep(0)  # a fetch with nothing to wait for returns at once: let the others run

    async def _settle(self, outcome: Outcome) -> None:
        """Apply what the executor asks: tasks moved back, a rejoin, a new producer, a stop."""
        table = self._require(self._table)
        table.apply(outcome)
        if outcome.reread_limits:
            await self._require(self._limits).reread()
        if outcome.replace_producer:
            if (stop := self._producer.lost(fenced=outcome.rejoin)) is not None:
                table.fail(stop)  # fenced again and again: another process has this transactional id
            await self._producer.replace(self._require(self._executor).txn)

    # -- stop ----------------------------------------------------------------------------
    async def _shutdown(self, *, commit: bool) -> None:
        self._stopping.set()
        table, executor = self._table, self._executor
        if table is not None and executor is not None:
            async with self._lock:
                table.stopping = True  # after an exception too: no assignment opens anything from now on
                await self._fetch.close()
                if commit and not self._producer.wanted:
                    await self._settle(await executor.commit(table.tasks))
                await executor.abort()  # whatever is still open (after a failure, or a failed commit)
                await table.close()
        await self._release()
        log.info("worker stopped")

    async def _release(self) -> None:
        """Stop what was started, in the reverse order; every step runs though one before it raised (the
        consumer still leaves the group, the state dir is unlocked), and the last error comes out after."""
        async with contextlib.AsyncExitStack() as steps:  # runs its callbacks last pushed first
            steps.callback(self._dir_lock.release)
            if (http := self._http) is not None:
                self._http = None
                steps.push_async_callback(http.cleanup)
            if (consumer := self._consumer) is not None:
                self._consumer = None
                steps.push_async_callback(internals.stop_consumer, consumer)
            if self._topic_watch is not None:
                steps.push_async_callback(self._topic_watch.close)
            steps.push_async_callback(self._metadata.close)
            if self._restorer is not None:
                steps.push_async_callback(self._restorer.close)
            if self._executor is not None:
                steps.push_async_callback(self._executor.txn.producer.stop)

    @staticmethod
    def _require(value: _T | None) -> _T:
        if value is None:
            raise PipelineError("the worker is not started")
        return value
