"""ChangelogReader: its consumer's settings, and each bound and fetch asked of that consumer or internals."""

from __future__ import annotations

from typing import Any

import pytest
from aiokafka import TopicPartition

from pipeline.kafka import changelog, internals
from pipeline.kafka.changelog import ChangelogReader
from pipeline.kafka.clients import RESTORE_CLIENT_ID, RESTORE_PARTITION_BYTES

C0, C1 = TopicPartition("c", 0), TopicPartition("c", 1)
MIB = 1024 * 1024


class _WireOffset(int):
    """An offset as a client library might hand it back: an int, but not exactly ``int``."""


class FakeConsumer:
    """A group-less consumer that records what it is asked and answers offsets from ``ends`` and ``beginnings``."""

    def __init__(self, **made_with: Any) -> None:
        self.made_with = made_with
        self.calls: list[tuple[Any, ...]] = []
        self.ends = {C0: _WireOffset(40), C1: _WireOffset(41)}
        self.beginnings = {C0: _WireOffset(3), C1: _WireOffset(4)}

    async def start(self) -> None:
        self.calls.append(("start",))

    async def stop(self) -> None:
        self.calls.append(("stop",))

    async def end_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        self.calls.append(("end_offsets", partitions))
        return {tp: self.ends[tp] for tp in partitions}

    async def beginning_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        self.calls.append(("beginning_offsets", partitions))
        return {tp: self.beginnings[tp] for tp in partitions}


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[FakeConsumer]:
    """Every consumer ChangelogReader makes, in order (fakes: no broker, no connection)."""
    consumers: list[FakeConsumer] = []

    def restore_consumer(bootstrap: str, *, fetch_bytes: int, client_id: str) -> FakeConsumer:
        consumer = FakeConsumer(bootstrap=bootstrap, fetch_bytes=fetch_bytes, client_id=client_id)
        consumers.append(consumer)
        return consumer

    monkeypatch.setattr(changelog, "restore_consumer", restore_consumer)
    return consumers


def test_the_reader_keeps_its_fetch_size_and_its_share_for_one_partition(made: list[FakeConsumer]) -> None:
    """``fetch_bytes`` is kept as given and ``partition_bytes`` is min(fetch_bytes, 16 MiB)."""
    small = ChangelogReader("k:9092", fetch_bytes=MIB)
    large = ChangelogReader("k:9092", fetch_bytes=64 * MIB)
    assert (small.fetch_bytes, small.partition_bytes) == (MIB, MIB)
    assert (large.fetch_bytes, large.partition_bytes) == (64 * MIB, RESTORE_PARTITION_BYTES)
    assert RESTORE_PARTITION_BYTES == 16 * MIB


def test_the_consumer_is_a_restore_consumer_by_default(made: list[FakeConsumer]) -> None:
    """Without a client id, the reader's consumer is made for the bootstrap and fetch size as RESTORE_CLIENT_ID."""
    reader = ChangelogReader("k:9092", fetch_bytes=MIB)
    assert made[0].made_with == {"bootstrap": "k:9092", "fetch_bytes": MIB, "client_id": RESTORE_CLIENT_ID}
    assert reader._consumer is made[0]


def test_the_consumer_takes_the_client_id_given(made: list[FakeConsumer]) -> None:
    """A given client id (the standbys') names the reader's consumer instead."""
    ChangelogReader("k:9092", fetch_bytes=MIB, client_id="pipeline-standby")
    assert made[0].made_with["client_id"] == "pipeline-standby"


async def test_start_and_stop_start_and_stop_the_consumer(made: list[FakeConsumer]) -> None:
    """``start`` and ``stop`` are the consumer's own, one call each."""
    reader = ChangelogReader("k:9092", fetch_bytes=MIB)
    await reader.start()
    assert made[0].calls == [("start",)]
    await reader.stop()
    assert made[0].calls == [("start",), ("stop",)]


