"""A bounded read: every partition of a topic from its start up to the end it had when the read began.

The tools that read a whole topic once (``pipeline dlq list`` and ``dlq replay``,
the console's DLQ page and its redrives) read the end offsets first and then
read each partition until its position reaches that end, as ``kcat -e`` does;
never until the records stop coming for a while, which a leader election or a
broker restart makes look like the end. The consumer is ``read_committed``, so
the end is the last stable offset and everything before it is decided: a
partition short of its end and not moving means the broker is away.

A read that stops moving is retried: after a Kafka error, or after
:data:`RECONNECT_AFTER` seconds without a partition moving, the consumer is
closed and a new one takes over from the positions reached, with a backoff
between attempts. Each record is given once, even across such reconnects. When
no partition moves for ``timeout`` seconds the read raises
:class:`ReadIncompleteError` naming each partition short of its end.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from pipeline.errors import BrokerUnavailableError, PipelineError
from pipeline.kafka.internals import stop_consumer
from pipeline.kafka.settings import READ_TIMEOUT_S

T = TypeVar("T")

#: A consumer that has not moved for this long (the read not yet done) is replaced by a new one.
RECONNECT_AFTER = 10.0
FIRST_BACKOFF, MAX_BACKOFF = 0.25, 5.0
FETCH_WAIT_MS = 500


class Reader(Protocol):
    """The part of a group-less consumer (aiokafka's ``AIOKafkaConsumer``) a bounded read uses."""

    def assign(self, partitions: list[TopicPartition]) -> None: ...

    def seek(self, partition: TopicPartition, offset: int) -> None: ...

    async def seek_to_beginning(self, *partitions: TopicPartition) -> Any: ...

    async def position(self, partition: TopicPartition) -> int: ...

    async def end_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]: ...

    async def offsets_for_times(self, timestamps: dict[TopicPartition, int]) -> dict[TopicPartition, Any]: ...

    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: int = 0
    ) -> dict[TopicPartition, list[Any]]: ...

    async def stop(self) -> None: ...


class ReadIncompleteError(PipelineError):
    """A bounded read gave up short of the end: no partition moved for its timeout."""

    retriable = True
    reason = "read-incomplete"

    def __init__(
        self, topic: str, short: dict[int, tuple[int, int]], waited: float, cause: str | None
    ) -> None:
        self.topic = topic
        self.short = short  # partition -> (offset reached, end); empty when the ends were never read
        if short:
            parts = ", ".join(
                f"partition {p} at offset {at} of {end}" for p, (at, end) in sorted(short.items())
            )
            where = f"stopped short of its end: {parts} (every other partition reached its end)"
        else:
            where = "could not read its end offsets"
        because = f"; last error: {cause}" if cause else ""
        super().__init__(f"reading {topic} {where}, after {waited:g}s without progress{because}")


