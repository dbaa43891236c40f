"""A standby replica on the real broker: it follows its changelog read_committed, and a stale or foreign store never
fools it, nor the group's leader."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition

from pipeline.kafka.changelog import ChangelogReader
from pipeline.state import directory
from pipeline.state.decision import Entry
from pipeline.state.restore import RestoreBudget, Restorer
from pipeline.state.store import Change, PartitionStore, bucket_width
from pipeline.state.store_meta import StoreIdentity
from pipeline.worker.assignment import Claim, plan
from pipeline.worker.assignor import decode_claim, encode_claim
from pipeline.worker.lifecycle import StandbyState
from pipeline.worker.standby import Standby
from pipeline.worker.standbys import StandbyReplicas
from tests.unit.worker.fakes import TOPICS, Harness

pytestmark = pytest.mark.broker

HOUR = 3_600_000
BUCKET_MS = bucket_width(7 * 24 * HOUR)
BASE = int(time.time() * 1000) - 24 * HOUR
TopicFactory = Callable[..., Awaitable[str]]


def _entry(i: int) -> Entry:
    first = BASE + i * 1000
    return Entry(first, first + 7 * 24 * HOUR, 0, i, 0, first, f"cmd-{i}", "events", None, 0)


async def _produce(bootstrap: str, topic: str, keys: range, *, abort: bool = False) -> None:
    """One transaction of entries for ``keys`` on partition 0 (aborted when ``abort``)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=f"standby-{uuid.uuid4().hex[:8]}"
    )
    await producer.start()
    try:
        await producer.begin_transaction()
        for i in keys:
            entry = _entry(i)
            await producer.send(
                topic, entry.encode(), key=f"k{i}".encode(), partition=0, timestamp_ms=entry.first_seen
            )
        if abort:
            await producer.abort_transaction()
        else:
            await producer.commit_transaction()
    finally:
        await producer.stop()


class Reader:
    """The worker's restore service, over one real changelog reader (``reader.stop()`` stops it)."""

    def __init__(self, bootstrap: str) -> None:
        self.reader = ChangelogReader(bootstrap, fetch_bytes=1024 * 1024)
        self.restorer = Restorer(
            lambda: self.reader, RestoreBudget(64 * 1024 * 1024), fetch_bytes=1024 * 1024
        )


def _state(standby: Standby) -> StandbyState:
    """The standby's state as it is now (read through a call, so that a check after an await is not narrowed)."""
    return standby.state