async def test_async_with_gives_the_started_reader_and_stops_it_even_on_an_error(
    made: list[FakeConsumer],
) -> None:
    """``async with`` starts the consumer, gives the reader itself, and stops the consumer when the block raises."""
    reader = ChangelogReader("k:9092", fetch_bytes=MIB)
    inside: list[tuple[ChangelogReader, list[tuple[Any, ...]]]] = []

    async def failing_block() -> None:
        async with reader as entered:
            inside.append((entered, list(made[0].calls)))
            raise RuntimeError("inside")

    with pytest.raises(RuntimeError, match="inside"):
        await failing_block()
    assert inside == [(reader, [("start",)])]
    assert made[0].calls == [("start",), ("stop",)]


async def test_end_is_the_last_stable_offset_of_one_partition(made: list[FakeConsumer]) -> None:
    """``end`` asks the consumer's ``end_offsets`` for that partition alone and gives a plain int."""
    reader = ChangelogReader("k:9092", fetch_bytes=MIB)
    end = await reader.end(C1)
    assert (end, type(end)) == (41, int)
    assert made[0].calls == [("end_offsets", [C1])]


async def test_ends_asks_for_every_partition_in_one_request(made: list[FakeConsumer]) -> None:
    """``ends`` passes the partitions (any iterable) as one list and gives each answer as a plain int."""
    reader = ChangelogReader("k:9092", fetch_bytes=MIB)
    ends = await reader.ends(iter([C0, C1]))
    assert ends == {C0: 40, C1: 41}
    assert {type(offset) for offset in ends.values()} == {int}
    assert made[0].calls == [("end_offsets", [C0, C1])]


async def test_beginning_is_the_first_offset_of_one_partition(made: list[FakeConsumer]) -> None:
    """``beginning`` asks the consumer's ``beginning_offsets`` for that partition alone and gives a plain int."""
    reader = ChangelogReader("k:9092", fetch_bytes=MIB)
    beginning = await reader.beginning(C0)
    assert (beginning, type(beginning)) == (3, int)
    assert made[0].calls == [("beginning_offsets", [C0])]


async def test_fetch_is_one_raw_fetch_through_the_consumer_with_the_readers_sizes(
    made: list[FakeConsumer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``fetch`` hands the consumer, partition, position and both sizes to ``internals.fetch_raw`` and gives its answer."""
    answer = internals.RawFetch(None, [], None)
    asked: list[tuple[Any, ...]] = []

    async def fetch_raw(
        consumer: Any, tp: TopicPartition, position: int, *, fetch_bytes: int, partition_bytes: int
    ) -> internals.RawFetch:
        asked.append((consumer, tp, position, fetch_bytes, partition_bytes))
        return answer

    monkeypatch.setattr(internals, "fetch_raw", fetch_raw)
    reader = ChangelogReader("k:9092", fetch_bytes=64 * MIB)
    assert await reader.fetch(C1, 17) is answer
    assert asked == [(made[0], C1, 17, 64 * MIB, RESTORE_PARTITION_BYTES)]


async def test_refresh_updates_the_consumers_metadata(
    made: list[FakeConsumer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``refresh`` hands the reader's consumer to ``internals.force_metadata_update``."""
    refreshed: list[Any] = []

    async def force_metadata_update(consumer: Any) -> None:
        refreshed.append(consumer)

    monkeypatch.setattr(internals, "force_metadata_update", force_metadata_update)
    await ChangelogReader("k:9092", fetch_bytes=MIB).refresh()
    assert refreshed == [made[0]]


async def test_log_end_is_the_high_watermark_asked_through_the_consumer(
    made: list[FakeConsumer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``log_end`` hands the consumer and partition to ``internals.log_end`` and gives its answer."""
    asked: list[tuple[Any, TopicPartition]] = []

    async def log_end(consumer: Any, tp: TopicPartition) -> int:
        asked.append((consumer, tp))
        return 52

    monkeypatch.setattr(internals, "log_end", log_end)
    assert await ChangelogReader("k:9092", fetch_bytes=MIB).log_end(C0) == 52
    assert asked == [(made[0], C0)]