@dataclass
class Bounds:
    """Where a bounded read starts, ends and stands, per partition (filled in once the read begins)."""

    starts: dict[TopicPartition, int] = field(default_factory=dict)
    ends: dict[TopicPartition, int] = field(default_factory=dict)
    positions: dict[TopicPartition, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """Offsets to read, over every partition."""
        return sum(max(self.ends[tp] - self.starts[tp], 0) for tp in self.ends)

    @property
    def read(self) -> int:
        """Offsets read so far, over every partition."""
        return sum(min(self.positions[tp], self.ends[tp]) - self.starts[tp] for tp in self.ends)

    def left(self) -> list[TopicPartition]:
        """The partitions whose position has not reached their end."""
        return [tp for tp, end in self.ends.items() if self.positions[tp] < end]


async def read_to_end(
    connect: Callable[[], Awaitable[Reader]],
    partitions: Sequence[TopicPartition],
    bounds: Bounds,
    *,
    since_ms: int | None = None,
    timeout: float = READ_TIMEOUT_S,
    clock: Callable[[], float] | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> AsyncGenerator[list[Any], None]:
    """The records of ``partitions`` from the beginning (or the first at or after ``since_ms``) up
    to the ends read first, one list per fetch that gave any; ``bounds`` shows the progress.

    ``connect`` makes a started consumer (called again after a failure). Raises
    :class:`ReadIncompleteError` when no partition moves for ``timeout`` seconds. Close the
    iterator (``contextlib.aclosing``) when stopping before its end.
    """
    clock = clock or time.monotonic
    consumer: Reader | None = None
    moved_at = connected_at = clock()
    backoff = FIRST_BACKOFF
    cause: str | None = None
    try:
        while True:
            try:
                if consumer is None:
                    consumer = await _bounded(connect(), moved_at + timeout - clock())
                    connected_at = clock()
                    await _bounded(
                        _place(consumer, partitions, bounds, since_ms), moved_at + timeout - clock()
                    )
                left = bounds.left()
                if not left:
                    return
                got, moved = await _fetch(consumer, left, bounds, moved_at + timeout - clock())
                if got:
                    yield got
                if moved:
                    moved_at, backoff, cause = clock(), FIRST_BACKOFF, None
                elif clock() - max(moved_at, connected_at) >= RECONNECT_AFTER:
                    await _closed(consumer)
                    consumer = None
            except (KafkaError, BrokerUnavailableError, TimeoutError) as exc:
                cause = _named(exc)
                await _closed(consumer)
                consumer = None
                await sleep(min(backoff, max(moved_at + timeout - clock(), 0)))
                backoff = min(backoff * 2, MAX_BACKOFF)
            if clock() - moved_at >= timeout:
                topic = partitions[0].topic if partitions else "?"
                short = {tp.partition: (bounds.positions[tp], bounds.ends[tp]) for tp in bounds.left()}
                raise ReadIncompleteError(topic, short, round(clock() - moved_at, 1), cause)
    finally:
        await _closed(consumer)


async def _place(
    consumer: Reader, partitions: Sequence[TopicPartition], bounds: Bounds, since_ms: int | None
) -> None:
    """Assign ``partitions``; the first time read the starts and ends, after a reconnect seek back to
    the positions reached."""
    consumer.assign(list(partitions))
    if bounds.ends:
        for tp in bounds.left():
            consumer.seek(tp, bounds.positions[tp])
        return
    ends = await consumer.end_offsets(list(partitions))
    await consumer.seek_to_beginning(*partitions)
    starts = {tp: await consumer.position(tp) for tp in partitions}
    if since_ms is not None:
        found = await consumer.offsets_for_times(dict.fromkeys(partitions, since_ms))
        for tp in partitions:
            at = found.get(tp)
            starts[tp] = min(at.offset, ends[tp]) if at is not None else ends[tp]
            consumer.seek(tp, starts[tp])
    bounds.starts = starts
    bounds.positions = dict(starts)
    bounds.ends = {tp: int(ends[tp]) for tp in partitions}


async def _fetch(
    consumer: Reader, left: list[TopicPartition], bounds: Bounds, within: float
) -> tuple[list[Any], bool]:
    """One fetch: the records before each partition's end not given yet, and whether any position moved."""
    batch = await consumer.getmany(*left, timeout_ms=FETCH_WAIT_MS)
    got: list[Any] = []
    moved = False
    for tp, records in batch.items():
        end = bounds.ends[tp]
        for record in records:
            if record.offset >= end:
                break
            if record.offset < bounds.positions[tp]:
                continue  # given before a reconnect
            bounds.positions[tp] = record.offset + 1
            got.append(record)
            moved = True
    for tp in left:  # past transaction markers and aborted records, which give no record
        try:
            position = await _bounded(consumer.position(tp), within)
        except (KafkaError, TimeoutError):
            if got:  # the positions already stand past these records: give them, or they are lost
                return got, moved  # (the next fetch meets the failure again, if it lasts)
            raise
        if position > bounds.positions[tp]:
            bounds.positions[tp] = min(position, bounds.ends[tp])
            moved = True
    return got, moved


def _named(exc: BaseException) -> str:
    """``exc`` as a line naming its type once (a KafkaError's own text starts with its type)."""
    text = str(exc)
    if not text:
        return type(exc).__name__
    return text if isinstance(exc, KafkaError) else f"{type(exc).__name__}: {text}"


async def _bounded(awaitable: Awaitable[T], seconds: float) -> T:
    """``awaitable`` within ``seconds`` (at least one: a request needs a moment); TimeoutError after."""
    async with asyncio.timeout(max(seconds, 1.0)):
        return await awaitable


async def _closed(consumer: Reader | None) -> None:
    """Stop ``consumer``: a failing stop is no reason to fail the read."""
    if consumer is not None:
        with contextlib.suppress(KafkaError, OSError):
            await stop_consumer(consumer)  # aiokafka lets a CancelledError out when the broker is away
