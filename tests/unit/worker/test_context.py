"""What the worker's shared context builds for each partition: its store identity, its store, its stage."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition

from pipeline.errors import PipelineError, StoreIdentityError
from pipeline.state import directory
from pipeline.state.store import PartitionStore
from pipeline.state.store_meta import StoreIdentity
from pipeline.worker.context import PartitionContext
from pipeline.worker.effect_stage import EffectStage
from pipeline.worker.event_stage import EventStage
from pipeline.worker.metrics import NullRecorder, WorkerMetrics

from .fakes import TOPICS, TOPOLOGY, FakeProducer, classifier, outputs, part_transaction, restorer, settings

INPUT0 = TopicPartition(TOPICS.input, 3)
CHANGELOG0 = TopicPartition(TOPICS.changelog, 3)
EFFECTS0 = TopicPartition(TOPICS.effects, 2)
STORE: Any = SimpleNamespace(stream_time=0)  # what a part of the transaction reads of its store when made


def _context(state_dir: Path, **fields: Any) -> PartitionContext:
    values: dict[str, Any] = {
        "settings": settings(state_dir),  # no group given: the topology's app name
        "topology": TOPOLOGY,
        "classifier": classifier(),
        "outputs": outputs(),
        "metrics": WorkerMetrics.create(),
    }
    values.update(fields)
    return PartitionContext(**values)


def test_a_partitions_store_identity_names_the_app_group_partition_changelog_and_its_ids(
    tmp_path: Path,
) -> None:
    """The identity holds the app, the group the topology resolves to, the partition, its changelog and their ids."""
    context = _context(tmp_path, cluster="c-1", topic_ids={TOPICS.changelog: "id-7", "other": "id-8"})
    assert context.identity(INPUT0, CHANGELOG0) == StoreIdentity(
        app=TOPOLOGY.app,
        group=TOPOLOGY.app,
        topic=TOPICS.input,
        partition=3,
        changelog=TOPICS.changelog,
        cluster="c-1",
        changelog_id="id-7",
    )


def test_without_known_topic_ids_a_store_identity_has_an_empty_changelog_id(tmp_path: Path) -> None:
    """No topic ids learnt (or none for this changelog): the changelog id is empty, never made up."""
    assert _context(tmp_path).identity(INPUT0, CHANGELOG0).changelog_id == ""
    other = _context(tmp_path, topic_ids={"other": "id-8"})
    assert other.identity(INPUT0, CHANGELOG0).changelog_id == ""
    named = _context(tmp_path, settings=settings(tmp_path, group="g"))
    assert named.identity(INPUT0, CHANGELOG0).group == "g"


def test_a_store_opens_where_the_worker_keeps_it_with_its_bucket_width_and_mode(tmp_path: Path) -> None:
    """open_store_of opens, through the context's opener, the partition's store under state_dir/app/group."""
    opened: list[dict[str, Any]] = []

    def opener(path: Path, **kwargs: Any) -> PartitionStore:
        opened.append({"path": path, **kwargs})
        return PartitionStore.open(path, **kwargs)

    context = _context(tmp_path, open_store=opener, topic_ids={TOPICS.changelog: "id-7"})
    identity = context.identity(INPUT0, CHANGELOG0)
    where = tmp_path / TOPOLOGY.app / TOPOLOGY.app / f"{TOPICS.input}-3"
    store = context.open_store_of(INPUT0, identity, follow=True)
    try:
        assert store.path == where
        assert store.follow
        assert store.bucket_ms == directory.topology_bucket_ms(TOPOLOGY)
    finally:
        store.close()
    served = context.open_store_of(INPUT0, identity, follow=False)
    served.close()
    assert not served.follow
    assert opened == [
        {"path": where, "bucket_ms": store.bucket_ms, "identity": identity, "follow": True},
        {"path": where, "bucket_ms": store.bucket_ms, "identity": identity, "follow": False},
    ]
    with pytest.raises(StoreIdentityError):  # the identity was checked against the store's
        context.open_store_of(
            INPUT0, context.identity(TopicPartition(TOPICS.input, 4), CHANGELOG0), follow=False
        )


def _wall() -> float:
    return 42.0


@pytest.mark.parametrize(("where", "kind"), [(INPUT0, EventStage), (EFFECTS0, EffectStage)])
def test_each_consumed_topic_gets_its_stage_built_with_the_workers_settings(
    tmp_path: Path, where: TopicPartition, kind: type[Any]
) -> None:
    """The input topic's records go to an event stage, the effects topic's to an effect stage: each with the
    partition, its transaction, the outputs, the partition's recorder, the chunk size, the skew bound in ms and the clock."""
    context = _context(tmp_path, settings=settings(tmp_path, chunk_records=7, max_clock_skew=2.5), wall=_wall)
    txn = part_transaction(FakeProducer(), where, store=STORE, changelog=CHANGELOG0)
    recorder = NullRecorder()
    stage: Any = context.stage_for(where, txn, recorder)  # type: ignore[arg-type]
    assert type(stage) is kind
    assert (stage.tp, stage.topology, stage.txn, stage.outputs, stage.recorder) == (
        where,
        TOPOLOGY,
        txn,
        context.outputs,
        recorder,
    )
    assert (stage.chunk_records, stage.max_skew_ms, stage.wall) == (7, 2500, _wall)
    if kind is EventStage:
        assert stage.classifier is context.classifier


def test_a_partitions_part_of_the_transaction_is_over_its_store_and_changelog(tmp_path: Path) -> None:
    """part_for ties the partition, the worker's transaction, the served store and the changelog together."""
    context = _context(tmp_path)
    carrier = part_transaction(FakeProducer(), INPUT0, store=STORE, changelog=CHANGELOG0)
    store: Any = SimpleNamespace(stream_time=5)
    part = context.part_for(INPUT0, carrier.txn, store, CHANGELOG0)
    assert (part.tp, part.txn, part.store, part.changelog) == (INPUT0, carrier.txn, store, CHANGELOG0)


def test_the_restore_service_is_the_workers_and_its_absence_is_an_error(tmp_path: Path) -> None:
    """require_restorer gives the worker's restore service; a context made without one says so."""
    service = restorer()
    assert _context(tmp_path, restorer=service).require_restorer() is service
    with pytest.raises(PipelineError) as raised:
        _context(tmp_path).require_restorer()
    assert str(raised.value) == "the worker has no restore service"
