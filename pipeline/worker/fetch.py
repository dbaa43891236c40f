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
import contextlib
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

Batches = dict[TopicPartition, list[Any]]
#: A gathering fetch takes what aiokafka holds this often (seconds): aiokafka fetches a partition
#: again only once what it held of it was handed out
GATHER_STEP = 0.005


class LoopFetch:
    """One fetch at a time from the group consumer, woken early on request."""

    def __init__(self, *, max_records: int) -> None:
        self.max_records = max_records
        self._woken = asyncio.Event()
        self._pending: asyncio.Future[Batches] | None = None
        self._gathered: Batches = {}

    def wake(self) -> None:
        """End the current wait now (or the next one at once, if none is waiting)."""
        self._woken.set()

    def forget(self, tp: TopicPartition) -> None:
        """``tp`` was moved: drop what a fetch that already returned holds of it (one still waiting
        gets only records from the new position: aiokafka drops the older ones)."""
        fetch = self._pending
        if fetch is not None and fetch.done() and not fetch.cancelled() and fetch.exception() is None:
            fetch.result().pop(tp, None)
        self._gathered.pop(tp, None)  # a gather under way: what it took of tp before the move

    async def next(
        self, consumer: AIOKafkaConsumer, wait_ms: int, *, hurry: bool = False, gather: bool = False
    ) -> Batches:
        """Records fetched within ``wait_ms`` (or until woken).

        With ``wait_ms`` 0 or ``hurry``, it does not wait: a pending fetch that has not
        returned yet gives nothing this time. With ``gather`` (and no fetch pending), it takes
        every record fetched within ``wait_ms`` and hands them out at its end, together.
        """
        self._woken.clear()
        if gather and wait_ms > 0 and self._pending is None:
            return await self._gather(consumer, wait_ms)
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

    async def _gather(self, consumer: AIOKafkaConsumer, wait_ms: int) -> Batches:
        """Every record fetched within ``wait_ms`` (or until woken), in one answer. aiokafka fetches a
        partition again only once what it holds of it was handed out, so what it holds is taken every
        :data:`GATHER_STEP` (a ``getmany`` that does not wait) and merged in order: a few calls per
        linger instead of a loop cycle per record, which at 1,000 events/s is most of the worker's CPU."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        merged: Batches = {}
        self._gathered = merged
        taken = 0
        while taken < self.max_records:
            left = deadline - loop.time()
            if left > 0 and not self._woken.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._woken.wait(), min(GATHER_STEP, left))
            got: Batches = await consumer.getmany(timeout_ms=0, max_records=self.max_records - taken)
            for tp, records in got.items():
                merged.setdefault(tp, []).extend(records)
                taken += len(records)
            if loop.time() >= deadline or self._woken.is_set():
                break
        self._gathered = {}
        return merged

    async def close(self) -> None:
        """Drop a pending fetch (the consumer is stopping: what it held is fetched again by the next owner)."""
        fetch, self._pending = self._pending, None
        if fetch is None:
            return
        fetch.cancel()
        await asyncio.gather(fetch, return_exceptions=True)
