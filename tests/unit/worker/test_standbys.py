"""The positions a worker claims in its JoinGroup metadata: what its stores on disk really hold, and what the leader does with them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
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
from pipeline.worker.loop import Worker
from pipeline.worker.standby import Standby
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


@contextlib.asynccontextmanager
async def _started_over(
    tmp_path: Path, stores: dict[TopicPartition, int], reader: FakeReader
) -> AsyncIterator[StandbyReplicas]:
    """A worker started over a state directory holding a store of each of ``stores`` at its changelog position;
    its changelogs' ends are what ``reader`` says. Yields the worker's standbys (what it claims)."""
    state_dir = tmp_path / "w"
    placed = StandbyReplicas(Harness(state_dir).context, {TOPICS.input: TOPICS.changelog}, dict)
    changelog = TOPICS.changelog
    # the ids the fake topic layout gives the worker (fake_io): its stores carry them
    placed.context = replace(placed.context, cluster="fake-cluster", topic_ids={changelog: f"id-{changelog}"})
    for tp, offset in stores.items():
        _store_at(placed, tp, offset)
    io, _clients = fake_io(reader=reader)
    worker = Worker(settings(state_dir, standby_replicas=1), TOPOLOGY, io=io)
    await worker.start()
    try:
        table = worker._table
        assert table is not None
        yield table.standbys
    finally:
        worker.stop()
        await worker.run()


def _changelog(partition: int) -> TopicPartition:
    return TopicPartition(TOPICS.changelog, partition)


async def test_a_store_on_disk_ahead_of_its_changelog_claims_nothing_at_start(
    tmp_path: Path,
) -> None:
    """A worker starts with two stores on disk: the one whose position is beyond its changelog's end (another log's
    cache) is not claimed, the other is; so the leader leaves the first partition with its sticky owner."""
    ahead, behind = TP, TopicPartition(INPUT, 1)
    reader = FakeReader(ends={_changelog(0): FAR + 1, _changelog(1): 600})
    async with _started_over(tmp_path, {ahead: 5 * FAR, behind: 500}, reader) as standbys:
        claim = standbys.claim()
        assert claim.positions == {behind: 500}
        owner = Claim(SUB, {ahead: FAR}, active=frozenset({ahead}))
        plans = plan([ahead], {"restarted": _wire(claim), "owner": owner}, replicas=1)
        assert plans["owner"].active == [ahead]


async def test_a_store_on_disk_past_its_changelogs_stable_end_but_inside_its_log_is_claimed_at_start(
    tmp_path: Path,
) -> None:
    """A worker starts with a store on disk at its changelog's last stable offset, its last commit's markers not yet
    written: the log end covers it, so the store is claimed (as a standby's round keeps it), not taken for another
    log's cache; one beyond the log end is still not claimed."""
    inside, beyond = TP, TopicPartition(INPUT, 1)
    reader = FakeReader(
        ends={_changelog(0): 600, _changelog(1): 700}, log_ends={_changelog(0): 602, _changelog(1): 700}
    )
    async with _started_over(tmp_path, {inside: 600, beyond: 700}, reader) as standbys:
        assert standbys.claim().positions == {inside: 600}


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


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The monotonic time of the standby modules, set by the test (``clock[0]``)."""
    now = [90.0]
    fake = SimpleNamespace(monotonic=lambda: now[0])
    monkeypatch.setattr(standbys_module, "time", fake)
    monkeypatch.setattr(standby_module, "time", fake)
    return now


def _behind(replicas: StandbyReplicas, tp: TopicPartition, *, position: int, end: int | None) -> Standby:
    """A standby of ``tp`` (not running) whose last round left it at ``position`` of ``end`` (None: no round yet)."""
    made = Standby(
        tp,
        changelog=TopicPartition(TOPICS.changelog, tp.partition),
        identity=replicas.identity(tp),
        path=_path_of(replicas, tp),
        bucket_ms=directory.topology_bucket_ms(TOPOLOGY),
        restorer=replicas.context.require_restorer(),
    )
    made.position, made.end = position, end
    return made


def _path_of(replicas: StandbyReplicas, tp: TopicPartition) -> Path:
    settings = replicas.settings
    return directory.store_path(settings.state_dir, replicas.context.topology, settings.group, tp)


async def test_a_standby_not_yet_checked_claims_what_its_store_was_known_to_hold(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store closed at 500 becomes a standby again: until a round checks it, the worker claims the 500 it knew."""
    replicas = _replicas(harness)
    _store_at(replicas, TP, 500)
    replicas.remember(TP, 500)
    never = asyncio.Event()

    async def catch_up(_store: PartitionStore, _changelog: TopicPartition, **_kwargs: Any) -> tuple[int, int]:
        await never.wait()
        return 0, 0

    monkeypatch.setattr(replicas.context.require_restorer(), "catch_up", catch_up)
    replicas.assignor.standbys = frozenset({TP})
    await replicas.assigned(set())
    try:
        await _until(lambda: replicas.held[TP].store is not None, "the standby never opened its store")
        assert replicas.held[TP].stored is None
        assert replicas.claim().positions[TP] == 500
    finally:
        await replicas.close()


async def test_a_store_wiped_since_it_was_known_never_claims_what_it_held_once_a_new_one_lies_there(
    harness: Harness,
) -> None:
    """A store known at 500 is wiped (closed at -1); a new store of the partition is then opened there and closed
    before its position was known: the worker claims nothing of it, never the 500 the wiped store held."""
    replicas = _replicas(harness)
    path = _store_at(replicas, TP, 500)
    replicas.remember(TP, 500)
    PartitionStore.wipe(path)
    replicas.remember(TP, -1)
    PartitionStore.open(
        path,
        bucket_ms=directory.topology_bucket_ms(replicas.context.topology),
        identity=replicas.identity(TP),
    ).close()
    replicas.remember(TP, None)
    assert TP not in replicas.claim().positions


async def test_a_standby_is_started_on_its_partitions_changelog_with_the_workers_opener_and_metric(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Partition 1's standby opens its store through the worker's opener (identity, bucket width, to follow), replays
    changelog partition 1, and counts what it replays in the worker's metric."""
    replicas = _replicas(harness)
    tp = TopicPartition(INPUT, 1)
    opened: list[dict[str, Any]] = []

    def opener(path: Path, **kwargs: Any) -> PartitionStore:
        opened.append(kwargs)
        return PartitionStore.open(path, **kwargs)

    replicas.context = replace(replicas.context, open_store=opener)
    rounds: list[TopicPartition] = []

    async def catch_up(store: PartitionStore, changelog: TopicPartition, **_kwargs: Any) -> tuple[int, int]:
        rounds.append(changelog)
        if store.changelog_offset < 1:
            store.write_raw([(b"k", b"v", 2 * store.bucket_ms)], changelog_offset=1, stream_time=1)
            return 2, 2
        return 0, 2

    monkeypatch.setattr(replicas.context.require_restorer(), "catch_up", catch_up)
    replicas.assignor.standbys = frozenset({tp})
    await replicas.assigned(set())
    try:
        await _until(lambda: len(rounds) >= 2, "the standby never replayed")
        bucket_ms = directory.topology_bucket_ms(TOPOLOGY)
        assert opened == [{"bucket_ms": bucket_ms, "identity": replicas.identity(tp), "follow": True}]
        assert set(rounds) == {TopicPartition(TOPICS.changelog, 1)}
        assert harness.metrics.registry.get_sample_value("pipeline_standby_records_total") == 2
    finally:
        await replicas.close()


async def test_each_standby_is_described_by_name_with_its_lag_now(
    harness: Harness, clock: list[float]
) -> None:
    """``describe`` names each standby ``<topic>-<partition>`` and gives its lag as of now."""
    replicas = _replicas(harness)
    replicas.held[TP] = _behind(replicas, TP, position=4, end=10)
    clock[0] = 100.0
    assert replicas.describe() == {
        f"{INPUT}-0": {
            "state": "opening",
            "replaying": False,
            "position": 4,
            "lag_records": 5,
            "lag_seconds": 10.0,
            "replayed": 0,
        }
    }


async def test_the_standby_gauges_are_set_at_most_every_second_and_removed_with_their_standby(
    harness: Harness, clock: list[float]
) -> None:
    """Each standby's lag in records (once a round has run) and seconds; observed again within a second, nothing
    changes; a second later, a standby no longer held has its gauges removed, even one that never had a lag in records."""
    replicas = _replicas(harness)
    one = TopicPartition(INPUT, 1)
    replicas.held[TP] = _behind(replicas, TP, position=4, end=10)
    replicas.held[one] = _behind(replicas, one, position=-1, end=None)
    registry = harness.metrics.registry

    def gauges() -> dict[str, float | None]:
        return {
            f"{name} {p}": registry.get_sample_value(
                f"pipeline_standby_lag_{name}", {"topic": INPUT, "partition": p}
            )
            for name in ("records", "seconds")
            for p in ("0", "1")
        } | {"partitions": registry.get_sample_value("pipeline_standby_partitions")}

    clock[0] = 100.0
    replicas.observe()
    first = {"records 0": 5.0, "records 1": None, "seconds 0": 10.0, "seconds 1": 10.0, "partitions": 2.0}
    assert gauges() == first
    del replicas.held[one]
    clock[0] = 100.5
    replicas.observe()
    assert gauges() == first
    clock[0] = 101.0
    replicas.observe()
    assert gauges() == {
        "records 0": 5.0,
        "records 1": None,
        "seconds 0": 11.0,
        "seconds 1": None,
        "partitions": 1.0,
    }
    del replicas.held[TP]
    clock[0] = 102.0
    replicas.observe()
    assert gauges() == {
        "records 0": None,
        "records 1": None,
        "seconds 0": None,
        "seconds 1": None,
        "partitions": 0.0,
    }
