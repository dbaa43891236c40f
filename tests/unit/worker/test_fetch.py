"""The loop's fetch: woken early, never cancelling aiokafka's getmany, forgetting what a seek made stale."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline.worker import fetch as fetch_module
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
    """wake() ends the wait with nothing; the same getmany (not a new one) later returns its records."""
    fetch = LoopFetch(max_records=10)
    consumer = _SlowConsumer()
    waiting = asyncio.ensure_future(fetch.next(consumer, 5_000))
    await asyncio.sleep(0.01)
    fetch.wake()
    assert await asyncio.wait_for(waiting, 1) == {}
    assert await fetch.next(consumer, 0) == {}  # no wait: the pending fetch has not returned
    consumer.ready.set()
    assert await asyncio.wait_for(fetch.next(consumer, 5_000), 1) == {tp(0): ["r1", "r2"]}
    assert (consumer.calls, consumer.cancelled) == (1, 0)


async def test_a_wake_before_the_wait_is_forgotten_by_the_next_fetch() -> None:
    """A wake() nobody waited for does not end the next fetch early: its records still arrive."""
    fetch = LoopFetch(max_records=10)
    consumer = _SlowConsumer()
    fetch.wake()
    waiting = asyncio.ensure_future(fetch.next(consumer, 5_000))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    consumer.ready.set()
    assert await asyncio.wait_for(waiting, 1) == {tp(0): ["r1", "r2"]}


async def test_close_drops_a_pending_fetch() -> None:
    """At shutdown the pending getmany is cancelled and awaited; the next call starts a new one."""
    fetch = LoopFetch(max_records=10)
    consumer = _SlowConsumer()
    waiting = asyncio.ensure_future(fetch.next(consumer, 5_000))
    await asyncio.sleep(0.01)
    fetch.wake()
    await waiting
    await fetch.close()
    assert consumer.cancelled == 1
    assert await fetch.next(consumer, 0) == {}
    assert consumer.calls == 2


async def test_a_partition_moved_while_its_fetch_waited_unread_loses_what_that_fetch_holds_of_it() -> None:
    """A fetch returned while the loop was busy; the loop then moved partition 0 back (an aborted transaction):
    forget() drops what that fetch holds of partition 0, and keeps the others'."""
    fetch = LoopFetch(max_records=10)
    consumer = _SlowConsumer()
    consumer.records = {tp(0): ["stale"], tp(1): ["fine"]}
    waiting = asyncio.ensure_future(fetch.next(consumer, 5_000))
    await asyncio.sleep(0.01)
    fetch.wake()
    assert await waiting == {}
    consumer.ready.set()
    await asyncio.sleep(0.01)  # the pending getmany returned; nobody read it yet
    fetch.forget(tp(0))
    assert await fetch.next(consumer, 0) == {tp(1): ["fine"]}


class _BufferingConsumer:
    """aiokafka's background fetcher: records arrive in a buffer; getmany hands out what is buffered, at once
    when there is any (its timeout only bounds a wait for the first)."""

    def __init__(self) -> None:
        self.buffer: list[str] = []
        self.calls = 0

    async def getmany(self, *, timeout_ms: int, max_records: int) -> dict[Any, list[Any]]:
        self.calls += 1
        deadline = asyncio.get_running_loop().time() + timeout_ms / 1000
        while not self.buffer and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.001)
        taken, self.buffer = self.buffer[:max_records], self.buffer[max_records:]
        return {tp(0): taken} if taken else {}


async def test_a_gathering_fetch_hands_out_what_came_during_its_wait_together() -> None:
    """With gather (a transaction lingering), records arriving one by one over the wait are taken as they come
    (aiokafka fetches a partition again only once its records were handed out) and handed out together at its
    end, in order: one loop cycle for them all."""
    fetch = LoopFetch(max_records=100)
    consumer = _BufferingConsumer()

    async def arrive() -> None:
        for i in range(5):
            await asyncio.sleep(0.005)
            consumer.buffer.append(f"r{i}")

    arriving = asyncio.ensure_future(arrive())
    began = asyncio.get_running_loop().time()
    got = await fetch.next(consumer, 80, gather=True)
    await arriving
    assert got == {tp(0): ["r0", "r1", "r2", "r3", "r4"]}
    assert asyncio.get_running_loop().time() - began >= 0.07  # the whole wait, not the first record's
    assert consumer.calls > 1


async def test_a_gathering_fetch_stops_at_max_records_and_when_woken() -> None:
    """A gather ends once it holds max_records, or at the first answer after wake() (a stop)."""
    fetch = LoopFetch(max_records=2)
    consumer = _BufferingConsumer()
    consumer.buffer.extend(["r0", "r1", "r2"])
    assert await asyncio.wait_for(fetch.next(consumer, 5_000, gather=True), 1) == {tp(0): ["r0", "r1"]}
    fetch = LoopFetch(max_records=100)
    waiting = asyncio.ensure_future(fetch.next(consumer, 200, gather=True))
    await asyncio.sleep(0.01)
    fetch.wake()
    consumer.buffer.append("r3")
    assert await asyncio.wait_for(waiting, 1) == {tp(0): ["r2", "r3"]}


