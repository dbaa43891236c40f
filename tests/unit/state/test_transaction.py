"""The commit order of the worker's transaction: records into aiokafka's batches, the offsets, the commit,
then each partition's store."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import CorruptRecordException, InvalidTxnState, KafkaTimeoutError, ProducerFenced
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.record.memory_records import MemoryRecords

from pipeline.errors import IllegalTransitionError, ProducerFencedError, RecordTooLargeError, StoreError
from pipeline.kafka.requests import GroupMetadata
from pipeline.kafka.transactional import TransactionalProducer
from pipeline.state.decision import Entry
from pipeline.state.partition_transaction import PartitionTransaction
from pipeline.state.store import PartitionStore
from pipeline.state.transaction import (
    TXN_TRANSITIONS,
    CommitUncertainError,
    PartCommitted,
    Transaction,
    TransactionFailedError,
    TxnState,
)

HOUR = 3_600_000
CHANGELOG = TopicPartition("changelog", 0)


class _Sent:
    def __init__(self, offset: int) -> None:
        self.offset = offset


class StandInProducer:
    """aiokafka's real batch builder; transaction calls that record what happened (no broker)."""

    def __init__(
        self,
        store: PartitionStore,
        *,
        fail_commit: bool = False,
        errors: Mapping[str, BaseException] | None = None,
        hold_sends: bool = False,
    ) -> None:
        self.store = store
        self.fail_commit = fail_commit
        self.hold_sends = hold_sends  # each send's future left unanswered, in ``held``, for the test
        self.held: list[asyncio.Future[Any]] = []
        self.errors = dict(errors or {})  # call ("send", "offsets", "commit", "abort") -> the error it raises
        # (a send's future fails with it)
        self.calls: list[str] = []
        self.sent: list[tuple[str, int, int]] = []  # topic, partition, records
        self.store_had_key_at_commit: bool | None = None
        self.sizes: list[int] = []  # of every batch sent, in bytes
        self.records: dict[str, list[tuple[bytes | None, int, list[Any]]]] = {}  # key, timestamp, headers
        self.values: dict[str, list[bytes | None]] = {}

    def create_batch(self) -> BatchBuilder:
        return BatchBuilder(1024 * 1024, 0, is_transactional=True, key_serializer=None, value_serializer=None)

    async def begin_transaction(self) -> None:
        self.calls.append("begin")

    async def send_batch(self, batch: BatchBuilder, topic: str, *, partition: int) -> asyncio.Future[Any]:
        batch.close()
        built = bytes(batch._builder.build())  # the encoding a real send does: fails on a bad record
        self.sizes.append(len(built))
        for r in MemoryRecords(built).next_batch() or []:
            self.records.setdefault(topic, []).append((r.key, r.timestamp, list(r.headers)))
            self.values.setdefault(topic, []).append(r.value)
        self.sent.append((topic, partition, batch.record_count()))
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.hold_sends:
            self.held.append(future)
        elif "send" in self.errors:
            future.set_exception(self.errors["send"])
        else:
            future.set_result(_Sent(100))
        return future

    async def send_offsets_to_transaction(self, offsets: dict[TopicPartition, int], group: str) -> None:
        self.calls.append(f"offsets {group} {' '.join(str(offset) for offset in offsets.values())}")
        if "offsets" in self.errors:
            raise self.errors["offsets"]

    async def commit_transaction(self) -> None:
        self.store_had_key_at_commit = bool(self.store.get_many([b"k"]))
        self.calls.append("commit")
        if self.fail_commit:
            raise KafkaTimeoutError
        if "commit" in self.errors:
            raise self.errors["commit"]

    async def abort_transaction(self) -> None:
        self.calls.append("abort")
        if "abort" in self.errors:
            raise self.errors["abort"]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[PartitionStore]:
    opened = PartitionStore.open(tmp_path / "p0", bucket_ms=HOUR)
    yield opened
    opened.close()


