"""The positions a worker claims in its JoinGroup metadata: what its stores on disk really hold, and what the leader does with them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition

from pipeline.errors import StoreStaleError
from pipeline.state import directory
from pipeline.state.store import PartitionStore
from pipeline.worker import standby as standby_module
from pipeline.worker.assignment import CAUGHT_UP, Claim, plan
from pipeline.worker.assignor import Held, decode_claim, encode_claim
from pipeline.worker.loop import Worker
from pipeline.worker.standbys import StandbyReplicas

from .fakes import (
    INPUT,
    TOPICS,
    TOPOLOGY,
    FakeReader,
    Harness,
    fake_io,
    keys_for,
    record,
    settings,
)

TP = TopicPartition(INPUT, 0)
SUB = frozenset({INPUT})
FAR = 3 * CAUGHT_UP  # further apart than the leader forgives


@pytest.fixture
def harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    """Partition 0's task over fakes (not opened); its context is the worker's."""
    monkeypatch.setattr(standby_module, "POLL_S", 0.01)
    monkeypatch.setattr(standby_module, "RETRY_FIRST_S", 0.01)
    made = Harness(tmp_path, {"standby_replicas": 1})
    yield made
    made.close()


def _replicas(h: Harness) -> StandbyReplicas:
    return StandbyReplicas(h.context, {TOPICS.input: TOPICS.changelog}, dict)


def _store_at(replicas: StandbyReplicas, tp: TopicPartition, offset: int) -> Path:
    """Leave a store of ``tp`` on disk whose changelog position is ``offset``."""
    settings = replicas.settings
    path = directory.store_path(settings.state_dir, replicas.context.topology, settings.group, tp)
    store = PartitionStore.open(
        path,
        bucket_ms=directory.topology_bucket_ms(replicas.context.topology),
        identity=replicas.identity(tp),
    )
    store.write_raw([(b"k", b"v", 2 * store.bucket_ms)], changelog_offset=offset, stream_time=1)
    store.close()
    return path


def _wire(held: Held) -> Claim:
    """The claim as the leader reads it: encoded by the member, decoded by the leader."""
    return decode_claim([INPUT], encode_claim(held))


async def _until(condition: Callable[[], bool], what: str) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(what)


async def test_a_standby_that_rebuilt_its_stale_store_claims_what_the_rebuilt_store_holds(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store that held offset 30,000 is found stale by its standby and rebuilt: the worker claims the rebuilt
    store's position, not the old one, and the leader gives the partition to the member really most current."""
    replicas = _replicas(harness)
    _store_at(replicas, TP, 30_000)
    replicas.remember(TP, 30_000)  # it closed there earlier
    rounds: list[int] = []

    async def catch_up(store: PartitionStore, _changelog: TopicPartition, **_kwargs: Any) -> tuple[int, int]:
        rounds.append(store.changelog_offset)
        if len(rounds) == 1:
            raise StoreStaleError(f"store {store.path} is beyond the end of its changelog")
        if store.changelog_offset >= 49:
            return 0, 50  # level: the standby waits before its next round
        store.write_raw([(b"k", b"v", 2 * store.bucket_ms)], changelog_offset=49, stream_time=1)
        return 1, 50

    monkeypatch.setattr(replicas.context.require_restorer(), "catch_up", catch_up)
    replicas.assignor.standbys = frozenset({TP})
    await replicas.assigned(set())
    try:
        await _until(lambda: replicas.held[TP].position == 49, "the standby never replayed its rebuilt store")
        claim = replicas.claim()
        assert claim.positions[TP] == 49
        current = Claim(SUB, {TP: 49 + FAR})
        assert plan([TP], {"rebuilt": _wire(claim), "current": current}, replicas=1)["current"].active == [TP]
        replicas.assignor.standbys = frozenset()
        await replicas.assigned(set())  # the standby is given up: its store stays on disk, at 49
        assert replicas.claim().positions[TP] == 49
    finally:
        await replicas.close()