async def _level(standby: Standby, end: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while standby.end != end or standby.lag_records != 0:
        assert time.monotonic() < deadline, f"standby at {standby.position}, end {standby.end}"
        await asyncio.sleep(0.05)


def _standby(path: Path, topic: str, reader: Reader, identity: StoreIdentity) -> Standby:
    return Standby(
        TopicPartition("raw", 0),
        changelog=TopicPartition(topic, 0),
        identity=identity,
        path=path,
        bucket_ms=BUCKET_MS,
        restorer=reader.restorer,
    )


async def test_a_standby_follows_committed_changelog_records_as_they_come(
    bootstrap: str, make_topic: TopicFactory, tmp_path: Path
) -> None:
    """Committed entries reach the standby's store, aborted ones never do; it keeps up as more come, then closes with its position."""
    topic = await make_topic("changelog")
    identity = StoreIdentity("app", "group", "raw", 0, topic)
    await _produce(bootstrap, topic, range(50))
    await _produce(bootstrap, topic, range(50, 60), abort=True)
    reader = Reader(bootstrap)
    standby = _standby(tmp_path / "s", topic, reader, identity)
    standby.start()
    try:
        await _level(standby, 62)  # 50 records, a commit marker, 10 aborted, an abort marker
        assert standby.state is StandbyState.FOLLOWING
        await _produce(bootstrap, topic, range(60, 80))
        await _level(standby, 83)
        assert standby.lag_seconds(time.monotonic()) == 0.0
        position = await standby.close()
        assert position == 82
        assert _state(standby) is StandbyState.CLOSED
        served = directory.open_store(tmp_path / "s", bucket_ms=BUCKET_MS, identity=identity)
        try:
            keys = [f"k{i}".encode() for i in range(80)]
            found = served.get_many(keys)
            assert sorted(found) == sorted(k for i, k in enumerate(keys) if not 50 <= i < 60)
            assert served.changelog_offset == 82
        finally:
            served.close()
    finally:
        await standby.close()
        await reader.reader.stop()


async def test_a_standby_on_a_store_of_another_changelog_rebuilds_it(
    bootstrap: str, make_topic: TopicFactory, tmp_path: Path
) -> None:
    """A store left by another cluster under the same names (keys this changelog never had) is wiped and rebuilt."""
    topic = await make_topic("changelog")
    ours = StoreIdentity("app", "group", "raw", 0, topic, "cluster-a", "id-1")
    foreign = PartitionStore.open(
        tmp_path / "s", bucket_ms=BUCKET_MS, identity=ours._replace(cluster="cluster-b")
    )
    foreign.write({b"ghost": Change.of(_entry(7))}, changelog_offset=3, stream_time=BASE)
    foreign.close()
    await _produce(bootstrap, topic, range(5))
    reader = Reader(bootstrap)
    standby = _standby(tmp_path / "s", topic, reader, ours)
    standby.start()
    try:
        await _level(standby, 6)
        await standby.close()
        served = directory.open_store(tmp_path / "s", bucket_ms=BUCKET_MS, identity=ours)
        try:
            assert served.get_many([b"ghost"]) == {}
            assert len(served.get_many([f"k{i}".encode() for i in range(5)])) == 5
        finally:
            served.close()
    finally:
        await standby.close()
        await reader.reader.stop()


async def test_a_standby_ahead_of_its_changelog_is_rebuilt_from_its_start(
    bootstrap: str, make_topic: TopicFactory, tmp_path: Path
) -> None:
    """A store whose position the changelog never reached caches another log: the standby rebuilds it and follows."""
    topic = await make_topic("changelog")
    identity = StoreIdentity("app", "group", "raw", 0, topic)
    ahead = PartitionStore.open(tmp_path / "s", bucket_ms=BUCKET_MS, identity=identity)
    ahead.write({b"ghost": Change.of(_entry(7))}, changelog_offset=900, stream_time=BASE)
    ahead.close()
    await _produce(bootstrap, topic, range(3))
    reader = Reader(bootstrap)
    standby = _standby(tmp_path / "s", topic, reader, identity)
    standby.start()
    try:
        await _level(standby, 4)
        assert standby.position == 3
    finally:
        await standby.close()
        await reader.reader.stop()
    served = directory.open_store(tmp_path / "s", bucket_ms=BUCKET_MS, identity=identity)
    try:
        assert served.get_many([b"ghost"]) == {}
    finally:
        served.close()


async def test_a_standby_never_touches_a_store_that_is_someone_elses(
    bootstrap: str, make_topic: TopicFactory, tmp_path: Path
) -> None:
    """A store of another partition in this place: the standby gives up on it and leaves it as it was."""
    topic = await make_topic("changelog")
    identity = StoreIdentity("app", "group", "raw", 0, topic)
    theirs = identity._replace(partition=5)
    store = PartitionStore.open(tmp_path / "s", bucket_ms=BUCKET_MS, identity=theirs)
    store.write({b"theirs": Change.of(_entry(1))}, changelog_offset=2, stream_time=BASE)
    store.close()
    reader = Reader(bootstrap)
    standby = _standby(tmp_path / "s", topic, reader, identity)
    standby.start()
    try:
        deadline = time.monotonic() + 10
        while standby.state is not StandbyState.CLOSED:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
    finally:
        await standby.close()
        await reader.reader.stop()
    kept = PartitionStore.open(tmp_path / "s", bucket_ms=BUCKET_MS, identity=theirs)
    try:
        assert set(kept.get_many([b"theirs"])) == {b"theirs"}
    finally:
        kept.close()


async def test_a_wiped_standby_never_takes_the_partition_from_a_current_copy(
    bootstrap: str, make_topic: TopicFactory, tmp_path: Path
) -> None:
    """A worker starts with a store at offset 30,000 of a changelog that ends at 51 (another log's cache): it claims
    nothing of it; its standby wipes and rebuilds it, then claims what it replayed. At every step the leader leaves
    the partition with the member whose copy is current."""
    topic = await make_topic("changelog")
    await _produce(bootstrap, topic, range(50))  # 50 records and a commit marker: the end is 51
    tp = TopicPartition(TOPICS.input, 0)
    harness = Harness(tmp_path, {"bootstrap": bootstrap, "standby_replicas": 1})
    reader = Reader(bootstrap)
    context = replace(harness.context, restorer=reader.restorer)
    replicas = StandbyReplicas(context, {tp.topic: topic}, dict)
    settings = replicas.settings
    path = directory.store_path(settings.state_dir, replicas.context.topology, settings.group, tp)
    ahead = PartitionStore.open(
        path,
        bucket_ms=directory.topology_bucket_ms(replicas.context.topology),
        identity=replicas.identity(tp),
    )
    ahead.write({b"ghost": Change.of(_entry(7))}, changelog_offset=30_000, stream_time=BASE)
    ahead.close()
    current = Claim(frozenset({tp.topic}), {tp: 50}, active=frozenset({tp}))

    def owner() -> str:
        claim = decode_claim([tp.topic], encode_claim(replicas.claim()))
        [name] = [
            n for n, p in plan([tp], {"wiped": claim, "current": current}, replicas=1).items() if p.active
        ]
        return name

    await replicas.scan()  # the changelog's end, read from the broker
    assert tp not in replicas.claim().positions
    assert owner() == "current"
    replicas.assignor.standbys = frozenset({tp})
    await replicas.assigned(set())
    try:
        standby = replicas.held[tp]
        await _level(standby, 51)
        assert replicas.claim().positions[tp] == 50  # the rebuilt store, replayed to the end
        assert owner() == "current"  # as current, and the sticky owner
    finally:
        await replicas.close()
        await reader.restorer.close()
    assert replicas.claim().positions[tp] == 50  # closed, still on disk