async def _offsets(producer: Any, offsets: Mapping[TopicPartition, int], metadata: GroupMetadata) -> None:
    await producer.send_offsets_to_transaction(dict(offsets), metadata.group_id)


def _checkpoint(producer: StandInProducer, store: PartitionStore, **options: Any) -> PartitionTransaction:
    """Partition raw-0's part of a worker transaction over ``producer``."""
    txn = Transaction(
        TransactionalProducer(producer, "worker", send_offsets=_offsets),
        group=lambda: GroupMetadata("g", 1, "m", None),
        **options,
    )
    return PartitionTransaction(tp=TopicPartition("raw", 0), txn=txn, store=store, changelog=CHANGELOG)


def _stage_one(ckpt: PartitionTransaction) -> Entry:
    entry = Entry(first_seen=1, expires_at=HOUR, partition=0, offset=41)
    ckpt.stage(b"k", entry, None)
    ckpt.emit("commands", 2, key=b"k", value=b"{}", timestamp=1, headers=[("h", b"v"), ("empty", None)])
    ckpt.consumed(41)
    return entry


async def test_records_with_and_without_headers_are_sent_in_one_transaction(store: PartitionStore) -> None:
    """Each output record lands in aiokafka's batch for its topic-partition; offsets go into the transaction."""
    producer = StandInProducer(store)
    ckpt = _checkpoint(producer, store)
    await ckpt.begin()
    _stage_one(ckpt)
    committed = await ckpt.txn.commit()
    assert committed.parts == {TopicPartition("raw", 0): PartCommitted(records=1, expired=0)}
    assert sorted(producer.sent) == [("changelog", 0, 1), ("commands", 2, 1)]
    assert producer.calls == ["begin", "offsets g 42", "commit"]


async def test_the_store_is_written_only_after_the_commit(store: PartitionStore) -> None:
    """Staged claims are visible to lookups at once, but reach RocksDB after the commit, with the offset."""
    producer = StandInProducer(store)
    ckpt = _checkpoint(producer, store)
    await ckpt.begin()
    entry = _stage_one(ckpt)
    assert ckpt.lookup([b"k"]) == {b"k": entry}
    await ckpt.txn.commit()
    assert producer.store_had_key_at_commit is False
    assert store.get_many([b"k"]) == {b"k": entry}
    assert store.changelog_offset == 100  # the last changelog record's offset


async def test_a_failed_commit_aborts_and_leaves_the_store_untouched(store: PartitionStore) -> None:
    """A commit error aborts the transaction, forgets the batch (nothing is remembered as seen), and carries and names
    the broker's error."""
    producer = StandInProducer(store, fail_commit=True)
    ckpt = _checkpoint(producer, store)
    await ckpt.begin()
    _stage_one(ckpt)
    with pytest.raises(TransactionFailedError, match=r"transaction aborted: KafkaTimeoutError\(\)") as failed:
        await ckpt.txn.commit()
    assert isinstance(failed.value.__cause__, KafkaTimeoutError)  # the partition reads it to bisect
    assert producer.calls[-1] == "abort"
    assert store.get_many([b"k"]) == {}
    assert ckpt.lookup([b"k"]) == {}
    assert store.changelog_offset == -1