async def test_a_served_store_wiped_on_release_is_no_longer_claimed(harness: Harness) -> None:
    """A partition whose store could not be read is wiped when it closes: its worker then claims no copy of it,
    so the leader moves it to the member with a current standby instead of keeping it on an empty store."""
    replicas = _replicas(harness)
    await replicas.assigned({TP})
    part = await harness.open(0)
    store = part.store
    assert store is not None
    store.write_raw([(b"k", b"v", 2 * store.bucket_ms)], changelog_offset=FAR, stream_time=1)
    key = keys_for(0, 1)[0]
    [bucket] = list(store.buckets())
    store._buckets[bucket][key.encode()] = b"not an entry"
    harness.feed([record(FAR + 1, key)])
    await harness.work()  # the read fails: BROKEN, wiped on release
    part.close()
    replicas.remember(TP, part.released_at)
    assert not store.path.exists()
    claim = replicas.claim()
    assert claim.positions.get(TP, -1) == -1
    standby = Claim(SUB, {TP: FAR})
    plans = plan([TP], {"wiped": _wire(claim), "standby": standby}, replicas=1)
    assert plans["standby"].active == [TP]


async def test_a_store_on_disk_ahead_of_its_changelog_claims_nothing_at_start(
    tmp_path: Path,
) -> None:
    """A worker starts with two stores on disk: the one whose position is beyond its changelog's end (another log's
    cache) is not claimed, the other is; so the leader leaves the first partition with its sticky owner."""
    ahead, behind = TP, TopicPartition(INPUT, 1)
    state_dir = tmp_path / "w"
    placed = StandbyReplicas(Harness(state_dir).context, {TOPICS.input: TOPICS.changelog}, dict)
    changelog = TOPICS.changelog
    # the ids the fake topic layout gives the worker (fake_io): its stores carry them
    placed.context = replace(placed.context, cluster="fake-cluster", topic_ids={changelog: f"id-{changelog}"})
    _store_at(placed, ahead, 5 * FAR)
    _store_at(placed, behind, 500)
    reader = FakeReader(ends={TopicPartition(changelog, 0): FAR + 1, TopicPartition(changelog, 1): 600})
    io, _clients = fake_io(reader=reader)
    worker = Worker(settings(state_dir, standby_replicas=1), TOPOLOGY, io=io)
    await worker.start()
    try:
        table = worker._table
        assert table is not None
        standbys = table.standbys
        claim = standbys.claim()
        assert claim.positions == {behind: 500}
        owner = Claim(SUB, {ahead: FAR}, active=frozenset({ahead}))
        plans = plan([ahead], {"restarted": _wire(claim), "owner": owner}, replicas=1)
        assert plans["owner"].active == [ahead]
    finally:
        worker.stop()
        await worker.run()


async def test_a_standby_does_not_claim_its_store_before_checking_it_against_the_changelog(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A standby opens a store whose position (5 * FAR) its changelog never reached; until a round has compared it
    with the changelog's end, the worker claims nothing of it, and the sticky owner keeps the partition."""
    replicas = _replicas(harness)
    _store_at(replicas, TP, 5 * FAR)
    never = asyncio.Event()

    async def catch_up(_store: PartitionStore, _changelog: TopicPartition, **_kwargs: Any) -> tuple[int, int]:
        await never.wait()  # the end is not read yet
        return 0, 0

    monkeypatch.setattr(replicas.context.require_restorer(), "catch_up", catch_up)
    replicas.assignor.standbys = frozenset({TP})
    await replicas.assigned(set())
    try:
        await _until(lambda: replicas.held[TP].store is not None, "the standby never opened its store")
        claim = replicas.claim()
        assert claim.positions[TP] == -1
        owner = Claim(SUB, {TP: FAR}, active=frozenset({TP}))
        assert plan([TP], {"standby": _wire(claim), "owner": owner}, replicas=1)["owner"].active == [TP]
    finally:
        await replicas.close()
    replicas.assignor.standbys = frozenset()
    assert replicas.claim().positions.get(TP, -1) == -1  # closed unchecked: still nothing claimed
