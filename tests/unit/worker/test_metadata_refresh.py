"""After leading a rebalance without a topic's partitions, the worker asks for them until they come, then rejoins."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError

from pipeline.worker import metadata_refresh as refresh_module
from pipeline.worker.metadata_refresh import MetadataRefresh

TOPIC = "raw"


class FakeConsumer:
    """What the refresh touches on a group consumer: its client's metadata update and its coordinator's rejoin."""

    def __init__(self, *, known_after: int, failing: int = 0) -> None:
        self.failing = failing  # the first updates raise (the broker away)
        self.updates = 0
        self.rejoins: list[int] = []  # the number of updates made when each rejoin was asked
        self.known_after = known_after  # the update that brings the topic's partitions
        self._client = self
        self._coordinator = self

    async def force_metadata_update(self) -> bool:
        self.updates += 1
        if self.updates <= self.failing:
            raise KafkaConnectionError("broker away")
        return True

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return {0, 1} if topic == TOPIC and self.updates >= self.known_after else None

    def request_rejoin(self) -> None:
        self.rejoins.append(self.updates)


async def _settled(refresh: MetadataRefresh, seconds: float = 1.0) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while refresh.pending and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.005)


async def test_the_metadata_is_asked_for_until_the_topic_comes_then_the_group_is_rejoined_once() -> None:
    """Two updates without the topic, the third brings it: one rejoin, after it, and nothing waited for after."""
    consumer: Any = FakeConsumer(known_after=3)
    refresh = MetadataRefresh(first_backoff=0.001, max_backoff=0.002)
    refresh.attach(consumer)
    refresh.missing(frozenset({TOPIC}))
    assert refresh.pending == {TOPIC}
    await _settled(refresh)
    assert consumer.rejoins == [3]
    assert refresh.pending == frozenset()
    await refresh.close()


async def test_a_second_report_while_refreshing_starts_no_second_refresh() -> None:
    """Reported again meanwhile (another rebalance led without it): still one refresh and one rejoin."""
    consumer: Any = FakeConsumer(known_after=4)
    refresh = MetadataRefresh(first_backoff=0.001, max_backoff=0.002)
    refresh.attach(consumer)
    refresh.missing(frozenset({TOPIC}))
    await asyncio.sleep(0)
    refresh.missing(frozenset({TOPIC}))
    await _settled(refresh)
    assert consumer.rejoins == [4]
    await refresh.close()


async def test_closing_stops_a_refresh_that_never_got_the_topic() -> None:
    """A topic that never comes is asked for until the worker stops; no rejoin is asked for it."""
    consumer: Any = FakeConsumer(known_after=10**9)
    refresh = MetadataRefresh(first_backoff=0.001, max_backoff=0.002)
    refresh.attach(consumer)
    refresh.missing(frozenset({TOPIC}))
    await asyncio.sleep(0.05)
    await refresh.close()
    made = consumer.updates
    await asyncio.sleep(0.02)
    assert made > 1
    assert consumer.updates == made
    assert consumer.rejoins == []


async def test_nothing_is_asked_for_when_every_topic_was_planned() -> None:
    """An empty report starts nothing."""
    consumer: Any = FakeConsumer(known_after=0)
    refresh = MetadataRefresh()
    refresh.attach(consumer)
    refresh.missing(frozenset())
    await asyncio.sleep(0.01)
    assert consumer.updates == 0
    assert consumer.rejoins == []
    await refresh.close()


async def test_updates_that_raise_are_asked_again_until_one_brings_the_topic() -> None:
    """The broker away for the first two updates (each raises): the refresh goes on, then rejoins once."""
    consumer: Any = FakeConsumer(known_after=3, failing=2)
    refresh = MetadataRefresh(first_backoff=0.001, max_backoff=0.002)
    refresh.attach(consumer)
    refresh.missing(frozenset({TOPIC}))
    await _settled(refresh)
    assert consumer.rejoins == [3]
    await refresh.close()


class RacingConsumer(FakeConsumer):
    """A consumer whose metadata update ends in ``wait_for`` (as aiokafka's connections do), its answer
    coming in as the worker stops."""

    def __init__(self) -> None:
        super().__init__(known_after=10**9)
        self.answer: asyncio.Future[bool] | None = None

    async def force_metadata_update(self) -> bool:
        self.updates += 1
        self.answer = asyncio.get_running_loop().create_future()
        return await asyncio.wait_for(self.answer, 10)


async def test_a_close_ends_though_the_refresh_lost_its_cancellation() -> None:
    """Python 3.11's ``wait_for`` drops a cancel that comes with its result: the close cancels again, and ends."""
    consumer: Any = RacingConsumer()
    refresh = MetadataRefresh(first_backoff=3600, max_backoff=3600)
    refresh.attach(consumer)
    refresh.missing(frozenset({TOPIC}))
    await asyncio.sleep(0)
    assert consumer.answer is not None
    consumer.answer.set_result(True)  # the answer comes in with the stop
    closing = asyncio.create_task(refresh.close())
    done, _ = await asyncio.wait({closing}, timeout=5)
    assert done, "the close still waits for a refresh that goes on"
    assert consumer.updates == 1


async def test_the_backoff_doubles_from_the_first_up_to_the_largest(monkeypatch: pytest.MonkeyPatch) -> None:
    """Between updates that lack the topic the refresh waits first_backoff, then twice as long each time, at most
    max_backoff; the refresh runs as the task "metadata refresh"."""
    waits: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(
        refresh_module, "asyncio", SimpleNamespace(sleep=sleep, create_task=asyncio.create_task)
    )
    consumer: Any = FakeConsumer(known_after=6)
    refresh = MetadataRefresh(first_backoff=0.1, max_backoff=0.5)
    refresh.attach(consumer)
    refresh.missing(frozenset({TOPIC}))
    assert [t.get_name() for t in asyncio.all_tasks() if t.get_name() == "metadata refresh"] == [
        "metadata refresh"
    ]
    for _ in range(50):
        if not refresh.pending:
            break
        await real_sleep(0)
    assert waits == [0.1, 0.2, 0.4, 0.5, 0.5]
    assert consumer.rejoins == [6]
    await refresh.close()


async def test_only_topics_not_yet_waited_for_are_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    """A topic reported again while it is waited for is not warned about twice; a new one is, alone."""
    caplog.set_level(logging.WARNING, logger="pipeline.worker.metadata_refresh")
    consumer: Any = FakeConsumer(known_after=10**9)
    refresh = MetadataRefresh(first_backoff=10.0)
    refresh.attach(consumer)
    refresh.missing(frozenset({TOPIC}))
    refresh.missing(frozenset({TOPIC}))
    refresh.missing(frozenset({TOPIC, "effects"}))
    said = [m.split(" in its metadata")[0] for m in caplog.messages]
    assert said == [
        f"this worker led a rebalance without the partitions of {TOPIC}",
        "this worker led a rebalance without the partitions of effects",
    ]
    assert refresh.pending == {TOPIC, "effects"}
    await refresh.close()


async def test_a_report_before_a_consumer_is_attached_asks_for_nothing() -> None:
    """A rebalance reported before the worker attached its consumer: nothing is waited for, nothing refreshed."""
    refresh = MetadataRefresh(first_backoff=0.001, max_backoff=0.002)
    refresh.missing(frozenset({TOPIC}))
    assert refresh.pending == frozenset()
    await refresh.close()
