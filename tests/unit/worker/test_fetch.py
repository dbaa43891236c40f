"""The loop's fetch: woken early, never cancelling aiokafka's getmany, snapshots from each fetch's start."""

from __future__ import annotations

import asyncio
from typing import Any

from pipeline.worker.fetch import LoopFetch
from tests.unit.worker.fakes import tp


class _SlowConsumer:
    """getmany returns ``records`` once ``ready`` is set (or {} at its timeout); counts cancellations."""

    def __init__(self) -> None:
        self.ready = asyncio.Event()
        self.records: dict[Any, list[Any]] = {tp(0): ["r1", "r2"]}
        self.calls = 0
        self.cancelled = 0

    async def getmany(self, *, timeout_ms: int, max_records: int) -> dict[Any, list[Any]]:
        self.calls += 1
        if timeout_ms == 0:
            return {}
        try:
            await asyncio.wait_for(self.ready.wait(), timeout_ms / 1000)
        except TimeoutError:
            return {}
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return self.records


async def test_a_woken_fetch_stays_pending_and_a_later_call_takes_its_records() -> None:
    """wake() ends the wait with nothing; the same getmany (not a new one) later returns its records with its first snapshot."""
    generation = iter(range(10))
    fetch = LoopFetch(max_records=10, snapshot=lambda: next(generation))
    consumer = _SlowConsumer()
    waiting = asyncio.ensure_future(fetch.next(consumer, 5_000))
    await asyncio.sleep(0.01)
    fetch.wake()
    assert await asyncio.wait_for(waiting, 1) == ({}, 0)
    assert await fetch.next(consumer, 0) == ({}, 0)  # no wait: the pending fetch has not returned
    consumer.ready.set()
    assert await asyncio.wait_for(fetch.next(consumer, 5_000), 1) == ({tp(0): ["r1", "r2"]}, 0)
    assert (consumer.calls, consumer.cancelled) == (1, 0)


async def test_a_wake_before_the_wait_is_forgotten_by_the_next_fetch() -> None:
    """A wake() nobody waited for does not end the next fetch early: its records still arrive."""
    fetch = LoopFetch(max_records=10, snapshot=lambda: None)
    consumer = _SlowConsumer()
    fetch.wake()
    waiting = asyncio.ensure_future(fetch.next(consumer, 5_000))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    consumer.ready.set()
    assert await asyncio.wait_for(waiting, 1) == ({tp(0): ["r1", "r2"]}, None)


async def test_close_drops_a_pending_fetch() -> None:
    """At shutdown the pending getmany is cancelled and awaited; the next call starts a new one."""
    fetch = LoopFetch(max_records=10, snapshot=lambda: None)
    consumer = _SlowConsumer()
    waiting = asyncio.ensure_future(fetch.next(consumer, 5_000))
    await asyncio.sleep(0.01)
    fetch.wake()
    await waiting
    await fetch.close()
    assert consumer.cancelled == 1
    assert await fetch.next(consumer, 0) == ({}, None)
    assert consumer.calls == 2
