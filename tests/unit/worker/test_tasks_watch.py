"""The table's watch over time (a partition served, one unserved during a rebalance) and each task's word on
whether it is caught up after a fetch."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from pipeline.errors import PipelineError
from pipeline.worker import tasks as tasks_module
from pipeline.worker.tasks import TaskTable

from .fakes import FakeReader, keys_for, records
from .test_tasks import TP0, TP1, World, _Clock, _world

K = keys_for(0, 5)


@pytest.fixture
async def world(tmp_path: Path) -> Any:
    """A table whose consumer is assigned input partitions 0 and 1 (open_timeout 1 s)."""
    made = _world(tmp_path, assigned={TP0, TP1})
    yield made
    await made.table.close()


def _failure(table: TaskTable) -> PipelineError | None:
    return table.failure


async def test_a_partition_served_for_longer_than_open_timeout_never_fails_the_worker(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Partition 0 served all along, watched again and again over ten times open_timeout: never unserved."""
    clock = _Clock()
    monkeypatch.setattr(tasks_module, "time", clock)
    world.consumer.assigned = {TP0}
    await world.table.assigned({TP0})
    await world.opened()
    assert world.table.tasks[TP0].serving
    for _ in range(10):
        world.table.watch()
        clock.now += 1.5
    world.table.watch()
    assert _failure(world.table) is None


async def test_a_partition_still_restoring_after_open_timeout_is_opening_not_unserved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restore that outlasts open_timeout (its reads wait): the partition is opening, and its open's own
    deadline, not the watch, decides; once the restore ends it is served."""
    clock = _Clock()
    monkeypatch.setattr(tasks_module, "time", clock)
    gate = asyncio.Event()
    world = _world(tmp_path, reader=FakeReader(gate), assigned={TP0})
    try:
        await world.table.assigned({TP0})
        world.table.watch()
        clock.now += 5.0
        world.table.watch()
        assert _failure(world.table) is None
        gate.set()
        await world.opened()
        assert world.table.tasks[TP0].serving
    finally:
        await world.table.close()


async def test_partitions_the_consumer_still_names_during_a_rebalance_are_not_counted_unserved(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between a revocation and the next assignment aiokafka still names the old partitions: however long the
    rebalance lasts, they are not unserved partitions of this worker."""
    clock = _Clock()
    monkeypatch.setattr(tasks_module, "time", clock)
    world.consumer.assigned = {TP0, TP1}
    await world.table.revoked({TP0, TP1})
    world.table.watch()
    clock.now += 5.0
    world.table.watch()
    assert _failure(world.table) is None


async def test_a_task_that_got_records_is_caught_up_only_once_it_reached_the_log_end(world: World) -> None:
    """Two of five records fetched and handled: behind its log's end, so not caught up; a later fetch that
    brought it nothing leaves it caught up (nothing of it waits)."""
    world.consumer.assigned = {TP0}
    world.consumer.logs[TP0] = records(0, 0, K)
    await world.table.assigned({TP0})
    await world.opened()
    fetched = {TP0: records(0, 0, K[:2])}
    world.table.feed(fetched)
    await world.harness.executor.process(world.table.tasks)
    world.table.mark_caught_up(fetched)
    assert world.table.tasks[TP0].caught_up is False
    world.table.mark_caught_up({})
    assert world.table.tasks[TP0].caught_up is True


async def test_a_partition_unserved_for_exactly_open_timeout_is_not_failed_yet(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """open_timeout (1 s) is the time a partition may stay unserved: at exactly 1 s it still may, past it not."""
    clock = _Clock()
    monkeypatch.setattr(tasks_module, "time", clock)
    world.consumer.assigned = {TP0}
    world.table.watch()
    clock.now += 1.0
    world.table.watch()
    assert _failure(world.table) is None
    clock.now += 0.001
    world.table.watch()
    assert _failure(world.table) is not None


async def test_a_partition_served_and_then_broken_is_unserved_from_when_it_broke(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unserved before its task opened, then served, then broken: the watch counts from the break, not from the
    first time it was unserved, so a break soon after is not taken for a partition unserved for too long."""
    clock = _Clock()
    monkeypatch.setattr(tasks_module, "time", clock)
    world.consumer.assigned = {TP0}
    world.table.watch()  # assigned, no task yet
    clock.now += 0.5
    await world.table.assigned({TP0})
    await world.opened()
    world.table.watch()
    clock.now += 0.9
    world.table.tasks[TP0].broken(RuntimeError("its store failed"))
    world.table.watch()
    clock.now += 0.9
    world.table.watch()
    assert _failure(world.table) is None
    clock.now += 0.2
    world.table.watch()
    assert _failure(world.table) is not None


async def test_an_unserved_partition_named_after_a_served_one_is_still_watched(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Partition 0 served, partition 1 assigned with no task: whatever the order the consumer names them in,
    partition 1 fails the worker once unserved past open_timeout."""
    clock = _Clock()
    monkeypatch.setattr(tasks_module, "time", clock)
    world.consumer.assigned = {TP0}
    await world.table.assigned({TP0})
    await world.opened()
    monkeypatch.setattr(world.consumer, "assignment", lambda: [TP0, TP1])
    world.table.watch()
    clock.now += 1.5
    world.table.watch()
    failure = _failure(world.table)
    assert failure is not None
    assert f"partition {TP1.topic}-1 is assigned but not served" in str(failure)
