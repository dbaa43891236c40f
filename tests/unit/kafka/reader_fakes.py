"""A stand-in for a group-less read_committed consumer over scripted partitions: no broker.

:class:`Partitions` holds what the "broker" has (records at offsets, each partition's end,
transaction markers where an offset holds no record) and how it misbehaves: fetches that
give nothing before some offset for a while (``pauses``), partitions that never give their
records past an offset (``reachable``), errors the next fetches raise (``failures``), errors
the next positions asked after a fetch raise (``position_failures``), errors the next stops
raise (``stop_failures``), ends that moved on after the read asked for them (``first_ends``),
and consumers that forget where they were sent (``ignore_seeks``). :class:`FakeReader` is one
consumer over it; :meth:`Partitions.connect` makes a new one, as a reconnect does. An empty
fetch moves the shared :class:`FakeClock` by its wait.
"""

from __future__ import annotations

import asyncio
import base64
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord, OffsetAndTimestamp

PER_FETCH = 2  # records a fetch gives per partition
RUNAWAY = (
    10_000  # fetches, over every consumer of a broker, after which a read is taken for one that never ends
)


@dataclass
class FakeClock:
    """A monotonic clock the fakes move: ``time.monotonic``'s stand-in."""

    now: float = 1000.0

    def monotonic(self) -> float:
        return self.now


def dlq_value(input_topic: str, partition: int, offset: int, key: str) -> bytes:
    """A DLQ record of an input record that ``pipeline dlq replay`` can rebuild."""
    return orjson.dumps(
        {
            "error": "no such source",
            "reason": "unknown-source",
            "topic": input_topic,
            "partition": partition,
            "offset": offset,
            "timestamp": 1_700_000_000_000 + offset,
            "key": key,
            "headers": {"source": "shopify"},
            "headers_base64": [["source", base64.b64encode(b"shopify").decode()]],
            "value": "{}",
            "value_base64": base64.b64encode(b"{}").decode(),
        }
    )


@dataclass
class Partitions:
    """The partitions of one topic as the broker holds them, and the faults it shows."""

    topic: str
    records: dict[int, dict[int, ConsumerRecord[bytes, bytes]]]  # partition -> offset -> record
    ends: dict[int, int]  # the last stable offset of each partition
    clock: FakeClock = field(default_factory=FakeClock)
    pauses: dict[tuple[int, int], int] = field(default_factory=dict)  # (partition, offset) -> empty fetches
    reachable: dict[int, int] = field(default_factory=dict)  # partition -> first offset never given
    failures: list[Exception] = field(default_factory=list)  # raised by the next fetches, in order
    position_failures: list[Exception] = field(
        default_factory=list
    )  # raised by the next positions after a fetch
    stop_failures: list[BaseException] = field(default_factory=list)  # raised by the next stops, in order
    first_ends: dict[int, int] | None = None  # what end_offsets answers, when the ends have moved on since
    ignore_seeks: bool = False  # the consumers read on from where they are, wherever they are sent
    connects: int = 0
    fetches: int = 0
    readers: list[FakeReader] = field(default_factory=list)

    @classmethod
    def of(
        cls, topic: str, counts: dict[int, int], *, marker: bool = True, input_topic: str = "in"
    ) -> Partitions:
        """``counts[p]`` DLQ records on partition ``p`` at offsets 0.., each followed by a transaction
        marker at the end when ``marker``."""
        records = {
            p: {
                o: _record(topic, p, o, dlq_value(input_topic, p, o, f"shopify:{p}-{o}"), f"shopify:{p}-{o}")
                for o in range(n)
            }
            for p, n in counts.items()
        }
        return cls(topic, records, {p: n + (1 if marker and n else 0) for p, n in counts.items()})

    async def connect(self) -> FakeReader:
        """A new consumer, as ``started_reader`` makes one."""
        self.connects += 1
        reader = FakeReader(self)
        self.readers.append(reader)
        return reader


def _record(topic: str, partition: int, offset: int, value: bytes, key: str) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord(
        topic=topic,
        partition=partition,
        offset=offset,
        timestamp=1_700_000_000_000 + offset,
        timestamp_type=0,
        key=key.encode(),
        value=value,
        checksum=None,
        serialized_key_size=len(key),
        serialized_value_size=len(value),
        headers=[],
    )


class FakeReader:
    """One group-less consumer over :class:`Partitions` (the ``Reader`` a bounded read uses)."""

    def __init__(self, broker: Partitions) -> None:
        self.broker = broker
        self.positions: dict[TopicPartition, int] = {}
        self.stopped = False
        self.fetches = 0
        self.seeks: list[tuple[TopicPartition, int]] = []

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.positions = dict.fromkeys(partitions, 0)

    def seek(self, partition: TopicPartition, offset: int) -> None:
        self.seeks.append((partition, offset))
        if not self.broker.ignore_seeks:
            self.positions[partition] = offset

    async def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        for tp in partitions:
            self.positions[tp] = 0

    async def position(self, partition: TopicPartition) -> int:
        if self.fetches and self.broker.position_failures:
            raise self.broker.position_failures.pop(0)
        return self.positions[partition]

    async def end_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        ends = self.broker.ends if self.broker.first_ends is None else self.broker.first_ends
        return {tp: ends[tp.partition] for tp in partitions}

    async def offsets_for_times(self, timestamps: dict[TopicPartition, int]) -> dict[TopicPartition, Any]:
        found: dict[TopicPartition, Any] = {}
        for tp, at in timestamps.items():
            held = sorted(self.broker.records[tp.partition].values(), key=lambda r: r.offset)
            first = next((r for r in held if r.timestamp >= at), None)
            found[tp] = None if first is None else OffsetAndTimestamp(first.offset, first.timestamp)
        return found

    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: int = 0
    ) -> dict[TopicPartition, list[Any]]:
        broker = self.broker
        if self.stopped:
            raise RuntimeError("fetch on a stopped consumer")
        self.fetches += 1
        broker.fetches += 1
        assert broker.fetches < RUNAWAY, "a read that never ends"
        await asyncio.sleep(0)
        if broker.failures:
            raise broker.failures.pop(0)
        got: dict[TopicPartition, list[Any]] = {}
        for tp in partitions:
            records = self._take(tp)
            if records:
                got[tp] = records
        if not got:
            broker.clock.now += timeout_ms / 1000
        return got

    def _take(self, tp: TopicPartition) -> list[Any]:
        """Up to :data:`PER_FETCH` records from the position, unless paused or out of reach; past a marker."""
        broker, p = self.broker, tp.partition
        position = self.positions[tp]
        reach = min(broker.reachable.get(p, broker.ends[p]), broker.ends[p])
        if position >= reach:
            return []
        waiting = broker.pauses.get((p, position), 0)
        if waiting:
            broker.pauses[(p, position)] = waiting - 1
            return []
        held = broker.records[p]
        taken: list[Any] = []
        while position < reach and len(taken) < PER_FETCH:
            if position in held:
                taken.append(held[position])
            position += 1  # an offset without a record is a transaction marker: the position moves past it
        self.positions[tp] = position
        return taken

    async def stop(self) -> None:
        self.stopped = True
        if self.broker.stop_failures:
            raise self.broker.stop_failures.pop(0)
