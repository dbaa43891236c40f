"""What one loop cycle asks its fetch for while a transaction is open: how long to wait, and whether to gather.

The open transaction's time to its commit is set by the test (``TaskExecutor.due_in``, and whether it is
``due``), so the wait each cycle computes from it is exact.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition

from pipeline.worker import loop as loop_module
from pipeline.worker.executor import TaskExecutor
from pipeline.worker.fetch import LoopFetch
from pipeline.worker.loop import Worker
from tests.unit.worker.test_loop import eventually as _eventually

from .fakes import TOPOLOGY, FakeConsumer, fake_io, keys_for, records, settings, tp

TP0 = tp(0)
Ask = tuple[int, bool, bool]  # (wait_ms, hurry, gather)


class RecordingFetch(LoopFetch):
    """The loop's fetch, noting how each call was asked."""

    asks: list[Ask]

    async def next(
        self, consumer: Any, wait_ms: int, *, hurry: bool = False, gather: bool = False
    ) -> dict[TopicPartition, list[Any]]:
        self.asks.append((wait_ms, hurry, gather))
        return await super().next(consumer, wait_ms, hurry=hurry, gather=gather)


class Clocked:
    """A running worker whose open transaction is due in ``due_in`` seconds, and due only once ``due`` is set."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **overrides: Any) -> None:
        self.asks: list[Ask] = []
        self.due_in = 0.05  # a lingering transaction gathers for this long: short
        self.due = False
        monkeypatch.setattr(RecordingFetch, "asks", self.asks, raising=False)
        monkeypatch.setattr(loop_module, "LoopFetch", RecordingFetch)
        real_due_in = TaskExecutor.due_in

        def due_in(executor: TaskExecutor, tasks: Any) -> float | None:
            return None if real_due_in(executor, tasks) is None else self.due_in

        def due(executor: TaskExecutor, tasks: Any) -> bool:
            return self.due and real_due_in(executor, tasks) is not None

        monkeypatch.setattr(TaskExecutor, "due_in", due_in)
        monkeypatch.setattr(TaskExecutor, "due", due)
        self.io, self.clients = fake_io(
            consumer=FakeConsumer(assign={TP0}, logs={TP0: records(0, 0, keys_for(0, 2))})
        )
        values = {"commit_interval": 60.0, "transaction_timeout": 120.0, **overrides}
        self.worker = Worker(settings(tmp_path, **values), TOPOLOGY, io=self.io)
        self.task: asyncio.Task[None] | None = None

    async def run_until_open(self) -> None:
        """Start and run the worker until its transaction holds both records."""
        await self.worker.start()
        self.task = asyncio.create_task(self.worker.run())
        await _eventually(
            lambda: (
                (t := self.worker.tasks.get(TP0)) is not None and t.part is not None and t.part.records == 2
            ),
            what="both records in the open transaction",
        )

    async def asks_from_now(self, count: int = 3) -> list[Ask]:
        """The next ``count`` asks of the loop."""
        start = len(self.asks)
        await _eventually(lambda: len(self.asks) >= start + count, what=f"{count} more fetches")
        return self.asks[start + 1 :]  # the first may have been computed before the test's change

    async def stop(self) -> None:
        self.due = True
        self.worker.stop()
        if self.task is not None:
            await asyncio.wait_for(self.task, 5)


async def test_an_overdue_transaction_not_yet_committed_makes_each_fetch_not_wait_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Overdue by half a second (its commit not yet through): every fetch asks for 0 ms, never a wait of its own."""
    w = Clocked(tmp_path, monkeypatch, commit_policy="interval")
    await w.run_until_open()
    try:
        w.due_in = -0.5
        asks = await w.asks_from_now()
        assert {wait for wait, _, _ in asks} == {0}
    finally:
        await w.stop()


async def test_a_lingering_transaction_due_in_a_millisecond_still_gathers_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Caught up and due in 1 ms: the fetch waits that millisecond, gathering what comes."""
    w = Clocked(tmp_path, monkeypatch, commit_policy="caught-up")
    await w.run_until_open()
    try:
        w.due_in = 0.001
        asks = await w.asks_from_now()
        assert set(asks) == {(1, False, True)}
    finally:
        await w.stop()


async def test_a_lingering_transaction_due_in_under_a_millisecond_does_not_ask_to_gather(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Caught up and due in half a millisecond: the wait rounds down to 0, and a fetch that does not wait is never
    asked to gather."""
    w = Clocked(tmp_path, monkeypatch, commit_policy="caught-up")
    await w.run_until_open()
    try:
        w.due_in = 0.0005
        asks = await w.asks_from_now()
        assert set(asks) == {(0, False, False)}
    finally:
        await w.stop()
