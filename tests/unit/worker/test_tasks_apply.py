"""Applying an aborted transaction's outcome: every serving task named goes back, and what was fetched of it
before the move is never handed out."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pipeline.worker.executor import Outcome

from .fakes import keys_for, records
from .test_tasks import TP0, TP1, _world

K = keys_for(0, 4)


async def test_a_partition_not_served_here_does_not_stop_the_others_going_back(tmp_path: Path) -> None:
    """The rewind names partition 1 first (no task here) and partition 0 after it: partition 0 still goes back."""
    world = _world(tmp_path, assigned={TP0, TP1})
    try:
        await world.table.assigned({TP0})
        await world.opened()
        world.table.apply(Outcome(rewind={TP1: 3, TP0: 7}))
        assert world.table.tasks[TP0].position == 7
        assert world.consumer.seeks[-1] == (TP0, 7)
    finally:
        await world.table.close()


async def test_records_a_finished_fetch_holds_of_a_partition_moved_back_are_dropped(tmp_path: Path) -> None:
    """A fetch that returned partition 0's records after the loop stopped waiting for it: once partition 0 is moved
    back, the next fetch hands out none of them (they are fetched again from the new position)."""
    world = _world(tmp_path, assigned={TP0})
    try:
        await world.table.assigned({TP0})
        await world.opened()
        waiting = asyncio.create_task(world.fetch.next(world.consumer, 1000))
        await asyncio.sleep(0)
        world.fetch.wake()
        assert await waiting == {}  # woken before the fetch returned: it stays pending
        world.consumer.logs[TP0].extend(records(0, 0, K[:2]))
        await asyncio.sleep(0.2)  # the pending fetch returns with both records (it waits 10 ms at most)
        world.table.apply(Outcome(rewind={TP0: 0}))
        assert await world.fetch.next(world.consumer, 0) == {}
    finally:
        await world.table.close()
