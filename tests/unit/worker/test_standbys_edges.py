"""A worker's standbys at their edges: a store level with its changelog's end, a standby promoted, the assignor
the standbys build from the worker's settings."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition

from pipeline.state import directory
from pipeline.state.store import PartitionStore
from pipeline.worker import standby as standby_module
from pipeline.worker.assignor import decode_claim, decode_standbys
from pipeline.worker.context import PartitionContext
from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.standbys import StandbyReplicas

from .fakes import INPUT, TOPICS, TOPOLOGY, FakeReader, Harness, classifier, outputs, restorer, settings

TP = TopicPartition(INPUT, 0)
CHANGELOG = TopicPartition(TOPICS.changelog, 0)


class Cluster:
    """The one call the assignor makes on aiokafka's cluster metadata."""

    def __init__(self, partitions: dict[str, int]) -> None:
        self.partitions = partitions

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        count = self.partitions.get(topic)
        return set(range(count)) if count else None


async def _until(condition: Callable[[], bool], what: str) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(what)


def _store_at(state_dir: Path, offset: int) -> None:
    """Leave partition 0's store on disk, at changelog ``offset``, where a worker of the app's group keeps it."""
    path = directory.store_path(state_dir, TOPOLOGY, TOPOLOGY.app, TP)
    identity = PartitionContext(
        settings=settings(state_dir),
        topology=TOPOLOGY,
        classifier=classifier(),
        outputs=outputs(),
        metrics=WorkerMetrics.create(),
    ).identity(TP, CHANGELOG)
    store = PartitionStore.open(path, bucket_ms=directory.topology_bucket_ms(TOPOLOGY), identity=identity)
    store.write_raw([(b"k", b"v", 2 * store.bucket_ms)], changelog_offset=offset, stream_time=1)
    store.close()


def _replicas(
    state_dir: Path, *, end: int, opened: list[Path] | None = None, **overrides: Any
) -> StandbyReplicas:
    """A worker's standbys over a context whose settings name no group (the app's is taken), whose changelog
    partition 0 ends at ``end``, and whose opener notes each store it opens in ``opened``."""

    def opener(path: Path, **kwargs: Any) -> PartitionStore:
        if opened is not None:
            opened.append(path)
        return PartitionStore.open(path, **kwargs)

    context = PartitionContext(
        settings=settings(state_dir, **overrides),
        topology=TOPOLOGY,
        classifier=classifier(),
        outputs=outputs(),
        metrics=WorkerMetrics.create(),
        open_store=opener,
        restorer=restorer(FakeReader(ends={CHANGELOG: end})),
    )
    return StandbyReplicas(context, {TOPICS.input: TOPICS.changelog}, dict)


@pytest.mark.parametrize(("end", "claimed"), [(5, {TP: 4}), (4, {})])
async def test_a_store_on_disk_is_claimed_at_start_only_while_its_position_lies_before_its_changelogs_end(
    tmp_path: Path, end: int, claimed: dict[TopicPartition, int]
) -> None:
    """The store's last record at offset 4: claimed while the changelog ends after it (5), nothing claimed once
    the end is 4 (the store holds a record the changelog does not); the store is read through the worker's opener."""
    _store_at(tmp_path, 4)
    opened: list[Path] = []
    replicas = _replicas(tmp_path, end=end, opened=opened)
    await replicas.scan()
    assert replicas.claim().positions == claimed
    assert opened == [directory.store_path(tmp_path, TOPOLOGY, TOPOLOGY.app, TP)]


