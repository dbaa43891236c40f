"""Who goes into the open transaction, and when it is due: a partition that goes alone keeps its transaction to
itself, takes turns with the others as records keep coming, and a transaction is due at max_batch exactly."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from .fakes import Harness, keys_for, records, tp

A, B, C = keys_for(0, 12), keys_for(1, 12), keys_for(2, 12)
# caught-up policy, 30 s to commit a transaction not caught up (the test sets the linger)
CAUGHT_UP = {"commit_policy": "caught-up", "commit_interval": 30.0, "transaction_timeout": 60.0}


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    made = Harness(tmp_path)
    yield made
    made.close()


def _held(h: Harness) -> list[int]:
    return sorted(where.partition for where in h.txn.parts)


@contextlib.asynccontextmanager
async def _handled(tmp_path: Path, overrides: dict[str, Any], count: int = 2) -> AsyncIterator[Harness]:
    """Partition 0 open under ``overrides``, its first ``count`` records handled into the open transaction."""
    h = Harness(tmp_path, overrides)
    try:
        await h.open(0)
        h.feed(records(0, 0, A[:count]))
        await h.work()
        yield h
    finally:
        h.close()


async def test_while_a_bisecting_partitions_transaction_is_open_the_others_wait_for_the_next(
    harness: Harness,
) -> None:
    """Partition 0 bisecting holds the open transaction alone: handling again before it commits adds more of its
    records, none of partition 1's, which go into the next transaction."""
    first = await harness.open(0)
    await harness.open(1)
    first.poison.limit = 8
    first.poison._until = 100
    harness.feed([*records(0, 0, A[:2]), *records(1, 0, B[:2])])
    await harness.work()
    assert _held(harness) == [0]
    harness.feed(records(0, 2, A[2:3]))
    await harness.work()
    assert _held(harness) == [0]
    assert harness.txn.records == 3
    await harness.commit()
    await harness.work()
    assert _held(harness) == [1]


async def test_an_open_transaction_of_the_others_takes_records_of_every_other_partition(
    harness: Harness,
) -> None:
    """A transaction of partitions going together is joined by another partition's records before it commits."""
    await harness.open(0)
    await harness.open(1)
    harness.feed(records(0, 0, A[:2]))
    await harness.work()
    harness.feed(records(1, 0, B[:2]))
    await harness.work()
    assert _held(harness) == [0, 1]


async def test_a_bisecting_partition_and_the_others_alternate_while_both_keep_getting_records(
    harness: Harness,
) -> None:
    """Records keep coming on a bisecting partition and on another: one transaction holds it alone, the next the
    other partition, and so on; a transaction of one ordinary partition is not a lone one."""
    first = await harness.open(0)
    await harness.open(1)
    first.poison.limit = 1
    first.poison._until = 100
    held = []
    for turn in range(4):
        harness.feed([*records(0, turn, A[turn : turn + 1]), *records(1, turn, B[turn : turn + 1])])
        await harness.work()
        held.append(_held(harness))
        await harness.commit()
    assert held == [[0], [1], [0], [1]]


async def test_a_partition_assigned_after_a_lone_transaction_goes_next_even_after_a_cycle_with_nothing(
    harness: Harness,
) -> None:
    """A lone transaction of the bisecting partition, then a cycle with nothing to handle: the partition that
    comes next with records still has its turn before the bisecting one's next transaction."""
    first = await harness.open(0)
    first.poison.limit = 1
    first.poison._until = 100
    harness.feed(records(0, 0, A[:1]))
    await harness.work()
    await harness.commit()
    await harness.work()  # nothing queued anywhere
    await harness.open(1)
    harness.feed([*records(0, 1, A[1:2]), *records(1, 0, B[:1])])
    await harness.work()
    assert _held(harness) == [1]


@pytest.mark.parametrize(("count", "due"), [(2, False), (3, True)])
async def test_a_transaction_is_due_once_it_holds_max_batch_records_not_before(
    tmp_path: Path, count: int, *, due: bool
) -> None:
    """max_batch 3: a transaction of 2 records waits for its interval, one of 3 is due now (0 s from now)."""
    interval = {
        "max_batch": 3,
        "commit_policy": "interval",
        "commit_interval": 30.0,
        "transaction_timeout": 60.0,
    }
    async with _handled(tmp_path, interval, count) as h:
        assert h.executor.due(h.tasks) is due
        due_in = h.executor.due_in(h.tasks)
        assert due_in is not None
        if due:
            assert due_in == 0.0
        else:
            assert 29.0 < due_in <= 30.0


async def test_a_transaction_not_caught_up_waits_out_the_commit_interval_counted_from_its_opening(
    tmp_path: Path,
) -> None:
    """Policy caught-up, but the partition has more to fetch: due at the commit interval, not the linger; the
    time left shrinks as the transaction ages, and it is due once the interval has passed."""
    async with _handled(tmp_path, {**CAUGHT_UP, "commit_linger": 0.02}) as h:
        h.task().caught_up = False
        due_in = h.executor.due_in(h.tasks)
        assert due_in is not None
        assert 29.0 < due_in <= 30.0
        h.txn.opened_at = time.monotonic() - 20.0
        due_in = h.executor.due_in(h.tasks)
        assert due_in is not None
        assert 9.0 < due_in <= 10.0
        h.txn.opened_at = time.monotonic() - 31.0
        assert h.executor.due(h.tasks)


async def test_a_caught_up_transaction_due_now_for_its_size_does_not_linger(tmp_path: Path) -> None:
    """Caught up, but at max_batch (due in 0 s, not later): it commits now, it does not wait out its linger."""
    async with _handled(tmp_path, {"max_batch": 2, "commit_policy": "caught-up", "commit_linger": 5.0}) as h:
        h.task().caught_up = True
        assert h.executor.due_in(h.tasks) == 0.0
        assert not h.executor.lingering(h.tasks)


async def test_a_transaction_due_in_half_a_second_is_not_due_yet(tmp_path: Path) -> None:
    """Caught up with a linger of half a second: lingering, not due, until the half second has passed."""
    async with _handled(tmp_path, {"commit_policy": "caught-up", "commit_linger": 0.5}) as h:
        h.task().caught_up = True
        assert h.executor.lingering(h.tasks)
        assert not h.executor.due(h.tasks)
        h.txn.opened_at -= 0.5
        assert h.executor.due(h.tasks)


async def test_suspects_no_longer_served_here_are_forgotten(harness: Harness) -> None:
    """A suspect whose partition left the table, or stopped serving, no longer goes alone."""
    await harness.open(0)
    await harness.open(1)
    harness.executor.suspects = [tp(0), tp(1), tp(5)]
    harness.task(1).broken(RuntimeError("its store failed"))
    harness.executor.eligible(harness.tasks)
    assert harness.executor.suspects == [tp(0)]


async def test_a_task_never_yet_marked_caught_up_does_not_make_its_transaction_linger(tmp_path: Path) -> None:
    """Policy caught-up, a task just opened that handled records but was never told it is caught up: its
    transaction waits the commit interval, it does not linger as if nothing more were coming."""
    async with _handled(tmp_path, {**CAUGHT_UP, "commit_linger": 0.5}) as h:
        assert not h.executor.lingering(h.tasks)
        due_in = h.executor.due_in(h.tasks)
        assert due_in is not None
        assert due_in > 1.0
