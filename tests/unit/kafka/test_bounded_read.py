"""A bounded read goes to the end offsets it read first, through silences and reconnects, or fails naming how far it got."""

from __future__ import annotations

from contextlib import aclosing
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError

from pipeline.kafka.bounded_read import Bounds, ReadIncompleteError, read_to_end

from .reader_fakes import Partitions

TOPIC = "dlq"


async def _read(broker: Partitions, bounds: Bounds | None = None, **options: Any) -> list[tuple[int, int]]:
    """Every (partition, offset) the read gives, in order."""
    clock = broker.clock

    async def sleep(seconds: float) -> None:
        clock.now += seconds

    tps = [TopicPartition(TOPIC, p) for p in sorted(broker.ends)]
    given: list[tuple[int, int]] = []
    reading = read_to_end(
        broker.connect, tps, bounds or Bounds(), clock=clock.monotonic, sleep=sleep, **options
    )
    async with aclosing(reading):
        async for records in reading:
            given += [(r.partition, r.offset) for r in records]
    return given


def _all(counts: dict[int, int]) -> list[tuple[int, int]]:
    return sorted((p, o) for p, n in counts.items() for o in range(n))


async def test_a_silence_longer_than_any_idle_window_before_the_end_is_waited_through() -> None:
    """Nothing comes for 40 s (by the clock) with partitions short of their ends: the read waits and reads to the end."""
    broker = Partitions.of(TOPIC, {0: 7, 1: 5})
    broker.pauses[(0, 4)] = 80  # 80 empty fetches of 0.5 s
    bounds = Bounds()
    given = await _read(broker, bounds)
    assert sorted(given) == _all({0: 7, 1: 5})
    assert len(given) == len(set(given))
    assert bounds.read == bounds.total == 8 + 6  # the records and a transaction marker each
    assert broker.connects > 1  # the silent consumer was replaced meanwhile


async def test_an_error_mid_read_reconnects_and_resumes_where_it_was_giving_each_record_once() -> None:
    """A fetch that raises (the broker restarting) closes the consumer; after a failed reconnect, a new
    consumer resumes at the positions reached and gives each record once."""
    broker = Partitions.of(TOPIC, {0: 6, 1: 6})
    connect, calls = broker.connect, 0

    async def flaky() -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise KafkaConnectionError("Unable to bootstrap from 127.0.0.1:9")
        return await connect()

    clock = broker.clock

    async def sleep(seconds: float) -> None:
        clock.now += seconds

    tps = [TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)]
    given: list[tuple[int, int]] = []
    reading = read_to_end(flaky, tps, Bounds(), clock=clock.monotonic, sleep=sleep)
    async with aclosing(reading):
        async for records in reading:
            if not given:
                broker.failures.append(KafkaTimeoutError())  # the next fetch fails
            given += [(r.partition, r.offset) for r in records]
    assert sorted(given) == _all({0: 6, 1: 6})
    assert len(given) == len(set(given))
    assert calls == 3  # the first consumer, a failed reconnect, the one that finished
    assert len(broker.readers) == 2
    assert all(reader.stopped for reader in broker.readers)


async def test_a_partition_that_never_reaches_its_end_fails_naming_it_and_how_far_it_got() -> None:
    """One partition stops short for good: the read raises after its timeout, naming that partition, offset and end."""
    broker = Partitions.of(TOPIC, {0: 4, 1: 10, 2: 3})
    broker.reachable[1] = 6
    bounds = Bounds()
    with pytest.raises(ReadIncompleteError) as raised:
        await _read(broker, bounds, timeout=30.0)
    message = str(raised.value)
    assert message.startswith(f"reading {TOPIC} stopped short of its end: partition 1 at offset 6 of 11 ")
    assert "partition 0" not in message
    assert "partition 2" not in message
    assert "\n" not in message
    assert raised.value.short == {1: (6, 11)}
    assert bounds.read == bounds.total - 5


async def test_ends_that_cannot_be_read_fail_after_the_timeout_with_the_last_error() -> None:
    """A broker away from the start: retried with backoff, then one line saying the ends could not be read and why."""
    broker = Partitions.of(TOPIC, {0: 2})

    async def refused() -> Any:
        raise KafkaConnectionError("Unable to bootstrap from 127.0.0.1:9")

    broker.connect = refused  # type: ignore[method-assign]
    with pytest.raises(ReadIncompleteError) as raised:
        await _read(broker, timeout=20.0)
    message = str(raised.value)
    assert "could not read its end offsets" in message
    assert "KafkaConnectionError" in message
    assert "\n" not in message


async def test_since_starts_each_partition_at_its_first_record_at_or_after_that_time() -> None:
    """``since_ms``: each partition from its first record at that time; a partition with none is already at its end."""
    broker = Partitions.of(TOPIC, {0: 6, 1: 2})
    given = await _read(broker, since_ms=1_700_000_000_000 + 3)
    assert sorted(given) == [(0, 3), (0, 4), (0, 5)]
