"""The commit order of one partition: records into aiokafka's batches, the transaction, then the store."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaTimeoutError
from aiokafka.producer.message_accumulator import BatchBuilder

from pipeline.errors import RecordTooLargeError, StoreError
from pipeline.state.decision import Entry
from pipeline.state.store import PartitionStore
from pipeline.state.transaction import PartitionTransaction, TransactionFailedError

HOUR = 3_600_000
CHANGELOG = TopicPartition("changelog", 0)


class _Sent:
    def __init__(self, offset: int) -> None:
        self.offset = offset


class StandInProducer:
    """aiokafka's real batch builder; transaction calls that record what happened (no broker)."""

    def __init__(self, store: PartitionStore, *, fail_commit: bool = False) -> None:
        self.store = store
        self.fail_commit = fail_commit
        self.calls: list[str] = []
        self.sent: list[tuple[str, int, int]] = []  # topic, partition, records
        self.store_had_key_at_commit: bool | None = None

    def create_batch(self) -> BatchBuilder:
        return BatchBuilder(1024 * 1024, 0, is_transactional=True, key_serializer=None, value_serializer=None)

    async def begin_transaction(self) -> None:
        self.calls.append("begin")

    async def send_batch(self, batch: BatchBuilder, topic: str, *, partition: int) -> asyncio.Future[Any]:
        batch.close()
        batch._builder.build()  # the encoding a real send does: fails on a bad record
        self.sent.append((topic, partition, batch.record_count()))
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.set_result(_Sent(100))
        return future

    async def send_offsets_to_transaction(self, offsets: dict[TopicPartition, int], group: str) -> None:
        self.calls.append(f"offsets {group} {next(iter(offsets.values()))}")

    async def commit_transaction(self) -> None:
        self.store_had_key_at_commit = bool(self.store.get_many([b"k"]))
        self.calls.append("commit")
        if self.fail_commit:
            raise KafkaTimeoutError

    async def abort_transaction(self) -> None:
        self.calls.append("abort")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[PartitionStore]:
    opened = PartitionStore.open(tmp_path / "p0", bucket_ms=HOUR)
    yield opened
    opened.close()


def _checkpoint(producer: StandInProducer, store: PartitionStore) -> PartitionTransaction:
    return PartitionTransaction(
        tp=TopicPartition("raw", 0), group="g", producer=producer, store=store, changelog=CHANGELOG
    )


def _stage_one(ckpt: PartitionTransaction) -> Entry:
    entry = Entry(first_seen=1, expires_at=HOUR, partition=0, offset=41)
    ckpt.stage(b"k", entry, None, timestamp=1)
    ckpt.emit("commands", 2, key=b"k", value=b"{}", timestamp=1, headers=[("h", b"v"), ("empty", None)])
    ckpt.consumed(41, 1)
    return entry


async def test_records_with_and_without_headers_are_sent_in_one_transaction(store: PartitionStore) -> None:
    """Each output record lands in aiokafka's batch for its topic-partition; offsets go into the transaction."""
    producer = StandInProducer(store)
    ckpt = _checkpoint(producer, store)
    await ckpt.begin()
    _stage_one(ckpt)
    assert await ckpt.commit() == (1, 0)
    assert sorted(producer.sent) == [("changelog", 0, 1), ("commands", 2, 1)]
    assert producer.calls == ["begin", "offsets g 42", "commit"]


async def test_the_store_is_written_only_after_the_commit(store: PartitionStore) -> None:
    """Staged claims are visible to lookups at once, but reach RocksDB after the commit, with the offset."""
    producer = StandInProducer(store)
    ckpt = _checkpoint(producer, store)
    await ckpt.begin()
    entry = _stage_one(ckpt)
    assert ckpt.lookup([b"k"]) == {b"k": entry}
    await ckpt.commit()
    assert producer.store_had_key_at_commit is False
    assert store.get_many([b"k"]) == {b"k": entry}
    assert store.changelog_offset == 100  # the last changelog record's offset


async def test_a_failed_commit_aborts_and_leaves_the_store_untouched(store: PartitionStore) -> None:
    """A commit error aborts the transaction, forgets the batch (nothing is remembered as seen), and carries the broker's error."""
    producer = StandInProducer(store, fail_commit=True)
    ckpt = _checkpoint(producer, store)
    await ckpt.begin()
    _stage_one(ckpt)
    with pytest.raises(TransactionFailedError) as failed:
        await ckpt.commit()
    assert isinstance(failed.value.refused, KafkaTimeoutError)  # the partition reads it to bisect
    assert producer.calls[-1] == "abort"
    assert store.get_many([b"k"]) == {}
    assert ckpt.lookup([b"k"]) == {}
    assert store.changelog_offset == -1


async def test_staging_a_key_emits_its_changelog_record(store: PartitionStore) -> None:
    """The transaction is the only writer of state: staging a key appends its changelog record itself."""
    producer = StandInProducer(store)
    ckpt = _checkpoint(producer, store)
    await ckpt.begin()
    ckpt.stage(b"k", Entry(first_seen=1, expires_at=HOUR, partition=0, offset=41), None, timestamp=1)
    ckpt.consumed(41, 1)
    await ckpt.commit()
    assert producer.sent == [("changelog", 0, 1)]


async def test_a_record_larger_than_its_topic_takes_is_refused_before_it_is_appended(
    store: PartitionStore,
) -> None:
    """emit() checks the topic's limit first: nothing is appended, and the caller sends something smaller."""
    producer = StandInProducer(store)
    ckpt = PartitionTransaction(
        tp=TopicPartition("raw", 0),
        group="g",
        producer=producer,
        store=store,
        changelog=CHANGELOG,
        limits={"commands": 4096},
    )
    await ckpt.begin()
    assert ckpt.fits("commands", b"k", b"x" * 100)
    with pytest.raises(RecordTooLargeError):
        ckpt.emit("commands", 0, key=b"k", value=b"x" * 5000, timestamp=1)
    ckpt.consumed(1, 1)
    await ckpt.commit()
    assert producer.sent == []


async def test_a_store_error_after_the_kafka_commit_ends_the_transaction_and_marks_it_broken(
    store: PartitionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kafka committed but RocksDB refused: StoreError, no open transaction left, and the partition must reopen."""
    producer = StandInProducer(store)
    ckpt = _checkpoint(producer, store)
    await ckpt.begin()
    _stage_one(ckpt)

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise StoreError("disk full")

    monkeypatch.setattr(store, "write", refuse)
    with pytest.raises(StoreError):
        await ckpt.commit()
    assert producer.calls[-1] == "commit"
    assert not ckpt.in_transaction
    assert ckpt.broken
    assert store.changelog_offset == -1
