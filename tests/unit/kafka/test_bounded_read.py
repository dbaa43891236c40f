"""A bounded read goes to the end offsets it read first, through silences and reconnects, or fails naming how far it got."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError

from pipeline.errors import BrokerUnavailableError
from pipeline.kafka.bounded_read import (
    FIRST_BACKOFF,
    MAX_BACKOFF,
    RECONNECT_AFTER,
    Bounds,
    ReadIncompleteError,
    read_to_end,
)

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
    refused = _refusing(broker, KafkaConnectionError("Unable to bootstrap from 127.0.0.1:9"))
    with pytest.raises(ReadIncompleteError) as raised:
        await _given(broker, connect=refused, timeout=20.0)
    message = str(raised.value)
    assert "could not read its end offsets" in message
    assert "KafkaConnectionError" in message
    assert "\n" not in message


async def test_since_starts_each_partition_at_its_first_record_at_or_after_that_time() -> None:
    """``since_ms``: each partition from its first record at that time; a partition with none is already at its end."""
    broker = Partitions.of(TOPIC, {0: 6, 1: 2})
    given = await _read(broker, since_ms=1_700_000_000_000 + 3)
    assert sorted(given) == [(0, 3), (0, 4), (0, 5)]


# -- the error, and the bounds ----------------------------------------------------------------------------------


def test_the_error_names_each_short_partition_in_order_and_the_last_error_if_any() -> None:
    """Short partitions by number, each at its offset of its end; the wait as given; the last error when there was one."""
    error = ReadIncompleteError(TOPIC, {2: (1, 5), 0: (3, 4)}, 30.0, None)
    assert str(error) == (
        "reading dlq stopped short of its end: partition 0 at offset 3 of 4, partition 2 at offset 1 of 5 "
        "(every other partition reached its end), after 30s without progress"
    )
    assert (error.topic, error.short) == (TOPIC, {2: (1, 5), 0: (3, 4)})
    assert (error.retriable, error.reason) == (True, "read-incomplete")
    assert str(ReadIncompleteError(TOPIC, {}, 12.5, "TimeoutError")) == (
        "reading dlq could not read its end offsets, after 12.5s without progress; last error: TimeoutError"
    )


def test_bounds_count_from_each_start_to_each_end() -> None:
    """total and read count from the starts (not offset 0); a partition at its end is not left, one short of it is."""
    a, b, c = (TopicPartition(TOPIC, p) for p in range(3))
    bounds = Bounds(starts={a: 3, b: 5, c: 2}, ends={a: 7, b: 5, c: 4}, positions={a: 5, b: 5, c: 4})
    assert bounds.total == 4 + 0 + 2
    assert bounds.read == 2 + 0 + 2
    assert bounds.left() == [a]


# -- reading, with the reader fakes --------------------------------------------------------------------------------


Connect = Callable[[], Awaitable[Any]]


async def _given(
    broker: Partitions,
    *,
    connect: Connect | None = None,
    partitions: list[TopicPartition] | None = None,
    bounds: Bounds | None = None,
    sleeps: list[float] | None = None,
    **options: Any,
) -> list[tuple[int, int]]:
    """Every (partition, offset) the read gives, in order; each wait it asks for is appended to ``sleeps``."""
    clock = broker.clock

    async def sleep(seconds: float) -> None:
        if sleeps is not None:
            sleeps.append(seconds)
        clock.now += seconds

    tps = [TopicPartition(TOPIC, p) for p in sorted(broker.ends)] if partitions is None else partitions
    given: list[tuple[int, int]] = []
    reading = read_to_end(
        connect or broker.connect, tps, bounds or Bounds(), clock=clock.monotonic, sleep=sleep, **options
    )
    async with aclosing(reading):
        async for records in reading:
            given += [(r.partition, r.offset) for r in records]
    return given


def _refusing(broker: Partitions, error: Exception, *, takes: float = 0.0) -> Connect:
    """A connect that takes ``takes`` seconds (by the broker's clock) and fails with ``error``, a thousand times at most."""
    calls = 0

    async def connect() -> Any:
        nonlocal calls
        calls += 1
        assert calls < 1000, "a read retrying past its timeout"
        broker.clock.now += takes
        raise error

    return connect


async def test_a_silent_consumer_is_replaced_after_exactly_reconnect_after_seconds() -> None:
    """Empty fetches of 0.5 s: the 20th (10 s, RECONNECT_AFTER) closes the consumer, and the next one gets its own
    10 s from when it connected; it resumes where the read was."""
    assert RECONNECT_AFTER == 10.0
    broker = Partitions.of(TOPIC, {0: 3})
    broker.pauses[(0, 0)] = 45
    given = await _given(broker)
    assert given == _all({0: 3})
    assert [reader.fetches for reader in broker.readers] == [20, 20, 5 + 2]
    back_to_start = [(TopicPartition(TOPIC, 0), 0)]
    assert [reader.seeks for reader in broker.readers] == [[], back_to_start, back_to_start]
    assert all(reader.stopped for reader in broker.readers)


async def test_records_a_partition_got_after_its_end_was_read_are_not_given() -> None:
    """The end is the one read first: records committed after it (a fetch brings them) are left for the next read."""
    broker = Partitions.of(TOPIC, {0: 10}, marker=False)
    broker.first_ends = {0: 5}
    bounds = Bounds()
    given = await _given(broker, bounds=bounds)
    assert given == [(0, o) for o in range(5)]
    assert bounds.positions == {TopicPartition(TOPIC, 0): 5}
    assert bounds.read == bounds.total == 5


async def test_a_consumer_that_reads_from_before_where_it_was_sent_gives_each_record_once() -> None:
    """A fetch that starts before the read's position (the consumer did not keep the seek) skips the records given
    or before the start, and gives the rest of that same fetch."""
    broker = Partitions.of(TOPIC, {0: 6, 1: 2})
    broker.ignore_seeks = True
    given = await _given(broker, since_ms=1_700_000_000_000 + 3)
    assert given == [(0, 3), (0, 4), (0, 5)]
    assert broker.readers[0].seeks == [(TopicPartition(TOPIC, 0), 3), (TopicPartition(TOPIC, 1), 3)]


async def test_since_counts_the_bounds_from_the_first_record_at_that_time() -> None:
    """``since_ms``: each start is that record's offset (a partition with none starts at its end), and the totals
    count from there."""
    broker = Partitions.of(TOPIC, {0: 6, 1: 2})
    bounds = Bounds()
    await _given(broker, bounds=bounds, since_ms=1_700_000_000_000 + 3)
    p0, p1 = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)
    assert bounds.starts == {p0: 3, p1: 3}
    assert bounds.ends == {p0: 7, p1: 3}
    assert bounds.total == bounds.read == 4