def test_the_assignor_plans_the_settings_standby_replicas_and_claims_what_the_worker_holds(
    tmp_path: Path,
) -> None:
    """Leading a group of two with one standby replica: each member is given one partition and the other's
    as its standby; the metadata it sends claims the stores this worker holds."""
    replicas = _replicas(tmp_path, end=0, standby_replicas=1)
    replicas.known[TP] = 3
    _store_at(tmp_path, 3)
    metadata = replicas.assignor.metadata([INPUT])
    assert decode_claim(metadata.subscription, metadata.user_data).positions == {TP: 3}
    given = replicas.assignor.assign(Cluster({INPUT: 2}), {"a": metadata, "b": metadata})
    for member, other in (("a", "b"), ("b", "a")):
        assert decode_standbys(given[member].user_data) == given[other].partitions()
        assert len(given[member].partitions()) == 1


def test_a_topic_the_leaders_metadata_lacks_is_reported_as_unplanned(tmp_path: Path) -> None:
    """Leading without the input topic's partitions: the worker's unplanned callback is told which topics."""
    told: list[frozenset[str]] = []
    context = _replicas(tmp_path, end=0).context
    replicas = StandbyReplicas(context, {TOPICS.input: TOPICS.changelog}, dict, unplanned=told.append)
    metadata = replicas.assignor.metadata([INPUT])
    replicas.assignor.assign(Cluster({}), {"a": metadata})
    assert told == [frozenset({INPUT})]


@pytest.fixture
def harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    """Partition 0's task over fakes (not opened), standbys replaying without waiting."""
    monkeypatch.setattr(standby_module, "POLL_S", 0.01)
    monkeypatch.setattr(standby_module, "RETRY_FIRST_S", 0.01)
    made = Harness(tmp_path, {"standby_replicas": 1})
    yield made
    made.close()


async def test_a_standby_of_a_partition_now_assigned_here_is_closed_and_its_store_position_claimed(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A promotion: the standby of partition 0, level at offset 7, is closed when partition 0 is assigned here;
    the store it leaves on disk is claimed at 7, and the line says where it was and how far behind."""
    replicas = StandbyReplicas(harness.context, {TOPICS.input: TOPICS.changelog}, dict)

    async def catch_up(store: PartitionStore, _changelog: TopicPartition, **_kwargs: Any) -> tuple[int, int]:
        if store.changelog_offset < 7:
            store.write_raw([(b"k", b"v", 2 * store.bucket_ms)], changelog_offset=7, stream_time=1)
            return 1, 8
        return 0, 8

    monkeypatch.setattr(replicas.context.require_restorer(), "catch_up", catch_up)
    replicas.assignor.standbys = frozenset({TP})
    await replicas.assigned(set())
    try:
        await _until(lambda: replicas.held[TP].lag_records == 0, "the standby never levelled")
        replicas.assignor.standbys = frozenset()
        with caplog.at_level(logging.INFO, logger="pipeline.worker.standbys"):
            await replicas.assigned({TP})
        assert replicas.held == {}
        assert replicas.claim().positions == {TP: 7}
        assert replicas.served == frozenset({TP})
        assert f"{INPUT}-0: promoted from standby at changelog offset 7 (0 records behind" in caplog.text
    finally:
        await replicas.close()


async def test_the_stores_of_standbys_closed_with_the_worker_are_claimed_where_they_were_left(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """close() stops every standby; the store each leaves on disk is claimed at its position (a restart, or a
    rejoin, offers it to the group)."""
    replicas = StandbyReplicas(harness.context, {TOPICS.input: TOPICS.changelog}, dict)

    async def catch_up(store: PartitionStore, _changelog: TopicPartition, **_kwargs: Any) -> tuple[int, int]:
        if store.changelog_offset < 5:
            store.write_raw([(b"k", b"v", 2 * store.bucket_ms)], changelog_offset=5, stream_time=1)
            return 1, 6
        return 0, 6

    monkeypatch.setattr(replicas.context.require_restorer(), "catch_up", catch_up)
    replicas.assignor.standbys = frozenset({TP})
    await replicas.assigned(set())
    await _until(lambda: replicas.held[TP].lag_records == 0, "the standby never levelled")
    await replicas.close()
    assert replicas.held == {}
    assert replicas.claim().positions == {TP: 5}
