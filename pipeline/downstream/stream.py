"""An async iterator of typed commands from a read_committed consumer, with either offset policy.

    async with CommandStream(bootstrap, ["shop.orders"], group="orders") as commands:
        async for command in commands:
            await apply_once_async(conn, command, handler, service="orders")

A command is *done* once the loop body that received it has returned, that is
when the iterator is asked for the next one; only done commands' offsets are
ever committed or counted as processed. Two offset policies:

- ``offsets=None`` (a, the default): offsets are committed to Kafka, for done
  commands only, every ``commit_every`` commands or ``commit_interval``
  seconds, when idle, before a partition is revoked and on exit. The body must
  have committed its database transaction before it returns (``apply_once``
  on an idle connection does).
- ``offsets=PostgresOffsets(dsn, service=...)`` (b): nothing is committed to
  Kafka; the body stores each command's next offset in the effect's own
  transaction (``apply_once_async(..., store_offset=True)``) and on every
  assignment the stream seeks to the stored offsets.

Either way delivery is at least once; apply-once makes it effectively once.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from types import TracebackType
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, KafkaError, RebalanceInProgressError

from pipeline.downstream.commands import Command, CommandRecordError, KafkaRecord, consumer_settings
from pipeline.errors import ConfigError
from pipeline.kafka.internals import stop_consumer

__all__ = ["CommandStream", "OffsetStore"]

log = logging.getLogger(__name__)


class OffsetStore(Protocol):
    """Where a service keeps its offsets instead of Kafka (policy b); :class:`PostgresOffsets` is one."""

    async def load(self, partitions: Collection[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The stored next offset of each ``(topic, partition)`` that has one."""
        ...


InvalidHook = Callable[[KafkaRecord, CommandRecordError], None]


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, stream: CommandStream) -> None:
        self.stream = stream

    async def on_partitions_revoked(self, revoked: Collection[TopicPartition]) -> None:
        await self.stream.partitions_revoked(revoked)

    async def on_partitions_assigned(self, assigned: Collection[TopicPartition]) -> None:
        await self.stream.partitions_assigned(assigned)