async def test_since_a_time_whose_first_record_is_past_the_end_reads_nothing() -> None:
    """The first record at ``since_ms`` lies past the end read: the partition starts at its end, nothing to read."""
    broker = Partitions.of(TOPIC, {0: 6}, marker=False)
    broker.first_ends = {0: 3}
    bounds = Bounds()
    assert await _given(broker, bounds=bounds, since_ms=1_700_000_000_000 + 4) == []
    assert bounds.starts == {TopicPartition(TOPIC, 0): 3}
    assert bounds.total == bounds.read == 0


async def test_after_a_failure_following_a_fetch_the_next_consumer_starts_after_the_records_given() -> None:
    """The position asked after a fetch that brought nothing fails: the next consumer is sent to the offset after
    the last record given, and no record is given twice."""
    broker = Partitions.of(TOPIC, {0: 5}, marker=False)
    broker.pauses[(0, 2)] = 1
    broker.position_failures += [KafkaTimeoutError(), KafkaTimeoutError()]
    given = await _given(broker)
    assert given == _all({0: 5})
    assert broker.readers[1].seeks == [(TopicPartition(TOPIC, 0), 2)]


async def test_records_fetched_before_a_failing_position_are_still_given() -> None:
    """A fetch brings records 0 and 1, then asking the position fails: 0 and 1 are still given, once, and the
    same consumer reads on (the positions stand past them: raising would lose them)."""
    broker = Partitions.of(TOPIC, {0: 5}, marker=False)
    broker.position_failures.append(KafkaTimeoutError())
    assert await _given(broker) == _all({0: 5})
    assert len(broker.readers) == 1


async def test_records_coming_count_as_progress_so_silences_add_up_to_no_timeout() -> None:
    """Two silences of 20 s with records between them, 30 s to time out: each record resets the wait."""
    broker = Partitions.of(TOPIC, {0: 6}, marker=False)
    broker.pauses[(0, 2)] = 40
    broker.pauses[(0, 4)] = 40
    assert await _given(broker, timeout=30.0) == _all({0: 6})


