"""What every partition of one worker shares (:class:`PartitionContext`), and what it builds for each.

The settings, topology, classifier, output topics, metrics and restore budget of the
worker; the identity, store, stage and transactional producer of each partition it
opens are made here, so that :mod:`pipeline.worker.partition` holds only a
partition's life.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiokafka import TopicPartition

from pipeline.errors import BrokerUnavailableError
from pipeline.kafka.clients import transactional_producer
from pipeline.kafka.transactional import TransactionalProducer
from pipeline.state import directory
from pipeline.state.restore import RestoreBudget
from pipeline.state.store import PartitionStore
from pipeline.state.store_meta import StoreIdentity
from pipeline.state.transaction import PartitionTransaction
from pipeline.topology import Topology
from pipeline.worker.classify import Classifier
from pipeline.worker.effect_stage import EffectStage
from pipeline.worker.emitter import OutputTopics
from pipeline.worker.event_stage import EventStage
from pipeline.worker.metrics import Tally, WorkerMetrics
from pipeline.worker.settings import WorkerSettings
from pipeline.worker.stage import Stage


@dataclass(frozen=True)
class PartitionContext:
    """What every partition of one worker shares: settings, topology, outputs, metrics, where stores live."""

    settings: WorkerSettings
    topology: Topology
    classifier: Classifier
    outputs: OutputTopics
    metrics: WorkerMetrics
    cluster: str = ""  # the cluster id, and each changelog's topic id: a store caches one changelog
    topic_ids: Any = None  # Mapping[str, str]
    open_store: directory.StoreOpener = PartitionStore.open
    budget: RestoreBudget | None = None
    # whether the group still counts this worker a member of its generation (None: unknown);
    # asked before every producer start, which would fence whoever the group assigns the partition to
    member: Callable[[], Awaitable[bool | None]] | None = None

    def identity(self, tp: TopicPartition, changelog: TopicPartition) -> StoreIdentity:
        """Whose store ``tp``'s is (names), and which changelog it caches (ids)."""
        ids = self.topic_ids or {}
        return StoreIdentity(
            app=self.topology.app,
            group=self.settings.for_topology(self.topology.app).group,
            topic=tp.topic,
            partition=tp.partition,
            changelog=changelog.topic,
            cluster=self.cluster,
            changelog_id=ids.get(changelog.topic, ""),
        )

    @property
    def worker_settings(self) -> WorkerSettings:
        """The settings with the group resolved for this topology (its app name when none was given)."""
        return self.settings.for_topology(self.topology.app)

    def open_store_of(self, tp: TopicPartition, identity: StoreIdentity, *, follow: bool) -> PartitionStore:
        """Open ``tp``'s store where it lives (``follow``: to be restored, written and not read)."""
        settings = self.worker_settings
        return directory.open_store(
            directory.store_path(settings.state_dir, self.topology, settings.group, tp),
            bucket_ms=directory.topology_bucket_ms(self.topology),
            identity=identity,
            opener=self.open_store,
            follow=follow,
        )

    def stage_for(self, tp: TopicPartition, txn: PartitionTransaction, recorder: Tally) -> Stage:
        """The stage that handles ``tp``'s records: events for the input topic, effects for the effects topic."""
        settings = self.worker_settings
        skew_ms = int(settings.max_clock_skew * 1000)
        if tp.topic == self.topology.topics.input:
            return EventStage(
                tp=tp,
                topology=self.topology,
                classifier=self.classifier,
                txn=txn,
                outputs=self.outputs,
                recorder=recorder,
                chunk_records=settings.chunk_records,
                max_skew_ms=skew_ms,
            )
        return EffectStage(
            tp=tp,
            topology=self.topology,
            txn=txn,
            outputs=self.outputs,
            recorder=recorder,
            chunk_records=settings.chunk_records,
            max_skew_ms=skew_ms,
        )

    def transaction_for(
        self,
        tp: TopicPartition,
        producer: TransactionalProducer,
        store: PartitionStore,
        changelog: TopicPartition,
    ) -> PartitionTransaction:
        """``tp``'s transaction over its producer and its store (served), with the output topics' limits."""
        settings = self.worker_settings
        return PartitionTransaction(
            tp=tp,
            group=settings.group,
            producer=producer,
            store=store,
            changelog=changelog,
            limits=self.outputs.limits,
            timestamps=self.outputs.timestamps,
            send_bytes=settings.send_bytes,
        )

    def restore_options(self, tp: TopicPartition) -> dict[str, Any]:
        """The keywords of :func:`pipeline.state.restore.restore` for ``tp``'s store."""
        settings = self.worker_settings
        return {
            "bootstrap": settings.bootstrap,
            "fetch_bytes": settings.restore_fetch_bytes,
            "progress_every": settings.restore_progress_every,
            "remaining": self.metrics.restore_remaining.labels(tp.topic, str(tp.partition)),
            "budget": self.budget,
        }

    async def start_producer(self, tp: TopicPartition, name: str) -> TransactionalProducer:
        """A started producer with ``tp``'s transactional id, once the group confirms this worker (starting
        it fences every older one); a failed start stops it and raises."""
        await self.check_member(name)
        producer = self.new_producer(tp, name)
        try:
            await producer.start()
        except BaseException:
            await producer.stop()
            raise
        return producer

    def new_producer(self, tp: TopicPartition, name: str) -> TransactionalProducer:
        """A producer with ``tp``'s transactional id: starting it fences every older one."""
        settings = self.worker_settings
        txn_id = f"{self.topology.app}-{settings.group}-{tp.topic}-{tp.partition}"
        return TransactionalProducer(transactional_producer(settings, txn_id), name)

    async def check_member(self, name: str) -> None:
        """Raise :class:`BrokerUnavailableError` (retriable: opening tries again) unless the group confirms
        this worker is still a member of its generation: a worker dropped from its group while it
        could not hear (an outage, a pause) would otherwise fence the partition's new assignee."""
        if self.member is not None and not await self.member():
            raise BrokerUnavailableError(
                f"{name}: the group does not confirm this worker as a member now; not starting its producer"
            )