class CommandStream:
    """Typed :class:`Command` s from ``topics``, read_committed, for one consumer group.

    A record that does not match the contract is logged, passed to
    ``on_invalid`` (send it to your own dead-letter topic there), counted in
    :attr:`invalid` and skipped. ``idle_timeout`` ends the iteration after that
    many seconds without a record while partitions are assigned (``None``:
    never). ``consumer_options`` override or add aiokafka consumer settings
    (the read_committed isolation level and manual commits cannot be changed).
    """

    def __init__(
        self,
        bootstrap: str,
        topics: Sequence[str],
        *,
        group: str,
        offsets: OffsetStore | None = None,
        commit_every: int = 500,
        commit_interval: float = 1.0,
        idle_timeout: float | None = None,
        max_records: int = 500,
        on_invalid: InvalidHook | None = None,
        consumer_options: Mapping[str, Any] | None = None,
    ) -> None:
        if not topics:
            raise ConfigError("CommandStream needs at least one command topic")
        if not group:
            raise ConfigError("CommandStream needs a consumer group (one per downstream service)")
        settings = {**consumer_settings(bootstrap, group), **(consumer_options or {})}
        for name, required in (("isolation_level", "read_committed"), ("enable_auto_commit", False)):
            if settings[name] != required:
                raise ConfigError(f"a command consumer needs {name}={required!r}, got {settings[name]!r}")
        self.topics = list(topics)
        self.group = group
        self.offsets = offsets
        self.commit_every = max(1, commit_every)
        self.commit_interval = commit_interval
        self.idle_timeout = idle_timeout
        self.max_records = max_records
        self.on_invalid = on_invalid
        self.consumer = AIOKafkaConsumer(**settings)
        self.seen = 0
        self.invalid = 0
        self.committed = 0
        self._buffer: collections.deque[Any] = collections.deque()
        self._current: tuple[TopicPartition, int, int] | None = None  # (tp, next offset, generation)
        self._done: dict[TopicPartition, int] = {}
        self._since_commit = 0
        self._last_commit = time.monotonic()
        self._generation = 0
        self._started = False
        # per partition, the lowest offset still to deliver: records below it were fetched before a
        # seek to stored offsets (aiokafka can hand them out), or are re-fetched after one
        self._next: dict[TopicPartition, int] = {}
        self._assign_error: BaseException | None = None
        # policy b: cleared from a revocation until the stored offsets of the new assignment are sought
        # to; nothing is delivered meanwhile (aiokafka may hand out records fetched from elsewhere)
        self._positions_ready = asyncio.Event()
        self._positions_ready.set()

    @property
    def stores_offsets_in_kafka(self) -> bool:
        """Policy (a): offsets of done commands are committed to Kafka."""
        return self.offsets is None

    async def start(self) -> None:
        """Subscribe and start the consumer."""
        self.consumer.subscribe(self.topics, listener=_Listener(self))
        await self.consumer.start()
        self._started = True

    async def stop(self) -> None:
        """Commit what is done (policy a) and stop the consumer."""
        if not self._started:
            return
        self._started = False
        try:
            await self.commit()
        finally:
            await stop_consumer(self.consumer)

    async def __aenter__(self) -> CommandStream:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # the command whose body raised is not done (it was never marked); the earlier ones are
        await self.stop()

    def __aiter__(self) -> CommandStream:
        return self

    async def __anext__(self) -> Command:
        self._mark_current_done()
        if self._since_commit >= self.commit_every or (
            self._done and time.monotonic() - self._last_commit >= self.commit_interval
        ):
            await self.commit()
        idle_since: float | None = None
        while True:
            if self._assign_error is not None:
                error, self._assign_error = self._assign_error, None
                raise ConfigError(f"could not load the stored offsets of assigned partitions: {error!r}")
            if not self._positions_ready.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._positions_ready.wait(), self.commit_interval)
                continue
            while self._buffer:
                record = self._buffer.popleft()
                tp = TopicPartition(record.topic, record.partition)
                if record.offset < self._next.get(tp, 0):
                    continue
                self._next[tp] = record.offset + 1
                command = self._parse(record)
                if command is None:
                    self._record_done(tp, record.offset + 1)
                    continue
                self.seen += 1
                self._current = (tp, record.offset + 1, self._generation)
                return command
            batch = await self.consumer.getmany(
                timeout_ms=int(self.commit_interval * 1000), max_records=self.max_records
            )
            for records in batch.values():
                self._buffer.extend(records)
            if self._buffer:
                continue
            if self._done:
                await self.commit()  # idle: nothing to wait for
            if self.idle_timeout is not None and self.consumer.assignment():
                now = time.monotonic()
                idle_since = idle_since or now
                if now - idle_since >= self.idle_timeout:
                    raise StopAsyncIteration

    def _parse(self, record: Any) -> Command | None:
        try:
            return Command.from_consumer_record(record)
        except CommandRecordError as exc:
            self.invalid += 1
            log.warning(
                "skipping an invalid command record %s[%s]@%s: %s",
                record.topic,
                record.partition,
                record.offset,
                exc,
            )
            if self.on_invalid is not None:
                self.on_invalid(record, exc)
            return None

    def _mark_current_done(self) -> None:
        if self._current is None:
            return
        tp, next_offset, generation = self._current
        self._current = None
        if generation == self._generation:  # its partition was not revoked while the body ran
            self._record_done(tp, next_offset)

    def _record_done(self, tp: TopicPartition, next_offset: int) -> None:
        self._done[tp] = max(next_offset, self._done.get(tp, 0))
        self._since_commit += 1

    async def commit(self, partitions: Collection[TopicPartition] | None = None) -> None:
        """Commit the offsets of done commands to Kafka now (policy a; a no-op for policy b)."""
        self._last_commit = time.monotonic()
        self._since_commit = 0
        if not self._done:
            return
        assigned = self.consumer.assignment()
        wanted = set(partitions) if partitions is not None else set(self._done)
        offsets = {tp: o for tp, o in self._done.items() if tp in wanted and tp in assigned}
        for tp in wanted:
            self._done.pop(tp, None)
        if not offsets or not self.stores_offsets_in_kafka:
            return
        try:
            await self.consumer.commit(offsets)
        except (CommitFailedError, RebalanceInProgressError) as exc:
            # The group is moving these partitions: their next owner redoes the commands, and
            # apply-once makes them repeats. Nothing is lost by going on.
            log.warning("offsets not committed during a rebalance (%r); the next owner redoes them", exc)
            return
        self.committed += len(offsets)

    async def partitions_revoked(self, revoked: Collection[TopicPartition]) -> None:
        revoked = set(revoked)
        self._generation += 1
        if self.offsets is not None:
            self._positions_ready.clear()
        for tp in revoked:
            self._next.pop(tp, None)
        self._buffer = collections.deque(
            r for r in self._buffer if TopicPartition(r.topic, r.partition) not in revoked
        )
        try:
            await self.commit(revoked)
        except KafkaError as exc:  # the next owner redoes these commands; apply-once makes them repeats
            log.warning("could not commit offsets of revoked partitions %s: %r", sorted(revoked), exc)

    async def partitions_assigned(self, assigned: Collection[TopicPartition]) -> None:
        if self.offsets is None:
            return
        try:
            stored = (
                await self.offsets.load([(tp.topic, tp.partition) for tp in assigned]) if assigned else {}
            )
        except Exception as exc:  # aiokafka logs and swallows a listener's error: hand it to __anext__
            self._assign_error = exc
            raise
        finally:
            self._positions_ready.set()
        sought = set()
        for tp in assigned:
            offset = stored.get((tp.topic, tp.partition))
            if offset is not None:
                self.consumer.seek(tp, offset)  # aiokafka drops what it fetched for tp and refetches
                self._next[tp] = offset
                sought.add(tp)
        self._buffer = collections.deque(
            r for r in self._buffer if TopicPartition(r.topic, r.partition) not in sought
        )
        log.info(
            "seeked %d of %d assigned partitions to stored offsets: %s", len(stored), len(assigned), stored
        )
