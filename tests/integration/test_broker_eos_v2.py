"""The broker does what one producer per worker (eos-v2, KIP-447) relies on: a transaction's offsets fenced by
the group's generation, committed offsets read only once stable, and an old transactional id fenced without a
producer kept for it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import ProducerFenced

from pipeline.errors import GroupGenerationFencedError
from pipeline.kafka import internals
from pipeline.kafka.fencing import fence_transactional_id
from pipeline.kafka.requests import GroupMetadata
from pipeline.kafka.stable_offsets import committed_stable
from tests.conftest import TopicFactory
from tests.integration.test_broker_transactions import _committed_offset, _read_all, _send_and_commit

pytestmark = pytest.mark.broker


@asynccontextmanager
async def _started(client: AIOKafkaProducer | AIOKafkaConsumer) -> AsyncIterator[None]:
    await client.start()
    try:
        yield
    finally:
        await client.stop()


def _member(bootstrap: str, group: str, topic: str) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        isolation_level="read_committed",
        session_timeout_ms=10_000,
        heartbeat_interval_ms=200,
    )


async def _until(condition: Callable[[], bool], *consumers: AIOKafkaConsumer, timeout: float = 30) -> None:
    """Poll ``consumers`` (a rebalance completes while they poll) until ``condition`` holds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        for consumer in consumers:
            await consumer.getmany(timeout_ms=50)


async def test_offsets_carrying_a_generation_the_group_has_left_behind_are_refused_and_abort_on_the_broker(
    bootstrap: str, make_topic: TopicFactory, unique: Callable[[str], str]
) -> None:
    """Offsets sent with the generation of before a rebalance are refused (the transaction aborts on the broker:
    neither its offsets nor its records are committed); the current generation's are committed."""
    source, out = await make_topic("src", partitions=2), await make_topic("out")
    group, tp = unique("group"), TopicPartition(source, 0)
    first, second = _member(bootstrap, group, source), _member(bootstrap, group, source)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=unique("tx"))
    async with _started(first), _started(producer):
        await _until(lambda: bool(first.assignment()), first)
        stale = internals.group_metadata(first)
        async with _started(second):  # a rebalance: the first member's generation is over
            await _until(
                lambda: (
                    internals.group_metadata(first).generation_id > stale.generation_id
                    and bool(second.assignment())
                ),
                first,
                second,
            )
            current = internals.group_metadata(first)
            assert current.member_id == stale.member_id

            await producer.begin_transaction()
            await producer.send_and_wait(out, b"from-the-stale-generation")
            with pytest.raises(GroupGenerationFencedError, match="error 22"):
                await internals.send_offsets_with_group_metadata(producer, {tp: 5}, stale)
            with pytest.raises(GroupGenerationFencedError):
                await producer.commit_transaction()
            assert not internals.abort_would_be_local(producer)
            await producer.abort_transaction()

            async with producer.transaction():
                await producer.send_and_wait(out, b"from-the-current-generation")
                await internals.send_offsets_with_group_metadata(producer, {tp: 7}, current)

    assert await _committed_offset(bootstrap, group, tp) == 7
    assert await _read_all(bootstrap, out, isolation="read_committed", expect=1) == [
        b"from-the-current-generation"
    ]


async def test_a_member_id_the_group_never_had_is_refused(
    bootstrap: str, make_topic: TopicFactory, unique: Callable[[str], str]
) -> None:
    """Offsets carrying the current generation but a member id the group does not know are refused too."""
    source = await make_topic("src")
    group, tp = unique("group"), TopicPartition(source, 0)
    member = _member(bootstrap, group, source)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=unique("tx"))
    async with _started(member), _started(producer):
        await _until(lambda: bool(member.assignment()), member)
        real = internals.group_metadata(member)
        stranger = GroupMetadata(group, real.generation_id, "a-stranger", None)
        await producer.begin_transaction()
        with pytest.raises(GroupGenerationFencedError, match="error 25"):
            await internals.send_offsets_with_group_metadata(producer, {tp: 3}, stranger)
        await producer.abort_transaction()
    assert await _committed_offset(bootstrap, group, tp) is None


async def test_a_stable_read_waits_for_the_pending_transaction_and_gets_its_outcome(
    bootstrap: str, make_topic: TopicFactory, unique: Callable[[str], str]
) -> None:
    """While a transaction holds a partition's offsets, the require_stable read waits (aiokafka's own read answers
    the old offset); it returns the new offset right after the commit, and the old one after an abort."""
    source = await make_topic("src")
    group, tp = unique("group"), TopicPartition(source, 0)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=unique("tx"))
    reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    async with _started(producer), _started(reader):
        assert await committed_stable(reader, [tp]) == {tp: None}
        async with producer.transaction():
            await producer.send_offsets_to_transaction({tp: 3}, group)
        assert await committed_stable(reader, [tp]) == {tp: 3}

        await producer.begin_transaction()
        await producer.send_offsets_to_transaction({tp: 8}, group)
        read = await _held(reader, tp, plain=3)
        await producer.commit_transaction()
        assert await asyncio.wait_for(read, 5) == {tp: 8}

        await producer.begin_transaction()
        await producer.send_offsets_to_transaction({tp: 11}, group)
        read = await _held(reader, tp, plain=8)
        await producer.abort_transaction()
        assert await asyncio.wait_for(read, 5) == {tp: 8}


async def _held(
    reader: AIOKafkaConsumer, tp: TopicPartition, *, plain: int
) -> asyncio.Future[dict[TopicPartition, int | None]]:
    """A stable read of ``tp`` started while a transaction holds its offset: still waiting a second later, while
    aiokafka's own read answers the offset before the transaction (``plain``)."""
    read = asyncio.ensure_future(committed_stable(reader, [tp], timeout_s=30))
    await asyncio.sleep(1.0)
    assert not read.done(), "the stable read answered while a transaction held the offset"
    assert await reader.committed(tp) == plain
    return read


async def test_fencing_a_transactional_id_aborts_its_open_transaction_and_fences_its_producer(
    bootstrap: str, make_topic: TopicFactory, unique: Callable[[str], str]
) -> None:
    """An old-style producer's open transaction holding records is aborted by fence_transactional_id (a
    read_committed reader never sees them, and reads past them), and its next commit raises a fence."""
    topic, txn_id = await make_topic("out"), unique("app-group-src-0")
    old = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=txn_id)
    other = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=unique("tx"))
    async with _started(old), _started(other):
        await old.begin_transaction()
        await old.send_and_wait(topic, b"held-by-the-old-producer")

        _pid, epoch = await fence_transactional_id(other, txn_id)
        assert epoch >= 1
        async with other.transaction():
            await other.send_and_wait(topic, b"after-the-fence")
        assert await _read_all(bootstrap, topic, isolation="read_committed", expect=1) == [b"after-the-fence"]

        with pytest.raises(ProducerFenced):
            await _send_and_commit(old, topic, b"old-again")
    assert await _read_all(bootstrap, topic, isolation="read_committed", expect=1) == [b"after-the-fence"]