async def test_a_partition_moved_during_a_gather_loses_what_the_gather_took_of_it() -> None:
    """forget() during a gather (a reopened partition positioned meanwhile) drops what it already took of that
    partition: nothing fetched before the move is handed out."""
    fetch = LoopFetch(max_records=100)
    consumer = _BufferingConsumer()
    consumer.buffer.append("stale")
    waiting = asyncio.ensure_future(fetch.next(consumer, 60, gather=True))
    await asyncio.sleep(0.02)
    fetch.forget(tp(0))
    consumer.buffer.append("fresh")
    assert await asyncio.wait_for(waiting, 1) == {tp(0): ["fresh"]}


class _VirtualTime:
    """The gather's clock and waits on a virtual clock: a wait that times out moves it by its timeout."""

    def __init__(self, fetch: LoopFetch) -> None:
        self.now = 100.0
        self.fetch = fetch
        self.waits: list[float] = []

    def time(self) -> float:
        return self.now

    def get_running_loop(self) -> _VirtualTime:
        return self

    async def wait_for(self, waiting: Any, timeout: float) -> None:
        self.waits.append(timeout)
        if self.fetch._woken.is_set():
            await waiting
            return
        waiting.close()
        self.now += timeout
        raise TimeoutError


class _Scripted:
    """getmany answers from a script (then nothing), noting each call's arguments."""

    def __init__(self, answers: list[dict[Any, list[Any]]]) -> None:
        self.answers = answers
        self.calls: list[tuple[int, int]] = []

    async def getmany(self, *, timeout_ms: int, max_records: int) -> dict[Any, list[Any]]:
        self.calls.append((timeout_ms, max_records))
        assert len(self.calls) < 20, "the gather never ended"
        return self.answers.pop(0) if self.answers else {}


def _virtual(monkeypatch: pytest.MonkeyPatch, fetch: LoopFetch) -> _VirtualTime:
    clock = _VirtualTime(fetch)
    monkeypatch.setattr(
        fetch_module,
        "asyncio",
        SimpleNamespace(get_running_loop=clock.get_running_loop, wait_for=clock.wait_for),
    )
    return clock


async def test_a_gather_waits_in_steps_until_its_linger_ends_taking_what_came_without_waiting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 7 ms linger: waits of 5 ms then the 2 ms left, a getmany that never waits after each, then the gather ends
    with what came, in order; each getmany asks only for what max_records still allows."""
    fetch = LoopFetch(max_records=10)
    clock = _virtual(monkeypatch, fetch)
    consumer = _Scripted([{tp(0): ["a", "b", "c"]}, {tp(0): ["d"]}])
    got = await fetch._gather(consumer, 7)
    assert got == {tp(0): ["a", "b", "c", "d"]}
    assert clock.waits == [0.005, pytest.approx(0.002, rel=1e-9)]
    assert consumer.calls == [(0, 10), (0, 7)]


async def test_a_gather_ends_once_max_records_came_over_every_partition(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Records of two partitions in one answer reaching max_records: the gather ends there, after one wait."""
    fetch = LoopFetch(max_records=4)
    clock = _virtual(monkeypatch, fetch)
    consumer = _Scripted([{tp(0): ["a", "b"], tp(1): ["c", "d"]}])
    got = await fetch._gather(consumer, 50)
    assert got == {tp(0): ["a", "b"], tp(1): ["c", "d"]}
    assert (len(clock.waits), consumer.calls) == (1, [(0, 4)])


async def test_forgetting_a_partition_a_returned_fetch_holds_nothing_of_keeps_the_rest() -> None:
    """forget() of a partition absent from a fetch that returned is harmless; its other records are handed out."""
    fetch = LoopFetch(max_records=10)
    consumer = _SlowConsumer()
    waiting = asyncio.ensure_future(fetch.next(consumer, 5_000))
    await asyncio.sleep(0)
    fetch.wake()
    assert await waiting == {}  # the fetch stays pending
    consumer.ready.set()
    for _ in range(5):  # it returns, unread
        await asyncio.sleep(0)
    fetch.forget(tp(5))
    assert await fetch.next(consumer, 0) == {tp(0): ["r1", "r2"]}


@pytest.mark.parametrize("wait_ms", [0, 50])
async def test_a_fetch_takes_at_most_max_records(wait_ms: int) -> None:
    """Five records buffered and max_records 2: a fetch that does not wait, and one that may, each hands out two,
    in order; the next hands out the next two."""
    fetch = LoopFetch(max_records=2)
    consumer = _BufferingConsumer()
    consumer.buffer = ["r0", "r1", "r2", "r3", "r4"]
    assert await fetch.next(consumer, wait_ms) == {tp(0): ["r0", "r1"]}
    assert await fetch.next(consumer, wait_ms) == {tp(0): ["r2", "r3"]}
