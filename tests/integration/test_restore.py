"""Restoring a store from its changelog on the real broker: contents, read_committed, resuming."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from prometheus_client import CollectorRegistry, Gauge

from pipeline.errors import StoreUnusableError
from pipeline.kafka.changelog import ChangelogReader
from pipeline.state import replay as replay_module
from pipeline.state.decision import Entry
from pipeline.state.restore import RestoreBudget, Restorer
from pipeline.state.store import PartitionStore, bucket_width
from pipeline.state.store_meta import StoreIdentity

pytestmark = pytest.mark.broker

HOUR = 3_600_000
BUCKET_MS = bucket_width(7 * 24 * HOUR)
BASE = int(time.time() * 1000) - 24 * HOUR  # entries a day old: alive, so expire() keeps them
TopicFactory = Callable[..., Awaitable[str]]


async def restore(
    store: PartitionStore,
    changelog: TopicPartition,
    *,
    bootstrap: str,
    fetch_bytes: int = 32 * 1024 * 1024,
    remaining: Any = None,
) -> int:
    """One active restore through a restore service of its own (a real reader), stopped after it."""
    reader = ChangelogReader(bootstrap, fetch_bytes=max(fetch_bytes // 2, 1))
    restorer = Restorer(lambda: reader, RestoreBudget(2 * fetch_bytes), fetch_bytes=fetch_bytes)
    try:
        return await restorer.restore(store, changelog, remaining=remaining)
    finally:
        await restorer.close()


def _entry(i: int, duplicates: int = 0) -> Entry:
    first = BASE + i * 60_000
    return Entry(
        first_seen=first,
        expires_at=first + 7 * 24 * HOUR,
        partition=1,
        offset=i,
        duplicates=duplicates,
        last_seen=first,
        command=f"cmd-{i}",
        topic="webhooks.events",
        body_hash=f"{i:016x}",
    )


async def _produce(
    bootstrap: str,
    topic: str,
    transactions: Sequence[Sequence[tuple[bytes, bytes | None]]],
    *,
    abort: frozenset[int] = frozenset(),
) -> None:
    """Each inner list is one transaction on partition 1; those numbered in ``abort`` are aborted."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=f"restore-test-{uuid.uuid4().hex[:8]}"
    )
    await producer.start()
    try:
        for number, records in enumerate(transactions):
            await producer.begin_transaction()
            for key, value in records:
                await producer.send(topic, value, key=key, partition=1, timestamp_ms=_timestamp(value))
            if number in abort:
                await producer.abort_transaction()
            else:
                await producer.commit_transaction()
    finally:
        await producer.stop()


def _timestamp(value: bytes | None) -> int:
    return Entry.decode(value).first_seen if value is not None else BASE


def _open(path: Path, topic: str) -> PartitionStore:
    return PartitionStore.open(
        path, bucket_ms=BUCKET_MS, identity=StoreIdentity("test", "group", "input", 1, topic)
    )


async def test_restore_replays_committed_entries_only(
    bootstrap: str, make_topic: TopicFactory, tmp_path: Path
) -> None:
    """The restored store holds each key's newest committed entry; aborted records and tombstones are not applied."""
    topic = await make_topic("changelog", partitions=2)
    first = [(f"k{i}".encode(), _entry(i).encode()) for i in range(30)]
    updates = [(b"k3", _entry(3, duplicates=2).encode()), (b"tomb", None)]
    aborted = [(b"k4", _entry(4, duplicates=9).encode()), (b"ghost", _entry(99).encode())]
    await _produce(bootstrap, topic, [first, aborted, updates], abort=frozenset({1}))
    store = _open(tmp_path / "p1", topic)
    registry = CollectorRegistry()
    gauge = Gauge("left", "records left", ["partition"], registry=registry).labels(partition="1")
    gauge.set(123)
    try:
        applied = await restore(store, TopicPartition(topic, 1), bootstrap=bootstrap, remaining=gauge)
        expected = {key: Entry.decode(value) for key, value in first}
        expected[b"k3"] = _entry(3, duplicates=2)
        found = store.get_many([*expected, b"ghost", b"tomb"])
        assert found == expected
        assert applied == len(first) + len(updates)
        assert registry.get_sample_value("left", {"partition": "1"}) == 0
        assert store.stream_time == _entry(29).first_seen
        assert await restore(store, TopicPartition(topic, 1), bootstrap=bootstrap) == 0  # nothing new
    finally:
        store.close()


