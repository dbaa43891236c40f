"""The console's bounded range read (``read_range``): a silence short of the end is an error, never the end."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka import TopicPartition

from pipeline.console.dlq_read import read_range
from pipeline.kafka.bounded_read import ReadIncompleteError

TP = TopicPartition("shop.dlq", 2)


@dataclass
class Record:
    offset: int


@dataclass
class Partition:
    """One partition as a read_committed consumer sees it: records at some offsets, a marker at the others."""

    records: set[int]
    stop_at: int | None = None  # the broker goes away here: nothing more is fetched
    at: int = 0  # the consumer's position
    fetches: int = 0
    seeks: list[int] = field(default_factory=list)

    def assign(self, partitions: list[TopicPartition]) -> None: ...

    def seek(self, partition: TopicPartition, offset: int) -> None:
        self.seeks.append(offset)
        self.at = offset

    async def seek_to_beginning(self, *partitions: TopicPartition) -> Any: ...

    async def position(self, partition: TopicPartition) -> int:
        return self.at

    async def end_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {}

    async def offsets_for_times(self, timestamps: dict[TopicPartition, int]) -> dict[TopicPartition, Any]:
        return {}

    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: int = 0
    ) -> dict[TopicPartition, list[Any]]:
        """Two offsets a fetch (records, or markers that give none), until ``stop_at``."""
        self.fetches += 1
        got = []
        for _ in range(2):
            if self.stop_at is not None and self.at >= self.stop_at:
                break
            if self.at in self.records:
                got.append(Record(self.at))
            self.at += 1
        return {TP: got} if got else {}

    async def stop(self) -> None: ...


async def offsets(partition: Partition, start: int, end: int, *, idle: float = 1.0) -> list[int]:
    return [record.offset async for record in read_range(partition, TP, start, end, idle=idle)]


async def test_the_records_from_start_to_end_are_given_and_nothing_past_it() -> None:
    """Offsets 3 to 8 (exclusive) of a partition with records everywhere: 3..7, read from a seek to 3."""
    partition = Partition(records=set(range(20)))
    assert await offsets(partition, 3, 8) == [3, 4, 5, 6, 7]
    assert partition.seeks == [3]


async def test_markers_before_the_end_move_the_position_and_end_the_read() -> None:
    """A range whose last offsets are transaction markers (no record): the read ends once the position is past."""
    partition = Partition(records={0, 1, 4})
    assert await offsets(partition, 0, 7) == [0, 1, 4]


async def test_an_empty_range_reads_nothing() -> None:
    """start at or past end: no seek, no fetch."""
    partition = Partition(records={0})
    assert await offsets(partition, 5, 5) == []
    assert (partition.seeks, partition.fetches) == ([], 0)


async def test_a_partition_that_stops_short_of_its_end_raises_naming_how_far_it_got() -> None:
    """The broker away at offset 4 of 9: the records before it are given, then ReadIncompleteError names the
    partition, its position and its end; it is never taken for the end (a redrive would skip the rest)."""
    partition = Partition(records=set(range(20)), stop_at=4)
    got: list[int] = []

    async def read() -> None:
        async for record in read_range(partition, TP, 0, 9, idle=0.05):
            got.append(record.offset)  # noqa: PERF401 (one by one: those given before the raise count)

    with pytest.raises(ReadIncompleteError) as caught:
        await read()
    assert got == [0, 1, 2, 3]
    assert caught.value.short == {2: (4, 9)}
    assert str(caught.value).startswith(
        "reading shop.dlq stopped short of its end: partition 2 at offset 4 of 9"
    )
