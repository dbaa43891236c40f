"""Bringing a store level with its changelog: a restore (before a partition is served), and a
standby's catch-up rounds; both replay through :class:`~pipeline.state.replay.Replay`.

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
from collections.abc import AsyncIterator

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError
from prometheus_client import Gauge

from pipeline.errors import BrokerUnavailableError, StoreStaleError
from pipeline.kafka.changelog import ChangelogReader
from pipeline.state.replay import WRITE_RECORDS, Replay, expires_at
from pipeline.state.store import PartitionStore

__all__ = ["WRITE_RECORDS", "RestoreBudget", "catch_up", "expires_at", "restore"]


class RestoreBudget:
    """The bytes all of a worker's restores and standbys may fetch at once.

    A restore holds its fetch size for its whole run; a standby holds it for one
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


async def restore(
    store: PartitionStore,
    changelog: TopicPartition,
    *,
    bootstrap: str,
    fetch_bytes: int = 32 * 1024 * 1024,
    progress_every: float = 5.0,
    remaining: Gauge | None = None,
    budget: RestoreBudget | None = None,
) -> int:
    """Replay ``changelog`` from the store's offset to its end; return the records applied.

    ``remaining`` is an already labelled Gauge child, set to the records left
    (0 at the end). Progress goes to the log every ``progress_every`` seconds
    with the rate and an ETA. Tombstones and key-less records are skipped.
    Two fetches of half of ``fetch_bytes`` are in flight: one is written while the
    next is read. Raises :class:`BrokerUnavailableError` when the broker cannot be
    reached, and :class:`StoreStaleError` when the store is ahead of the changelog.
    """
    holding = budget.hold(fetch_bytes) if budget is not None else contextlib.nullcontext()
    async with holding:
        reader = ChangelogReader(bootstrap, fetch_bytes=max(fetch_bytes // 2, 1))
        try:
            await reader.start()
            end = await reader.end(changelog)  # the last stable offset
            if _level(store, changelog, end):
                if remaining is not None:
                    remaining.set(0)
                return 0
            replay = Replay(store, reader, changelog, prefetch=True)
            applied = await replay.run(end, progress_every=progress_every, remaining=remaining)
        except KafkaError as exc:
            raise BrokerUnavailableError(f"restore {changelog}: {exc!r}") from exc
        finally:
            await reader.stop()
    store.expire()
    if remaining is not None:
        remaining.set(0)
    return applied


async def catch_up(
    store: PartitionStore,
    changelog: TopicPartition,
    *,
    reader: ChangelogReader,
    budget: RestoreBudget | None = None,
) -> tuple[int, int]:
    """One round of a standby: replay ``changelog`` from the store's offset to the end it has now,
    through an open ``reader`` shared by the worker's standbys; return (records applied, that end).

    Each fetch holds the reader's fetch size of ``budget``, behind any restore. Raises
    :class:`StoreStaleError` when the store is ahead of the changelog, and aiokafka's
    ``KafkaError`` when the broker cannot be reached (the standby tries again later).
    """
    end = await reader.end(changelog)
    if _level(store, changelog, end):
        return 0, end
    replay = Replay(store, reader, changelog, prefetch=False, quiet=True)
    hold = (lambda: budget.hold(reader.fetch_bytes, urgent=False)) if budget is not None else None
    applied = await replay.run(end, hold=hold)
    store.expire()
    return applied, end


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
