"""The broker supports what the worker relies on: transactions, transactional offsets, fencing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import ProducerFenced

from tests.conftest import TopicFactory

pytestmark = pytest.mark.broker


async def _read_all(
    bootstrap: str, topic: str, *, isolation: str, expect: int, timeout: float = 10
) -> list[bytes]:
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        isolation_level=isolation,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    values: list[bytes] = []
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            batch = await consumer.getmany(timeout_ms=300)
            values += [m.value for records in batch.values() for m in records]
            if len(values) >= expect and not batch:
                break
    finally:
        await consumer.stop()
    return values


async def test_committed_records_are_visible_and_aborted_ones_are_not(
    bootstrap: str, make_topic: TopicFactory, unique: Callable[[str], str]
) -> None:
    """A read_committed consumer sees a committed transaction's records and never an aborted one's."""
    topic = await make_topic("txn")
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=unique("tx"))
    await producer.start()
    try:
        async with producer.transaction():
            await producer.send_and_wait(topic, b"committed-1")
            await producer.send_and_wait(topic, b"committed-2")
        await producer.begin_transaction()
        await producer.send_and_wait(topic, b"aborted")
        await producer.abort_transaction()
        async with producer.transaction():
            await producer.send_and_wait(topic, b"committed-3")
    finally:
        await producer.stop()

    committed = await _read_all(bootstrap, topic, isolation="read_committed", expect=3)
    uncommitted = await _read_all(bootstrap, topic, isolation="read_uncommitted", expect=4)
    assert committed == [b"committed-1", b"committed-2", b"committed-3"]
    assert b"aborted" in uncommitted


async def _committed_offset(bootstrap: str, group: str, tp: TopicPartition) -> int | None:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        committed: int | None = await consumer.committed(tp)
        return committed
    finally:
        await consumer.stop()


async def test_offsets_sent_to_a_transaction_commit_only_with_it(
    bootstrap: str, make_topic: TopicFactory, unique: Callable[[str], str]
) -> None:
    """send_offsets_to_transaction moves the group's offset on commit and leaves it on abort."""
    source = await make_topic("src")
    group = unique("group")
    tp = TopicPartition(source, 0)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=unique("tx"))
    await producer.start()
    try:
        await producer.begin_transaction()
        await producer.send_offsets_to_transaction({tp: 5}, group)
        await producer.abort_transaction()
        assert await _committed_offset(bootstrap, group, tp) is None

        async with producer.transaction():
            await producer.send_offsets_to_transaction({tp: 7}, group)
        assert await _committed_offset(bootstrap, group, tp) == 7

        await producer.begin_transaction()
        await producer.send_offsets_to_transaction({tp: 9}, group)
        await producer.abort_transaction()
        assert await _committed_offset(bootstrap, group, tp) == 7
    finally:
        await producer.stop()


async def _send_and_commit(producer: AIOKafkaProducer, topic: str, value: bytes) -> None:
    await producer.send_and_wait(topic, value)
    await producer.commit_transaction()


async def test_a_second_producer_with_the_same_transactional_id_fences_the_first(
    bootstrap: str, make_topic: TopicFactory, unique: Callable[[str], str]
) -> None:
    """Starting a producer with a taken transactional id fences the older one and aborts its transaction."""
    topic = await make_topic("fence")
    txn_id = unique("tx")
    zombie = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=txn_id)
    await zombie.start()
    successor = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=txn_id)
    try:
        await zombie.begin_transaction()
        await zombie.send_and_wait(topic, b"from-zombie")

        await successor.start()  # InitProducerId bumps the epoch and aborts the zombie's open transaction
        async with successor.transaction():
            await successor.send_and_wait(topic, b"from-successor")

        with pytest.raises(ProducerFenced):
            await _send_and_commit(zombie, topic, b"zombie-again")
    finally:
        await successor.stop()
        await zombie.stop()

    assert await _read_all(bootstrap, topic, isolation="read_committed", expect=1) == [b"from-successor"]