async def test_passing_aborted_records_counts_as_progress() -> None:
    """A fetch that gives no record but moves past aborted records and markers is progress: the wait starts again."""
    broker = Partitions.of(TOPIC, {0: 2, 1: 4}, marker=False)
    broker.ends[0] = 6  # offsets 2-5: an aborted transaction and its marker
    broker.pauses[(0, 2)] = 30
    broker.pauses[(1, 2)] = 50
    bounds = Bounds()
    given = await _given(broker, bounds=bounds, timeout=20.0)
    assert sorted(given) == _all({0: 2, 1: 4})
    assert bounds.read == bounds.total == 6 + 4


async def test_the_wait_between_attempts_doubles_from_a_quarter_second_to_five_and_ends_at_the_timeout() -> (
    None
):
    """The broker away for good: waits of 0.25, 0.5, 1, 2, 4, then 5 s, the last cut to the time left; then the
    error, naming the last failure."""
    assert (FIRST_BACKOFF, MAX_BACKOFF) == (0.25, 5.0)
    broker = Partitions.of(TOPIC, {0: 2})
    sleeps: list[float] = []
    away = BrokerUnavailableError(
        "cannot reach Kafka at 127.0.0.1:9: KafkaConnectionError: Unable to bootstrap"
    )
    with pytest.raises(ReadIncompleteError) as raised:
        await _given(broker, connect=_refusing(broker, away), sleeps=sleeps, timeout=20.0)
    assert sleeps == [0.25, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 2.25]
    assert str(raised.value) == (
        "reading dlq could not read its end offsets, after 20s without progress; "
        f"last error: BrokerUnavailableError: {away}"
    )
    assert (raised.value.topic, raised.value.short) == (TOPIC, {})


async def test_by_default_a_read_gives_up_after_a_minute_without_progress() -> None:
    """READ_TIMEOUT_S: 60 s."""
    broker = Partitions.of(TOPIC, {0: 2})
    sleeps: list[float] = []
    with pytest.raises(ReadIncompleteError, match=r"after 60s without progress"):
        await _given(broker, connect=_refusing(broker, BrokerUnavailableError("away")), sleeps=sleeps)
    assert sum(sleeps) == 60.0


@pytest.mark.parametrize(
    ("error", "named"),
    [
        (BrokerUnavailableError("away"), "BrokerUnavailableError: away"),
        (TimeoutError(), "TimeoutError"),
        (KafkaTimeoutError(), "KafkaTimeoutError"),
        (
            KafkaConnectionError("Connection at 127.0.0.1:9 closed"),
            "KafkaConnectionError: Connection at 127.0.0.1:9 closed",
        ),
    ],
)
async def test_a_failure_past_the_deadline_waits_no_more_and_the_wait_is_told_to_a_tenth(
    error: Exception, named: str
) -> None:
    """A connect that fails 0.625 s in, with 0.5 s to time out: no wait, the error at once, after 0.6 s; an error
    without a message is named by its type alone, and a Kafka error's type once."""
    broker = Partitions.of(TOPIC, {0: 2})
    sleeps: list[float] = []
    with pytest.raises(ReadIncompleteError) as raised:
        await _given(broker, connect=_refusing(broker, error, takes=0.625), sleeps=sleeps, timeout=0.5)
    assert sleeps == [0]
    assert str(raised.value) == (
        f"reading dlq could not read its end offsets, after 0.6s without progress; last error: {named}"
    )


async def test_progress_after_a_failure_starts_the_backoff_again_and_forgets_the_failure() -> None:
    """A fetch fails, records come, a fetch fails again: both waits are the first one; a partition then stuck
    fails without a last error, since the read moved after it."""
    broker = Partitions.of(TOPIC, {0: 4, 1: 10}, marker=False)
    broker.reachable[1] = 6
    broker.failures.append(KafkaTimeoutError())
    clock = broker.clock
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        clock.now += seconds

    tps = [TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)]

    async def read() -> None:
        reading = read_to_end(broker.connect, tps, Bounds(), clock=clock.monotonic, sleep=sleep, timeout=30.0)
        async with aclosing(reading):
            async for _records in reading:
                if (
                    not broker.failures and len(broker.readers) == 2
                ):  # the first records after the first failure
                    broker.failures.append(KafkaConnectionError("closed"))

    with pytest.raises(ReadIncompleteError) as raised:
        await read()
    assert sleeps == [0.25, 0.25]
    assert str(raised.value) == (
        "reading dlq stopped short of its end: partition 1 at offset 6 of 10 "
        "(every other partition reached its end), after 30s without progress"
    )