@pytest.mark.parametrize(
    ("errors", "fenced", "failure"),
    [
        # a new producer's InitProducerId completes a begun commit
        ({"commit": ProducerFenced()}, True, "worker: fenced by a newer producer"),
        # the commit had begun
        ({"commit": KafkaTimeoutError(), "abort": InvalidTxnState()}, False, "KafkaTimeoutError"),
        ({"commit": KafkaTimeoutError(), "abort": ProducerFenced()}, True, "KafkaTimeoutError"),
    ],
    ids=["fenced-at-commit", "abort-refused", "fenced-at-abort"],
)
async def test_a_commit_sent_and_not_answered_leaves_its_outcome_unknown(
    store: PartitionStore, errors: dict[str, BaseException], *, fenced: bool, failure: str
) -> None:
    """EndTxn sent, then a fence or an abort the broker refuses: the transaction may have committed, so
    CommitUncertainError (never "aborted, redo") naming the failure of the commit, the store untouched, every
    part reset."""
    producer = StandInProducer(store, errors=errors)
    ckpt = _checkpoint(producer, store)
    await ckpt.begin()
    _stage_one(ckpt)
    with pytest.raises(
        CommitUncertainError, match=f"the commit was sent and may have taken: {failure}"
    ) as failed:
        await ckpt.txn.commit()
    assert failed.value.fenced is fenced
    assert "commit" in producer.calls
    assert store.get_many([b"k"]) == {}
    assert not ckpt.txn.open


async def test_a_fence_before_the_commit_is_sent_is_a_fence_not_an_unknown_outcome(
    store: PartitionStore,
) -> None:
    """Fenced as the offsets are sent: EndTxn never went, nothing can have committed; ProducerFencedError."""
    producer = StandInProducer(store, errors={"offsets": ProducerFenced()})
    ckpt = _checkpoint(producer, store)
    await ckpt.begin()
    _stage_one(ckpt)
    with pytest.raises(ProducerFencedError):
        await ckpt.txn.commit()
    assert "commit" not in producer.calls


async def test_staging_a_key_emits_its_changelog_record(store: PartitionStore) -> None:
    """The transaction is the only writer of state: staging a key appends its changelog record itself."""
    producer = StandInProducer(store)
    ckpt = _checkpoint(producer, store)
    await ckpt.begin()
    ckpt.stage(b"k", Entry(first_seen=1, expires_at=HOUR, partition=0, offset=41), None)
    ckpt.consumed(41)
    await ckpt.txn.commit()
    assert producer.sent == [("changelog", 0, 1)]


async def test_a_record_larger_than_its_topic_takes_is_refused_before_it_is_appended(
    store: PartitionStore,
) -> None:
    """emit() checks the topic's limit first: nothing is appended, and the caller sends something smaller."""
    producer = StandInProducer(store)
    ckpt = _checkpoint(
        producer,
        store,
        limits={"commands": 4096},
    )
    await ckpt.begin()
    assert ckpt.fits("commands", b"k", b"x" * 100)
    with pytest.raises(RecordTooLargeError):
        ckpt.emit("commands", 0, key=b"k", value=b"x" * 5000, timestamp=1)
    ckpt.consumed(1)
    await ckpt.txn.commit()
    assert producer.sent == []


