"""Bringing a store level with its changelog: a restore (before a partition is served), and a
standby's catch-up rounds; both go through the worker's one :class:`Restorer` (one reader, one
budget) and replay through :class:`~pipeline.state.replay.Replay`.

The store is a cache of its changelog: a store whose position lies beyond the
changelog's end caches another log (:class:`~pipeline.errors.StoreStaleError`;
the caller rebuilds it); one that passes the check is marked ``checked``, so its
worker may claim its position in the group. Restores and standbys share a
:class:`RestoreBudget` in bytes, so a worker given many partitions at once does
not fetch for all of them at once; a restore (a partition waiting to be served)
goes before a standby.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError
from prometheus_client import Gauge

from pipeline.errors import BrokerUnavailableError, RestoreIncompleteError, StoreStaleError
from pipeline.kafka.changelog import ChangelogReader
from pipeline.state.replay import WRITE_RECORDS, Replay, expires_at
from pipeline.state.store import PartitionStore

__all__ = ["WRITE_RECORDS", "RestoreBudget", "Restorer", "expires_at"]


class RestoreBudget:
    """The bytes all of a worker's restores and standbys may fetch at once.

    A restore with records to fetch holds its fetch size for its whole replay (a store level
    with its changelog holds none); a standby holds it for one
    fetch at a time, and only while no restore waits (``urgent=False``): a
    partition waiting to be served never waits behind a standby.
    """

    def __init__(self, total_bytes: int) -> None:
        self.total = total_bytes
        self._free = total_bytes
        self._urgent_waiting = 0
        self._changed = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def hold(self, size: int, *, urgent: bool = True) -> AsyncIterator[None]:
        """Wait until ``size`` bytes (at most the whole budget) are free, and hold them."""
        size = min(size, self.total)
        async with self._changed:
            if urgent:
                self._urgent_waiting += 1
                try:
                    await self._changed.wait_for(lambda: self._free >= size)
                finally:
                    self._urgent_waiting -= 1
                    self._changed.notify_all()
            else:
                await self._changed.wait_for(lambda: self._free >= size and not self._urgent_waiting)
            self._free -= size
        try:
            yield
        finally:
            async with self._changed:
                self._free += size
                self._changed.notify_all()


ReaderFactory = Callable[[], ChangelogReader]


class Restorer:
    """The worker's one restore service: every active restore and every standby round reads through its
    one :class:`~pipeline.kafka.changelog.ChangelogReader` (one client's connections) under its one
    :class:`RestoreBudget` (a restore before any standby).

    The reader starts on first use and is kept until :meth:`close`; a reader whose start failed is
    dropped, and the next call starts another (aiokafka's ``KafkaError`` reaches the caller, which
    retries).
    """

    def __init__(self, reader: ReaderFactory, budget: RestoreBudget, *, fetch_bytes: int) -> None:
        self._make_reader = reader
        self.budget = budget
        self.fetch_bytes = fetch_bytes
        self._reader: ChangelogReader | None = None
        self._lock = asyncio.Lock()

    async def reader(self) -> ChangelogReader:
        """The shared reader, started on first use."""
        async with self._lock:
            if self._reader is None:
                reader = self._make_reader()
                try:
                    await reader.start()
                except BaseException:
                    await reader.stop()
                    raise
                self._reader = reader
            return self._reader

    async def restore(
        self,
        store: PartitionStore,
        changelog: TopicPartition,
        *,
        progress_every: float = 5.0,
        remaining: Gauge | None = None,
        end: int | None = None,
    ) -> int:
        """Replay ``changelog`` from the store's offset to its log end (``end`` when already read by
        :meth:`end_of`); return the records applied.

        The end is the high watermark, not the last stable offset: a transaction still open on the
        changelog (the previous owner's, its markers on their way, or a zombie's that its next
        offset commit or the transaction timeout aborts) is waited for, so that a new owner never
        serves without claims its predecessor committed. ``remaining`` is an already labelled Gauge
        child, set to the records left. Raises :class:`BrokerUnavailableError` when the broker
        cannot be reached, :class:`StoreStaleError` when the store is ahead of the changelog, and
        :class:`RestoreIncompleteError` when the replay ended short of the end.
        """
        try:
            reader = await self.reader()
            if end is None:
                end = await reader.log_end(changelog)
            if _level(store, changelog, end):  # the budget is for fetches: a level store holds none of it
                if remaining is not None:
                    remaining.set(0)
                return 0
            async with self.budget.hold(self.fetch_bytes):
                replay = Replay(store, reader, changelog, prefetch=True)
                applied = await replay.run(end, progress_every=progress_every, remaining=remaining)
        except KafkaError as exc:
            raise BrokerUnavailableError(f"restore {changelog}: {exc!r}") from exc
        if replay.position < end:  # run returns at the end or raises: never serve a store short of it
            raise RestoreIncompleteError(
                f"restore {changelog}: the replay stopped at offset {replay.position}, short of its end {end}"
            )
        store.expire()
        if remaining is not None:
            remaining.set(0)
        return applied

    async def end_of(self, store: PartitionStore, changelog: TopicPartition) -> int:
        """``changelog``'s log end, checked against the store's position (a restore replays up to it).

        Raises :class:`StoreStaleError` when the store is ahead of the changelog, and
        :class:`BrokerUnavailableError` when the broker cannot be reached.
        """
        try:
            end = await (await self.reader()).log_end(changelog)
        except KafkaError as exc:
            raise BrokerUnavailableError(f"restore {changelog}: {exc!r}") from exc
        _level(store, changelog, end)
        return end

    async def catch_up(self, store: PartitionStore, changelog: TopicPartition) -> tuple[int, int]:
        """One round of a standby: replay ``changelog`` from the store's offset to the end it has now
        (the last stable offset); return (records applied, that end).

        Each fetch holds the reader's fetch size of the budget, behind any restore. A store past the
        stable end is held to the log end: its last commit went through and the markers are on their
        way (the active applies its store once ``EndTxn`` returns, before the coordinator writes them),
        so there is nothing to replay yet. Raises :class:`StoreStaleError` when the store is beyond
        the log end (a cache of another log), and aiokafka's ``KafkaError`` when the broker cannot be
        reached (the standby tries again later).
        """
        reader = await self.reader()
        end = await reader.end(changelog)
        held = await _held_end(reader, changelog, store.changelog_offset, end)
        if _level(store, changelog, held) or held > end:  # past the stable end: nothing to replay yet
            return 0, end
        replay = Replay(store, reader, changelog, prefetch=False, quiet=True)
        budget = self.budget
        applied = await replay.run(end, hold=lambda: budget.hold(reader.fetch_bytes, urgent=False))
        store.expire()
        return applied, end

    async def held_ends(self, positions: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        """The end each changelog holds a store at ``positions[changelog]`` to (the worker's start-up scan of its
        stores on disk): its last stable offset, or its log end for a store at or past it, as a standby's round
        holds it. One ListOffsets for all, one more for each store past its stable end. Raises aiokafka's
        ``KafkaError`` when the broker cannot be reached.
        """
        reader = await self.reader()
        ends = await reader.ends(positions)
        return {tp: await _held_end(reader, tp, positions[tp], end) for tp, end in ends.items()}

    async def close(self) -> None:
        """Stop the shared reader."""
        async with self._lock:
            reader, self._reader = self._reader, None
        if reader is not None:
            await reader.stop()


async def _held_end(reader: ChangelogReader, changelog: TopicPartition, offset: int, stable: int) -> int:
    """The end a store at changelog ``offset`` is held to: the last stable offset ``stable`` when the store is
    before it, else the log end (the store's last commit went through, its markers may be on their way)."""
    return stable if offset < stable else await reader.log_end(changelog)


def _level(store: PartitionStore, changelog: TopicPartition, end: int) -> bool:
    """Whether the store has everything up to ``end``; raises :class:`StoreStaleError` if it is beyond it
    (otherwise the store's position is checked: ``store.checked``)."""
    start = store.changelog_offset + 1
    if start > end:
        raise StoreStaleError(
            f"store {store.path} is at changelog offset {start - 1}, beyond the end of "
            f"{changelog.topic}-{changelog.partition} ({end}): it caches another log"
        )
    store.checked = True
    return start == end
