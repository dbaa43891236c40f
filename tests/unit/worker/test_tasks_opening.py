"""Opening a partition at its edges: the old transactional id fenced through the worker's producer, a rebalance
beginning while the offset is read, records a fetch still holds from before the move, and a bug in its last step."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition

from pipeline.errors import PartitionUnservedError
from pipeline.worker.lifecycle import PartitionState
from pipeline.worker.task import ActiveTask

from .fakes import INPUT, TOPICS, keys_for, records
from .test_tasks import TP0, TP1, _world

K = keys_for(0, 4)


async def test_the_old_transactional_id_is_fenced_through_the_workers_producer(tmp_path: Path) -> None:
    """The legacy per-partition id is fenced with the client of the worker's own producer."""
    world = _world(tmp_path, assigned={TP0})
    fenced: list[tuple[Any, str]] = []

    async def fence(client: Any, transactional_id: str) -> None:
        fenced.append((client, transactional_id))

    world.table.io = dataclasses.replace(world.table.io, fence=fence)
    try:
        await world.table.assigned({TP0})
        await world.opened()
        assert fenced == [(world.harness.txn.producer.client, f"webhooks-webhooks-{INPUT}-0")]
    finally:
        await world.table.close()


async def test_a_partition_without_committed_offset_is_dropped_when_a_rebalance_begins_as_its_position_is_read(
    tmp_path: Path,
) -> None:
    """Partition 0 has no committed offset: while its start position is read, the group revokes partition 1 (a
    rebalance begins). Partition 0 is not positioned for the old assignment: its task is closed and out of the
    table, so the next assignment opens it anew."""
    world = _world(tmp_path, assigned={TP0, TP1})
    gate = asyncio.Event()
    reading = asyncio.Event()
    position = world.consumer.position

    async def slow_position(tp: TopicPartition) -> int:
        reading.set()
        await gate.wait()
        return await position(tp)

    world.consumer.position = slow_position  # type: ignore[method-assign,assignment]
    try:
        await world.table.assigned({TP0})
        task = world.table.tasks[TP0]
        await asyncio.wait_for(reading.wait(), 5)
        await world.table.revoked({TP1})
        gate.set()
        await world.opened()
        assert task.state is PartitionState.CLOSED
        assert TP0 not in world.table.tasks
        assert ("resume", TP0) not in world.consumer.events
        await world.table.assigned({TP0})
        assert world.table.tasks[TP0] is not task
    finally:
        gate.set()
        await world.table.close()


async def test_a_reopened_partition_gets_none_of_the_records_a_fetch_held_from_before_its_move(
    tmp_path: Path,
) -> None:
    """Partition 0's store breaks while a finished fetch still holds two of its records: once it is reopened and
    moved to its committed offset, the next fetch hands out none of them (they are fetched again from there)."""
    world = _world(tmp_path, assigned={TP0})
    try:
        await world.table.assigned({TP0})
        await world.opened()
        waiting = asyncio.create_task(world.fetch.next(world.consumer, 1000))
        await asyncio.sleep(0)
        world.fetch.wake()
        assert await waiting == {}
        world.consumer.logs[TP0].extend(records(0, 0, K[:2]))
        await asyncio.sleep(0.2)  # the pending fetch returns with both records (it waits 10 ms at most)
        world.table.tasks[TP0].lifecycle.move(PartitionState.BROKEN)
        world.table.reap()
        await world.opened()
        assert world.table.tasks[TP0].serving
        assert await world.fetch.next(world.consumer, 0) == {}
    finally:
        await world.table.close()


async def test_a_bug_in_the_last_step_of_an_open_stops_the_worker_naming_the_partition(
    tmp_path: Path,
) -> None:
    """The partition is READY and its seek to the beginning raises what nobody expects (a bug): the worker fails
    with the partition named and the task is closed. Before, the error ended the opening task unseen, and the
    partition stayed READY with no position (backpressure then resumed it from wherever the consumer stood)."""
    world = _world(tmp_path, assigned={TP0})

    async def broken_seek(*_partitions: TopicPartition) -> None:
        raise RuntimeError("a bug")

    world.consumer.seek_to_beginning = broken_seek  # type: ignore[method-assign]
    try:
        await world.table.assigned({TP0})
        task = world.table.tasks[TP0]
        await asyncio.wait({world.table.opening[TP0]}, timeout=5)
        await asyncio.sleep(0)  # the opening task's end is observed in its done callback
        assert isinstance(world.table.failure, PartitionUnservedError)
        assert str(world.table.failure) == f"partition {INPUT}-0 cannot be served: RuntimeError('a bug')"
        assert task.state is PartitionState.CLOSED
        assert TP0 in world.consumer.paused
    finally:
        await world.table.close()


class _Suspend:
    """An awaitable that suspends once, with no event loop (a coroutine driven by hand)."""

    def __await__(self) -> Any:
        yield


def test_an_opening_closed_unfinished_outside_any_loop_is_not_taken_for_a_failed_open(tmp_path: Path) -> None:
    """A killed process's opening coroutine is closed later, outside any loop, and its ``finally`` then raises
    (``asyncio.current_task()`` has no loop): that error goes out of the close, the table records no failure."""
    world = _world(tmp_path, assigned={TP0})
    task = ActiveTask(TP0, changelog=TopicPartition(TOPICS.changelog, 0), context=world.harness.context)
    world.table.tasks[TP0] = task

    async def open_then_wait(_task: ActiveTask) -> None:
        try:
            await _Suspend()
        finally:
            asyncio.current_task()  # as _open's finally does: no running loop here

    world.table._open = open_then_wait  # type: ignore[method-assign,assignment]
    opening = world.table._opening(task)
    opening.send(None)
    with pytest.raises(RuntimeError, match="no running event loop"):
        opening.close()
    assert world.table.failure is None