async def test_a_store_error_after_the_kafka_commit_ends_the_transaction_and_is_returned(
    store: PartitionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kafka committed but RocksDB refused: the part's StoreError comes back in the result with its record count
    and no key expired (its task reopens; the others' stores are written), no open transaction left."""
    producer = StandInProducer(store)
    ckpt = _checkpoint(producer, store)
    await ckpt.begin()
    _stage_one(ckpt)
    refusal = StoreError("disk full")

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise refusal

    monkeypatch.setattr(store, "write", refuse)
    committed = await ckpt.txn.commit()
    assert committed.parts[TopicPartition("raw", 0)] == PartCommitted(
        records=1, expired=0, store_error=refusal
    )
    assert producer.calls[-1] == "commit"
    assert not ckpt.in_transaction
    assert not ckpt.txn.open
    assert store.changelog_offset == -1


async def test_a_batch_is_never_larger_than_its_topic_takes(store: PartitionStore) -> None:
    """Records that each fit a small topic are sent in batches that fit it too (the broker refuses a larger
    batch whole, whatever its records): a 4 KiB topic gets several batches, none over 4 KiB."""
    producer = StandInProducer(store)
    ckpt = _checkpoint(
        producer,
        store,
        limits={"commands": 4096},
    )
    await ckpt.begin()
    for i in range(40):
        ckpt.emit("commands", 0, key=b"k%d" % i, value=b"x" * 500, timestamp=1)
    ckpt.consumed(1)
    await ckpt.txn.commit()
    batches = [count for topic, _, count in producer.sent if topic == "commands"]
    assert sum(batches) == 40
    assert len(batches) >= 5
    assert all(size <= 4096 for size in producer.sizes)


async def test_a_record_that_overflows_its_batch_starts_the_next_whole(store: PartitionStore) -> None:
    """Three records of 3,000 bytes for a 4 KiB topic: each after the first does not fit the batch before it and
    starts a new one, with its own key, value, timestamp and headers, in order."""
    producer = StandInProducer(store)
    ckpt = _checkpoint(producer, store, limits={"commands": 4096})
    await ckpt.begin()
    for i in range(3):
        ckpt.emit(
            "commands",
            0,
            key=b"k%d" % i,
            value=b"%d" % i * 3000,
            timestamp=1000 + i,
            headers=[("n", b"%d" % i)],
        )
    ckpt.consumed(1)
    await ckpt.txn.commit()
    assert [count for topic, _, count in producer.sent if topic == "commands"] == [1, 1, 1]
    assert producer.records["commands"] == [(b"k%d" % i, 1000 + i, [("n", b"%d" % i)]) for i in range(3)]
    assert producer.values["commands"] == [b"%d" % i * 3000 for i in range(3)]


async def test_an_output_its_topic_would_refuse_for_its_timestamp_is_stamped_now(
    store: PartitionStore,
) -> None:
    """A topic taking records at most an hour ahead: a record dated a day ahead is stamped now, the original kept."""
    producer = StandInProducer(store)
    now = 1_800_000_000_000
    ckpt = _checkpoint(
        producer,
        store,
        timestamps={"commands": (2**63 - 1, HOUR)},
        wall=lambda: now / 1000,
    )
    await ckpt.begin()
    ckpt.emit("commands", 0, key=b"a", value=b"{}", timestamp=now + 24 * HOUR)
    ckpt.emit("commands", 0, key=b"b", value=b"{}", timestamp=now + HOUR // 2)
    ckpt.consumed(1)
    await ckpt.txn.commit()
    stamped = producer.records["commands"]
    assert [(key, ts) for key, ts, _ in stamped] == [(b"a", now), (b"b", now + HOUR // 2)]
    assert stamped[0][2] == [("original-timestamp", str(now + 24 * HOUR).encode())]
    assert stamped[1][2] == []


@pytest.mark.parametrize(
    ("offset", "kept"),
    [
        (
            -24 * HOUR + 300_000,
            True,
        ),  # the oldest the topic takes, less the margin for the trip to the broker
        (-24 * HOUR + 299_999, False),  # inside that margin: the broker could refuse it on arrival
        (-24 * HOUR - 299_999, False),
        (HOUR, True),  # the newest the topic takes
        (HOUR + 1, False),
    ],
    ids=["oldest-kept", "inside-the-margin", "past-before-max", "newest-kept", "past-after-max"],
)
async def test_an_outputs_timestamp_is_kept_exactly_within_its_topics_bounds(
    store: PartitionStore, offset: int, kept: bool
) -> None:
    """A topic taking records a day old to an hour ahead: a timestamp is kept up to each bound (the old one
    less five minutes), and stamped now past it."""
    producer = StandInProducer(store)
    now = 1_800_000_000_000
    ckpt = _checkpoint(producer, store, timestamps={"commands": (24 * HOUR, HOUR)}, wall=lambda: now / 1000)
    await ckpt.begin()
    ckpt.emit("commands", 0, key=b"a", value=b"{}", timestamp=now + offset)
    ckpt.consumed(1)
    await ckpt.txn.commit()
    [(_, timestamp, _)] = producer.records["commands"]
    assert timestamp == (now + offset if kept else now)


async def test_a_record_redone_to_be_restamped_is_stamped_now_even_within_its_topics_bounds(
    store: PartitionStore,
) -> None:
    """The broker refused the record's outputs for their timestamp once: redone, every output is stamped now. A part
    left restamping as its transaction ends restamps nothing in the next one."""
    producer = StandInProducer(store)
    now = 1_800_000_000_000
    ckpt = _checkpoint(producer, store, timestamps={"commands": (24 * HOUR, HOUR)}, wall=lambda: now / 1000)
    await ckpt.begin()
    ckpt.restamp = True
    ckpt.emit("commands", 0, key=b"a", value=b"{}", timestamp=now - HOUR)
    ckpt.consumed(1)
    await ckpt.txn.commit()
    assert producer.records["commands"] == [(b"a", now, [("original-timestamp", str(now - HOUR).encode())])]
    await ckpt.begin()
    ckpt.emit("commands", 0, key=b"b", value=b"{}", timestamp=now - HOUR)
    ckpt.consumed(2)
    await ckpt.txn.commit()
    assert producer.records["commands"][1] == (b"b", now - HOUR, [])


async def test_a_partition_is_in_the_transaction_from_the_first_record_taken_before_any_is_handled(
    store: PartitionStore,
) -> None:
    """Records from offset 7 taken (a chunk that may still fail): the part holds the transaction from 7, which
    an abort rewinds to; handling them keeps that first offset."""
    ckpt = _checkpoint(StandInProducer(store), store)
    await ckpt.begin()
    before = ckpt.in_transaction
    ckpt.taken(7)
    assert (before, ckpt.in_transaction, ckpt.first_offset) == (False, True, 7)
    ckpt.consumed(7)
    ckpt.taken(8)
    ckpt.consumed(8)
    assert (ckpt.first_offset, ckpt.next_offset, ckpt.records) == (7, 9, 2)


async def test_a_transaction_is_due_at_max_records_or_at_its_interval_and_never_when_none_is_open(
    store: PartitionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Due once it holds ``max_records`` input records, or once ``interval`` has passed since it opened, to the
    bound inclusive; no transaction open, nothing is due."""
    clock = [100.0]
    monkeypatch.setattr("pipeline.state.transaction.time.monotonic", lambda: clock[0])
    ckpt = _checkpoint(StandInProducer(store), store)
    assert not ckpt.txn.due(interval=0.0, max_records=0)
    await ckpt.begin()
    ckpt.consumed(1)
    ckpt.consumed(2)
    assert not ckpt.txn.due(interval=1.0, max_records=3)
    assert ckpt.txn.due(interval=1.0, max_records=2)
    clock[0] = 100.5
    assert not ckpt.txn.due(interval=1.0, max_records=3)
    clock[0] = 101.0
    assert ckpt.txn.due(interval=1.0, max_records=3)


async def test_a_transaction_with_no_input_offset_commits_without_sending_offsets(
    store: PartitionStore,
) -> None:
    """Outputs but no input record handled (no part has an offset): no TxnOffsetCommit, only the commit."""
    producer = StandInProducer(store)
    ckpt = _checkpoint(producer, store)
    await ckpt.begin()
    ckpt.emit("commands", 0, key=b"a", value=b"{}", timestamp=1)
    await ckpt.txn.commit()
    assert producer.calls == ["begin", "commit"]
    assert producer.sent == [("commands", 0, 1)]


@pytest.mark.parametrize(("short", "sent"), [(0, True), (1, False)], ids=["at-send-bytes", "a-byte-short"])
async def test_a_batch_that_reached_send_bytes_is_sent_at_the_next_drain(
    store: PartitionStore, short: int, *, sent: bool
) -> None:
    """``send_bytes`` is reached inclusively: a batch of exactly that size is sent at the next drain, before the
    commit; a batch a byte short of it waits."""
    producer = StandInProducer(store)
    ckpt = _checkpoint(producer, store)
    alone = ckpt.txn.producer.batch(4096)  # the same record alone in a batch: the size the drain reads
    alone.append(key=b"a", value=b"x" * 100, timestamp=1, headers=[])
    ckpt.txn.send_bytes = alone.size() + short
    await ckpt.begin()
    ckpt.emit("commands", 0, key=b"a", value=b"x" * 100, timestamp=1)
    await ckpt.drain()
    assert producer.sent == ([("commands", 0, 1)] if sent else [])


async def test_an_abort_waits_for_the_sends_in_flight_before_aborting(store: PartitionStore) -> None:
    """aiokafka refuses to abort with sends in flight: the abort goes only once every send has been answered."""
    producer = StandInProducer(store, hold_sends=True)
    ckpt = _checkpoint(producer, store, send_bytes=0)  # every batch is sent at the next drain
    await ckpt.begin()
    ckpt.emit("commands", 0, key=b"a", value=b"{}", timestamp=1)
    await ckpt.drain()
    aborting = asyncio.create_task(ckpt.txn.abort())
    for _ in range(3):
        await asyncio.sleep(0)
    aborted_while_in_flight = "abort" in producer.calls
    for future in producer.held:
        future.set_result(_Sent(100))
    await aborting
    assert (len(producer.held), aborted_while_in_flight, producer.calls[-1]) == (1, False, "abort")
    assert not ckpt.txn.open


async def test_a_batch_the_broker_refuses_aborts_the_transaction_and_asks_for_a_new_producer(
    store: PartitionStore,
) -> None:
    """A send's future fails with a refusal: the commit is never sent, the transaction is aborted on the broker
    (its sends all answered), TransactionFailedError carries the refusal, and the producer needs replacing (its
    sequence numbers no longer match the broker's)."""
    refusal = CorruptRecordException()
    producer = StandInProducer(store, errors={"send": refusal})
    ckpt = _checkpoint(producer, store)
    await ckpt.begin()
    _stage_one(ckpt)
    with pytest.raises(TransactionFailedError) as failed:
        await ckpt.txn.commit()
    assert (str(failed.value), failed.value.__cause__) == (f"transaction aborted: {refusal!r}", refusal)
    assert (producer.calls, ckpt.txn.producer.needs_replacing) == (["begin", "abort"], True)
    assert store.get_many([b"k"]) == {}
    assert not ckpt.txn.open


async def test_a_send_fenced_by_a_newer_producer_is_a_fence_without_an_abort(store: PartitionStore) -> None:
    """A send's future fails with ProducerFenced: ProducerFencedError, the producer marked fenced, and neither a
    commit nor an abort sent (only the newer producer can end the transaction)."""
    producer = StandInProducer(store, errors={"send": ProducerFenced()})
    ckpt = _checkpoint(producer, store)
    await ckpt.begin()
    _stage_one(ckpt)
    with pytest.raises(ProducerFencedError, match="worker: fenced by a newer producer"):
        await ckpt.txn.commit()
    assert (producer.calls, ckpt.txn.producer.fenced) == (["begin"], True)
    assert store.get_many([b"k"]) == {}
    assert not ckpt.txn.open


TXN_NON_EDGES = [(a, b) for a, b in itertools.product(TxnState, TxnState) if b not in TXN_TRANSITIONS[a]]


@pytest.mark.parametrize(("source", "target"), TXN_NON_EDGES, ids=[f"{a}->{b}" for a, b in TXN_NON_EDGES])
def test_a_move_the_transactions_table_lacks_raises_naming_both_states(
    store: PartitionStore, source: TxnState, target: TxnState
) -> None:
    """A transition TXN_TRANSITIONS lacks raises IllegalTransitionError naming where the transaction is and where it
    was sent, and leaves the state (no public call reaches one: join and commit check the state first)."""
    txn = _checkpoint(StandInProducer(store), store).txn
    txn.state = source
    with pytest.raises(IllegalTransitionError, match=f"transaction: no transition from {source} to {target}"):
        txn._move(target)
    assert txn.state is source