class _Timeouts:
    """``asyncio.timeout`` recording each delay it is given (cut to ``cut`` seconds of real time when set)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, cut: float | None = None) -> None:
        real = asyncio.timeout
        self.delays: list[float | None] = []

        def timeout(delay: float | None) -> Any:
            self.delays.append(delay)
            return real(delay if cut is None else cut)

        monkeypatch.setattr(asyncio, "timeout", timeout)


@pytest.mark.parametrize(("connect_takes", "bounded"), [(4.0, [30.0, 26.0, 26.0]), (29.5, [30.0, 1.0, 1.0])])
async def test_each_request_is_bounded_by_the_time_left_and_at_least_a_second(
    monkeypatch: pytest.MonkeyPatch, connect_takes: float, bounded: list[float]
) -> None:
    """The connect, the placing (ends, starts) and each position asked are given the time left before the
    timeout, and never less than a second (a request needs a moment)."""
    timeouts = _Timeouts(monkeypatch)
    broker = Partitions.of(TOPIC, {0: 2}, marker=False)

    async def slow() -> Any:
        broker.clock.now += connect_takes
        return await broker.connect()

    assert await _given(broker, connect=slow, timeout=30.0) == _all({0: 2})
    assert timeouts.delays == bounded


async def test_a_consumer_that_hangs_is_given_up_and_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    """A connect that never returns is cut at its bound (10 ms here) like a failure: a wait, then a new consumer."""
    timeouts = _Timeouts(monkeypatch, cut=0.01)
    broker = Partitions.of(TOPIC, {0: 2})
    hung = False

    async def connect() -> Any:
        nonlocal hung
        if not hung:
            hung = True
            await asyncio.Event().wait()
        return await broker.connect()

    sleeps: list[float] = []
    assert await _given(broker, connect=connect, sleeps=sleeps) == _all({0: 2})
    assert sleeps == [0.25]
    assert timeouts.delays[0] == 60.0


async def test_empty_partitions_are_at_their_end_from_the_start() -> None:
    """Partitions whose end is 0 are never fetched: a topic of them reads nothing and fetches nothing."""
    broker = Partitions.of(TOPIC, {0: 0, 1: 0})
    bounds = Bounds()
    assert await _given(broker, bounds=bounds) == []
    assert (bounds.total, bounds.read, bounds.left()) == (0, 0, [])
    assert broker.readers[0].fetches == 0
    assert broker.readers[0].stopped


async def test_an_empty_partition_beside_others_is_left_out_of_the_fetches() -> None:
    """One empty partition, one with records: the records, and the read ends."""
    broker = Partitions.of(TOPIC, {0: 0, 1: 3})
    assert await _given(broker) == [(1, 0), (1, 1), (1, 2)]


async def test_a_read_of_no_partitions_names_no_topic_when_it_fails() -> None:
    """No partitions and no broker: the error says "?" for the topic."""
    broker = Partitions.of(TOPIC, {})
    with pytest.raises(ReadIncompleteError) as raised:
        await _given(broker, connect=_refusing(broker, TimeoutError()), partitions=[], timeout=1.0)
    assert str(raised.value).startswith("reading ? could not read its end offsets")


@pytest.mark.parametrize("error", [KafkaConnectionError("closed"), OSError("reset"), KafkaTimeoutError()])
async def test_a_consumer_that_fails_to_stop_does_not_fail_the_read(error: Exception) -> None:
    """A stop raising a KafkaError or an OSError, after a reconnect or at the end: the read goes on and ends well."""
    broker = Partitions.of(TOPIC, {0: 4})
    broker.failures.append(KafkaTimeoutError())
    broker.stop_failures += [error, error]
    assert await _given(broker) == _all({0: 4})
    assert len(broker.readers) == 2
    assert broker.stop_failures == []


async def test_a_read_stopped_early_closes_its_consumer() -> None:
    """Closing the iterator after the first batch stops the consumer."""
    broker = Partitions.of(TOPIC, {0: 6})
    reading = read_to_end(broker.connect, [TopicPartition(TOPIC, 0)], Bounds(), clock=broker.clock.monotonic)
    async with aclosing(reading):
        async for records in reading:
            assert [r.offset for r in records] == [0, 1]
            break
    assert broker.readers[0].stopped


async def test_a_read_by_the_real_clock_and_sleep_reads_to_the_end() -> None:
    """With neither clock nor sleep given (time.monotonic, asyncio.sleep), a read with nothing in the way ends."""
    broker = Partitions.of(TOPIC, {0: 3, 1: 1})
    reading = read_to_end(broker.connect, [TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)], Bounds())
    given: list[tuple[int, int]] = []
    async with aclosing(reading):
        async for records in reading:
            given += [(r.partition, r.offset) for r in records]
    assert sorted(given) == _all({0: 3, 1: 1})