async def test_an_interrupted_restore_resumes_where_it_stopped(
    bootstrap: str, make_topic: TopicFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each written batch carries its offset: after a failure mid-restore, a second restore replays only the rest."""
    topic = await make_topic("changelog", partitions=2)
    transactions = [
        [(f"k{i}-{j}".encode(), _entry(i * 10 + j).encode()) for j in range(5)] for i in range(20)
    ]
    await _produce(bootstrap, topic, transactions)
    monkeypatch.setattr(replay_module, "WRITE_RECORDS", 10)
    path = tmp_path / "p1"
    store = _open(path, topic)
    real_write = PartitionStore.write_raw
    calls = 0

    def failing_write(self: PartitionStore, *args: Any, **kwargs: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 4:
            raise StoreUnusableError("disk full (simulated)")
        real_write(self, *args, **kwargs)

    monkeypatch.setattr(PartitionStore, "write_raw", failing_write)
    with pytest.raises(StoreUnusableError):
        await restore(store, TopicPartition(topic, 1), bootstrap=bootstrap)
    reached = store.changelog_offset
    store.close()
    assert reached >= 0  # three batches made it to disk
    monkeypatch.setattr(PartitionStore, "write_raw", real_write)
    store = _open(path, topic)
    try:
        assert store.changelog_offset == reached
        applied = await restore(store, TopicPartition(topic, 1), bootstrap=bootstrap)
        assert 0 < applied < 100
        every = {key: Entry.decode(value) for records in transactions for key, value in records}
        assert store.get_many(list(every)) == every
    finally:
        store.close()


async def test_restores_of_several_partitions_run_concurrently(
    bootstrap: str, make_topic: TopicFactory, tmp_path: Path
) -> None:
    """The worker gathers one restore per partition; each store gets its own partition's entries."""
    topic = await make_topic("changelog", partitions=3)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for partition in range(3):
            for i in range(50):
                entry = _entry(i)
                await producer.send(
                    topic,
                    entry.encode(),
                    key=f"p{partition}-{i}".encode(),
                    partition=partition,
                    timestamp_ms=entry.first_seen,
                )
        await producer.flush()
    finally:
        await producer.stop()
    stores = [_open(tmp_path / f"p{p}", topic) for p in range(3)]
    try:
        counts = await asyncio.gather(
            *(restore(store, TopicPartition(topic, p), bootstrap=bootstrap) for p, store in enumerate(stores))
        )
        assert counts == [50, 50, 50]
        for p, store in enumerate(stores):
            assert len(store.get_many([f"p{p}-{i}".encode() for i in range(50)])) == 50
            assert store.get_many([f"p{(p + 1) % 3}-0".encode()]) == {}
    finally:
        for store in stores:
            store.close()


async def test_the_next_fetch_is_on_its_way_while_one_is_written(
    bootstrap: str, make_topic: TopicFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restore sends its next fetch before it writes the records of the last one, and still applies every record once."""
    topic = await make_topic("changelog", partitions=2)
    transactions = [
        [(f"k{i}-{j}".encode(), _entry((i * 100 + j) % 1000).encode()) for j in range(100)] for i in range(20)
    ]
    await _produce(bootstrap, topic, transactions)
    in_flight = 0
    overlapped = writes = 0
    real_fetch = ChangelogReader.fetch
    real_write = PartitionStore.write_raw

    async def fetch(self: ChangelogReader, *args: Any) -> Any:
        nonlocal in_flight
        in_flight += 1
        try:
            return await real_fetch(self, *args)
        finally:
            in_flight -= 1

    def write_raw(self: PartitionStore, *args: Any, **kwargs: Any) -> None:
        nonlocal overlapped, writes
        writes += 1
        overlapped += in_flight > 0
        real_write(self, *args, **kwargs)

    monkeypatch.setattr(ChangelogReader, "fetch", fetch)
    monkeypatch.setattr(PartitionStore, "write_raw", write_raw)
    store = _open(tmp_path / "p1", topic)
    try:
        applied = await restore(store, TopicPartition(topic, 1), bootstrap=bootstrap, fetch_bytes=64 * 1024)
        assert applied == 2000
        assert writes > 3
        assert overlapped >= writes - 1  # all but the last fetch had a successor in flight
        every = {key: Entry.decode(value) for records in transactions for key, value in records}
        assert store.get_many(list(every)) == every
    finally:
        store.close()
