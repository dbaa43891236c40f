"""Backpressure task by task (full at queue_bytes exactly, never a partition opening or not assigned, nothing
resumed that was not paused) and reaping every BROKEN task, wherever it is in the table."""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from pipeline.worker.lifecycle import PartitionState

from .fakes import FakeReader, record
from .test_tasks import TP0, TP1, World, _world

QUEUE_BYTES = 64 * 1024  # the least queue_bytes the settings take


class _HoldingPartition0(FakeReader):
    """A changelog reader whose reads for partition 0 wait at ``gate``; partition 1's pass."""

    async def _wait(self, tp: TopicPartition) -> int:
        self.entered.append(tp)
        if tp.partition == 0 and self.gate is not None:
            await self.gate.wait()
        return 0


def _sized(offset: int, size: int, *, partition: int = 0) -> ConsumerRecord[bytes, bytes]:
    """A record of ``partition`` whose key and value are ``size`` bytes together."""
    key = f"stripe:evt_{offset}"
    return record(offset, key, partition=partition, value=b"x" * (size - len(key)))


async def _serving(tmp_path: Path) -> World:
    world = _world(tmp_path, assigned={TP0, TP1}, queue_bytes=QUEUE_BYTES)
    await world.table.assigned({TP0, TP1})
    await world.opened()
    return world


async def test_a_queue_of_exactly_queue_bytes_is_full(tmp_path: Path) -> None:
    """One byte short of queue_bytes: still fetched; exactly queue_bytes: paused."""
    world = await _serving(tmp_path)
    try:
        world.table.feed({TP0: [_sized(0, QUEUE_BYTES - 1)], TP1: [_sized(0, QUEUE_BYTES, partition=1)]})
        world.table.backpressure()
        assert (world.table.tasks[TP0].paused, world.table.tasks[TP1].paused) == (False, True)
        assert TP0 not in world.consumer.paused
        assert TP1 in world.consumer.paused
    finally:
        await world.table.close()


async def test_a_task_neither_full_nor_paused_is_left_alone_and_a_full_paused_one_stays_paused(
    tmp_path: Path,
) -> None:
    """Backpressure again and again: a task with room is never resumed (it was never paused), and a task still
    full stays paused."""
    world = await _serving(tmp_path)
    try:
        world.table.feed({TP1: [_sized(0, QUEUE_BYTES, partition=1)]})
        world.table.backpressure()
        events = list(world.consumer.events)
        world.table.backpressure()
        world.table.backpressure()
        assert world.consumer.events == events
        assert world.table.tasks[TP1].paused
        assert TP1 in world.consumer.paused
        assert ("resume", TP0) not in events[-2:]
    finally:
        await world.table.close()


async def test_a_partition_opening_stays_paused_and_the_tasks_after_it_are_still_paused_when_full(
    tmp_path: Path,
) -> None:
    """Partition 0 still restoring (paused until it is positioned) comes first in the table: backpressure leaves
    it paused, and still pauses partition 1 behind it once its queue is full."""
    gate = asyncio.Event()
    world = _world(tmp_path, reader=_HoldingPartition0(gate), assigned={TP0, TP1}, queue_bytes=QUEUE_BYTES)
    try:
        await world.table.assigned({TP0, TP1})
        await asyncio.wait_for(world.table.opening[TP1], 5)
        assert list(world.table.tasks) == [TP0, TP1]
        assert not world.table.tasks[TP0].serving
        world.table.feed({TP1: [_sized(0, QUEUE_BYTES, partition=1)]})
        world.table.backpressure()
        assert TP0 in world.consumer.paused
        assert world.table.tasks[TP1].paused
        assert TP1 in world.consumer.paused
    finally:
        gate.set()
        await world.table.close()


async def test_a_serving_task_no_longer_assigned_is_not_paused_by_backpressure(tmp_path: Path) -> None:
    """Partition 0 full but no longer in the consumer's assignment (a rebalance under way): nothing is paused."""
    world = await _serving(tmp_path)
    try:
        world.table.feed({TP0: [_sized(0, QUEUE_BYTES)]})
        world.consumer.assigned = {TP1}
        world.table.backpressure()
        assert not world.table.tasks[TP0].paused
        assert TP0 not in world.consumer.paused
    finally:
        await world.table.close()


async def test_every_broken_task_is_reaped_not_only_the_first(tmp_path: Path) -> None:
    """Partition 0 serving, partition 1 BROKEN behind it: reaping closes partition 1's task and opens it again."""
    world = await _serving(tmp_path)
    try:
        broken = world.table.tasks[TP1]
        broken.lifecycle.move(PartitionState.BROKEN)
        world.table.reap()
        assert broken.state is PartitionState.CLOSED
        assert world.table.tasks[TP1] is not broken
        assert TP1 in world.table.opening
        assert world.table.tasks[TP0].serving
    finally:
        await world.table.close()
