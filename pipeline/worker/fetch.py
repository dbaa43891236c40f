"""The worker loop's fetch: it waits for records, or until it is woken, and is never cancelled.

The loop waits in a fetch whenever it has nothing to handle. Three things cut that
wait short (:meth:`LoopFetch.wake`): a partition's commit ended (the records held for
it can be handled now), the worker is asked to stop, or it failed. aiokafka's
``getmany`` is not cancel-safe (its ``fetch_context`` keeps its fetch count raised
when cancelled, and that count drives ``max_poll_interval_ms``), so a fetch cut
short is not cancelled: it stays pending, and a later call takes what it returns.
aiokafka hands records out only as ``getmany`` returns, so nothing is taken before then.

A fetch that returned while the loop was busy is kept until the loop asks: when a partition is
moved meanwhile (a seek after an aborted transaction), what the fetch holds of it is stale and
:meth:`LoopFetch.forget` drops it. aiokafka itself drops what it fetched before a seek and had
not handed out yet, so this is the one place stale records are dropped.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

Batches = dict[TopicPartition, list[Any]]


class LoopFetch:
    """One fetch at a time from the group consumer, woken early on request."""

    def __init__(self, *, max_records: int) -> None:
        self.max_records = max_records
        self._woken = asyncio.Event()
        self._pending: asyncio.Future[Batches] | None = None

    def wake(self) -> None:
        """End the current wait now (or the next one at once, if none is waiting)."""
        self._woken.set()

    def forget(self, tp: TopicPartition) -> None:
        """``tp`` was moved: drop what a fetch that already returned holds of it (one still waiting
        gets only records from the new position: aiokafka drops the older ones)."""
        fetch = self._pending
        if fetch is not None and fetch.done() and not fetch.cancelled() and fetch.exception() is None:
            fetch.result().pop(tp, None)

    async def next(self, consumer: AIOKafkaConsumer, wait_ms: int, *, hurry: bool = False) -> Batches:
        """Records fetched within ``wait_ms`` (or until woken).

        With ``wait_ms`` 0 or ``hurry``, it does not wait: a pending fetch that has not
        returned yet gives nothing this time.
        """
        self._woken.clear()
        hurry = hurry or wait_ms == 0
        if self._pending is None:
            if hurry:
                batches: Batches = await consumer.getmany(timeout_ms=0, max_records=self.max_records)
                return batches
            self._pending = asyncio.ensure_future(
                consumer.getmany(timeout_ms=wait_ms, max_records=self.max_records)
            )
        fetch = self._pending
        if not fetch.done() and not hurry:
            woken = asyncio.ensure_future(self._woken.wait())
            try:
                await asyncio.wait((fetch, woken), return_when=asyncio.FIRST_COMPLETED)
            finally:
                woken.cancel()
        if not fetch.done():
            return {}
        self._pending = None
        return fetch.result()

    async def close(self) -> None:
        """Drop a pending fetch (the consumer is stopping: what it held is fetched again by the next owner)."""
        fetch, self._pending = self._pending, None
        if fetch is None:
            return
        fetch.cancel()
        await asyncio.gather(fetch, return_exceptions=True)
