"""The worker loop's fetch: it waits for records, or until it is woken, and is never cancelled.

The loop waits in a fetch whenever it has nothing to handle. Three things cut that
wait short (:meth:`LoopFetch.wake`): a partition's commit ended (the records held for
it can be handled now), the worker is asked to stop, or it failed. aiokafka's
``getmany`` is not cancel-safe (its ``fetch_context`` keeps its fetch count raised
when cancelled, and that count drives ``max_poll_interval_ms``), so a fetch cut
short is not cancelled: it stays pending, and a later call takes what it returns.
aiokafka hands records out only as ``getmany`` returns, so nothing is taken before then.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from aiokafka import AIOKafkaConsumer, TopicPartition

Batches = dict[TopicPartition, list[Any]]
_Snapshot = TypeVar("_Snapshot")


class LoopFetch(Generic[_Snapshot]):
    """One fetch at a time from the group consumer, woken early on request.

    Each result comes with the ``snapshot`` taken when its fetch began (the loop's
    partitions and their generations), so the loop can tell records that went stale
    while the fetch waited.
    """

    def __init__(self, *, max_records: int, snapshot: Callable[[], _Snapshot]) -> None:
        self.max_records = max_records
        self._snapshot = snapshot
        self._woken = asyncio.Event()
        self._pending: tuple[asyncio.Future[Batches], _Snapshot] | None = None

    def wake(self) -> None:
        """End the current wait now (or the next one at once, if none is waiting)."""
        self._woken.set()

    async def next(
        self, consumer: AIOKafkaConsumer, wait_ms: int, *, hurry: bool = False
    ) -> tuple[Batches, _Snapshot]:
        """Records fetched within ``wait_ms`` (or until woken), and the snapshot from the fetch's start.

        With ``wait_ms`` 0 or ``hurry``, it does not wait: a pending fetch that has not
        returned yet gives nothing this time.
        """
        self._woken.clear()
        hurry = hurry or wait_ms == 0
        if self._pending is None:
            began = self._snapshot()
            if hurry:
                batches: Batches = await consumer.getmany(timeout_ms=0, max_records=self.max_records)
                return batches, began
            task = asyncio.ensure_future(consumer.getmany(timeout_ms=wait_ms, max_records=self.max_records))
            self._pending = (task, began)
        fetch, began = self._pending
        if not fetch.done() and not hurry:
            woken = asyncio.ensure_future(self._woken.wait())
            try:
                await asyncio.wait((fetch, woken), return_when=asyncio.FIRST_COMPLETED)
            finally:
                woken.cancel()
        if not fetch.done():
            return {}, began
        self._pending = None
        return fetch.result(), began

    async def close(self) -> None:
        """Drop a pending fetch (the consumer is stopping: what it held is fetched again by the next owner)."""
        if self._pending is None:
            return
        fetch, _ = self._pending
        self._pending = None
        fetch.cancel()
        await asyncio.gather(fetch, return_exceptions=True)
