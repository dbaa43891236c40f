"""The broker model's time and layout rules: segments deleted by retention on the broker's clock, a topic that
stamps what it appends (``message.timestamp.type=LogAppendTime``), more partitions for a topic and a group's
description, the last two through aiokafka's admin client as ``pipeline rescale`` asks them."""

from __future__ import annotations

import asyncio
import tomllib

from aiokafka.record.memory_records import MemoryRecords

from pipeline.kafka.admin import partition_count
from pipeline.ops.rescale import _raise_partitions, group_members
from pipeline.topology import parse
from tests.simulation import broker as b
from tests.simulation import codes, logs, wire
from tests.simulation.records import decode_produced, plain_batch
from tests.simulation.test_broker_rules import Model

HOUR = 3_600_000
BOOTSTRAP = f"{wire.HOST}:{wire.PORT}"


def _append(model: Model, topic: str, timestamp: int, value: bytes = b"v" * 100) -> int:
    """One plain batch of one record stamped ``timestamp``; its base offset."""
    [produced] = decode_produced(plain_batch([(b"k", value, [], timestamp)]))
    log = model.broker.log(topic, 0)
    assert log is not None
    error, base = log.append(produced, model.broker.topics[topic].config, model.broker.now_ms())
    assert error == codes.NONE
    return base


def test_retention_deletes_whole_segments_older_than_retention_by_the_brokers_clock() -> None:
    """Segments roll by size; once the broker's clock is more than retention.ms past a segment's largest
    timestamp the segment goes (never the active one), the log start moves, and a fetch below it is out of
    range; a segment holding one recent record stays whole."""
    model = Model()
    model.loop.max_time = 10_000.0
    config = logs.TopicConfig(retention_ms=HOUR, segment_bytes=400, cleanup_policy="compact,delete")
    model.broker.create_topic("changelog", 1, config)
    log = model.broker.log("changelog", 0)
    assert log is not None

    async def scenario(model: Model) -> None:
        now = model.broker.now_ms()
        for _ in range(5):
            _append(model, "changelog", now - 2 * HOUR)
        _append(model, "changelog", now)  # two batches a segment: this one shares the segment of offset 4
        assert [s.base_offset for s in log.segments.segments] == [0, 2, 4]
        _append(model, "changelog", now - 2 * HOUR)  # the active segment: old, but never deleted
        await asyncio.sleep(b.RETENTION_CHECK_S + 1)
        assert log.log_start == 4
        assert [offset for offset, _ in log.deleted] == [0, 1, 2, 3]
        assert log.batches[0].base_offset == 4
        assert any("retention deleted changelog-0 below offset 4" in line for line in model.trace)
        await asyncio.sleep(2 * HOUR / 1000)
        assert log.log_start == 6  # the segment of the recent record went once it was old too

    model.run(scenario)


def test_a_log_append_time_topic_stamps_each_batch_with_the_brokers_clock() -> None:
    """With LogAppendTime the stored batch carries the type bit and the append time as its max timestamp (its
    CRC still valid), its records read as stamped then, and neither the timestamp bounds nor the producer's
    time matter: retention counts from the append."""
    model = Model()
    config = logs.TopicConfig(
        timestamp_type=logs.LOG_APPEND_TIME, timestamp_after_max_ms=HOUR, retention_ms=HOUR
    )
    model.broker.create_topic("stamped", 1, config)
    log = model.broker.log("stamped", 0)
    assert log is not None

    async def scenario(model: Model) -> None:
        now = model.broker.now_ms()
        _append(model, "stamped", now + 400 * 24 * HOUR)  # refused on a CreateTime topic with this bound
        _append(model, "stamped", now - 50 * HOUR)
        batches = []
        records = MemoryRecords(log.read(0, 1 << 20, committed=False)[0])
        while records.has_next():
            batches.append(records.next_batch())
        assert [batch.validate_crc() for batch in batches] == [True, True]
        assert [batch.timestamp_type for batch in batches] == [1, 1]
        assert [record.timestamp for batch in batches for record in batch] == [now, now]
        assert [stored.max_timestamp for stored in log.batches] == [now, now]

    model.run(scenario)


def test_rescales_admin_requests_raise_partitions_and_count_live_members() -> None:
    """``pipeline rescale``'s own calls on the model: a group with a member counts it (DescribeGroups), an empty
    one none; CreatePartitions raises every topic of the topology, which Metadata then serves."""
    model = Model()
    topology = parse(
        tomllib.loads(
            """
[app]
name = "sim"
[topics]
input = "sim.raw"
partitions = 2
[sources.stripe]
provider = "stripe"
verify = "none"
"""
        )
    )
    from pipeline.kafka.admin import topic_specs  # noqa: PLC0415

    for spec in topic_specs(topology):
        model.broker.create_topic(spec.name, spec.partitions, logs.TopicConfig())

    async def scenario(model: Model) -> None:
        assert await group_members(BOOTSTRAP, "group") == 0
        member = next(iter(await model.join("")))
        assert await group_members(BOOTSTRAP, "group") == 1
        model.broker.coordinator.leave("group", member)
        await _raise_partitions(BOOTSTRAP, [s.name for s in topic_specs(topology)], 5, lambda _line: None)
        for spec in topic_specs(topology):
            assert await partition_count(BOOTSTRAP, spec.name) == 5

    assert not model.run_clients(scenario, seed=5).errors


def test_a_lookup_by_time_finds_the_first_record_stamped_at_or_after_it_below_what_the_reader_may_read() -> (
    None
):
    """``offsets_for_times`` (``--since``) through aiokafka on the model: the first record, in log order, stamped
    at or after the time (an exact stamp included, out-of-order stamps in log order), none past the last stamp,
    and for a read_committed reader none at or past the LSO (an open transaction's records)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition  # noqa: PLC0415

    model = Model()
    model.broker.create_topic("dlq", 1, logs.TopicConfig())
    tp = TopicPartition("dlq", 0)

    async def scenario(model: Model) -> None:
        now = model.broker.now_ms()
        for stamp in (now - 300, now - 100, now - 200, now):  # offsets 0..3
            _append(model, "dlq", stamp)
        log = model.broker.log("dlq", 0)
        assert log is not None
        consumer = AIOKafkaConsumer(bootstrap_servers=BOOTSTRAP, isolation_level="read_committed")
        await consumer.start()
        try:
            found = await consumer.offsets_for_times({tp: now - 200})
            assert (found[tp].offset, found[tp].timestamp) == (
                1,
                now - 100,
            )  # offset 2's exact stamp comes later
            assert (await consumer.offsets_for_times({tp: now - 300}))[tp].offset == 0
            assert (await consumer.offsets_for_times({tp: now}))[tp].offset == 3
            assert (await consumer.offsets_for_times({tp: now + 1}))[tp] is None
            log.open_txns[99] = 3  # a transaction open from offset 3: a read_committed reader stops below it
            assert (await consumer.offsets_for_times({tp: now}))[tp] is None
        finally:
            await consumer.stop()

    assert not model.run_clients(scenario, seed=5).errors
