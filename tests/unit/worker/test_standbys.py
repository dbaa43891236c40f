"""The positions a worker claims in its JoinGroup metadata: what its stores on disk really hold, and what the leader does with them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition

from pipeline.errors import StoreStaleError
from pipeline.state import directory
from pipeline.state.store import PartitionStore
from pipeline.worker import standby as standby_module
from pipeline.worker import standbys as standbys_module
from pipeline.worker.assignment import CAUGHT_UP, Claim, plan
from pipeline.worker.assignor import Held, decode_claim, encode_claim
from pipeline.worker.partition import Partition
from pipeline.worker.standbys import StandbyReplicas

from .fakes import INPUT, TOPICS, ProducerFactory, install, keys_for, make_partition, record

TP = TopicPartition(INPUT, 0)
SUB = frozenset({INPUT})
FAR = 3 * CAUGHT_UP  # further apart than the leader forgives


class FakeReader:
    """The standbys' shared changelog reader: nothing to connect to."""

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        self.started = False

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.started = False


@pytest.fixture
def part(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Partition:
    """Partition 0 over fake clients (not opened); its context is the worker's."""
    install(monkeypatch, producers=ProducerFactory())
    monkeypatch.setattr(standbys_module, "ChangelogReader", FakeReader)
    monkeypatch.setattr(standby_module, "POLL_S", 0.01)
    monkeypatch.setattr(standby_module, "RETRY_FIRST_S", 0.01)
    return make_partition(tmp_path, standby_replicas=1)


def _replicas(part: Partition) -> StandbyReplicas:
    return StandbyReplicas(part.context, {TOPICS.input: TOPICS.changelog}, dict)


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
    part: Partition, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store that held offset 30,000 is found stale by its standby and rebuilt: the worker claims the rebuilt
    store's position, not the old one, and the leader gives the partition to the member really most current."""
    replicas = _replicas(part)
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

    monkeypatch.setattr(standby_module, "catch_up", catch_up)
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


async def test_a_served_store_wiped_on_release_is_no_longer_claimed(part: Partition) -> None:
    """A partition whose store could not be read is wiped when it closes: its worker then claims no copy of it,
    so the leader moves it to the member with a current standby instead of keeping it on an empty store."""
    replicas = _replicas(part)
    await replicas.assigned({TP})
    await part.open()
    store = part.store
    assert store is not None
    store.write_raw([(b"k", b"v", 2 * store.bucket_ms)], changelog_offset=FAR, stream_time=1)
    key = keys_for(0, 1)[0]
    [bucket] = list(store.buckets())
    store._buckets[bucket][key.encode()] = b"not an entry"
    part.feed([record(FAR + 1, key)])
    await part.work()  # the read fails: BROKEN, wiped on release
    await part.close(commit=False)
    replicas.remember(TP, part.position)
    assert not store.path.exists()
    claim = replicas.claim()
    assert claim.positions.get(TP, -1) == -1
    standby = Claim(SUB, {TP: FAR})
    plans = plan([TP], {"wiped": _wire(claim), "standby": standby}, replicas=1)
    assert plans["standby"].active == [TP]
