"""What every task of one worker shares (:class:`PartitionContext`), and what it builds for each.

The settings, topology, classifier, output topics, metrics and restore service of the
worker; the identity, store and stage of each partition it serves are made here, so that
:mod:`pipeline.worker.task` holds only a task's life.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiokafka import TopicPartition

from pipeline.errors import PipelineError
from pipeline.state import directory
from pipeline.state.partition_transaction import PartitionTransaction
from pipeline.state.restore import Restorer
from pipeline.state.store import PartitionStore
from pipeline.state.store_meta import StoreIdentity
from pipeline.state.transaction import Transaction
from pipeline.topology import Topology
from pipeline.worker.classify import Classifier
from pipeline.worker.effect_stage import EffectStage
from pipeline.worker.emitter import OutputTopics
from pipeline.worker.event_stage import EventStage
from pipeline.worker.io import wall_clock
from pipeline.worker.metrics import Tally, WorkerMetrics
from pipeline.worker.settings import WorkerSettings
from pipeline.worker.stage import Stage


@dataclass(frozen=True)
class PartitionContext:
    """What every task of one worker shares: settings, topology, outputs, metrics, where stores live."""

    settings: WorkerSettings
    topology: Topology
    classifier: Classifier
    outputs: OutputTopics
    metrics: WorkerMetrics
    cluster: str = ""  # the cluster id, and each changelog's topic id: a store caches one changelog
    topic_ids: Any = None  # Mapping[str, str]
    open_store: directory.StoreOpener = PartitionStore.open
    restorer: Restorer | None = None  # the worker's one restore service (active restores and standbys)
    wall: Callable[[], float] = wall_clock  # the clock bounding a record's time

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
                wall=self.wall,
            )
        return EffectStage(
            tp=tp,
            topology=self.topology,
            txn=txn,
            outputs=self.outputs,
            recorder=recorder,
            chunk_records=settings.chunk_records,
            max_skew_ms=skew_ms,
            wall=self.wall,
        )

    def part_for(
        self, tp: TopicPartition, txn: Transaction, store: PartitionStore, changelog: TopicPartition
    ) -> PartitionTransaction:
        """``tp``'s part of the worker's transaction, over its store (served)."""
        return PartitionTransaction(tp=tp, txn=txn, store=store, changelog=changelog)

    def require_restorer(self) -> Restorer:
        """The worker's restore service (made at its start)."""
        if self.restorer is None:
            raise PipelineError("the worker has no restore service")
        return self.restorer
