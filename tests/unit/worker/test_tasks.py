"""The task table: opening assigned partitions in the background, closing revoked ones, and what it reports."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaConnectionError

from pipeline.errors import PartitionUnservedError, PipelineError
from pipeline.worker import opening as opening_module
from pipeline.worker import tasks as tasks_module
from pipeline.worker.executor import Outcome
from pipeline.worker.fetch import LoopFetch
from pipeline.worker.lifecycle import PartitionState
from pipeline.worker.standbys import StandbyReplicas
from pipeline.worker.task import ActiveTask
from pipeline.worker.tasks import TaskTable

from .fakes import INPUT, TOPICS, FakeConsumer, FakeGroup, FakeReader, Harness, fake_io, keys_for, record, tp

S = PartitionState
TP0, TP1 = tp(0), tp(1)
K = keys_for(0, 4)


class _Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class _FlakyReader(FakeReader):
    """A changelog whose first read of an end fails as a broker away makes it fail."""

    def __init__(self) -> None:
        super().__init__()
        self.failures = 1

    async def end(self, tp: TopicPartition) -> int:
        if self.failures:
            self.failures -= 1
            raise KafkaConnectionError("broker away")
        return await super().end(tp)

    async def log_end(self, tp: TopicPartition) -> int:
        return await self.end(tp)


@dataclass
class World:
    """A task table over fake clients, with what it drives."""

    table: TaskTable
    consumer: FakeConsumer
    group: FakeGroup
    harness: Harness
    standbys: StandbyReplicas
    fetch: LoopFetch

    async def opened(self) -> None:
        """Wait for every opening under way to end."""
        await asyncio.gather(*self.table.opening.values(), return_exceptions=True)


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening retries without waiting."""
    monkeypatch.setattr(opening_module, "BACKOFF_FIRST", 0.0)


def _world(
    tmp_path: Path,
    *,
    reader: FakeReader | None = None,
    assigned: Iterable[TopicPartition] = (),
    **overrides: Any,
) -> World:
    harness = Harness(tmp_path, overrides, reader=reader or FakeReader())
    consumer = FakeConsumer()
    consumer.assigned = set(assigned)
    io, _ = fake_io(consumer=consumer)
    group = FakeGroup(consumer)
    changelogs = {INPUT: TOPICS.changelog}
    holder: list[TaskTable] = []

    def served_positions() -> dict[TopicPartition, int]:
        return holder[0].positions()

    standbys = StandbyReplicas(harness.context, changelogs, served_positions)
    fetch = LoopFetch(max_records=100)
    table = TaskTable(
        harness.context,
        changelogs,
        io=io,
        consumer=consumer,
        group=group,
        txn=harness.txn,
        standbys=standbys,
        fetch=fetch,
    )
    holder.append(table)
    return World(table, consumer, group, harness, standbys, fetch)


@pytest.fixture
async def world(tmp_path: Path) -> Any:
    """A table whose consumer is assigned input partitions 0 and 1."""
    made = _world(tmp_path, assigned={TP0, TP1})
    yield made
    await made.table.close()


async def test_an_assigned_partition_opens_paused_then_is_served_from_its_committed_offset(
    world: World,
) -> None:
    """A new task is paused (and fed nothing) until restored and moved to its committed offset; then resumed and served."""
    world.consumer.committed_offsets[TP0] = 42
    await world.table.assigned({TP0})
    task = world.table.tasks[TP0]
    assert task.paused is True
    assert world.consumer.paused == {TP0}
    assert world.table.opening[TP0].get_name() == f"open {INPUT}-0"
    assert world.table.positions() == {}  # no store opened yet
    assert world.table.served_stores() == {}
    world.table.feed({TP0: [record(0, K[0])]})
    assert task.queue == []  # nothing is handed to a task still opening
    await world.opened()
    assert _state(task) is S.READY
    assert not _paused(task)
    assert world.consumer.seeks == [(TP0, 42)]
    assert world.consumer.events[-1] == ("resume", TP0)
    assert task.position == 42
    assert world.table.opening == {}
    assert world.table.failure is None


async def test_a_stopping_table_opens_nothing_new(world: World) -> None:
    """Once the worker stops, an assignment opens no task (the next owner takes the partitions)."""
    world.table.stopping = True
    await world.table.assigned({TP0})
    assert world.table.tasks == {}
    assert world.table.opening == {}


async def test_an_opening_revoked_midway_is_cancelled_and_its_store_released(tmp_path: Path) -> None:
    """A partition revoked while it restores: the opening is cancelled, the task closed, nothing left opening."""
    world = _world(tmp_path, reader=FakeReader(asyncio.Event()), assigned={TP0})
    await world.table.assigned({TP0})
    task = world.table.tasks[TP0]
    opening = world.table.opening[TP0]
    for _ in range(20):
        if task.state is S.RESTORING:
            break
        await asyncio.sleep(0)
    assert task.state is S.RESTORING
    assert world.table.served_stores() == {}  # restoring: not served yet
    assert set(world.table.positions()) == {TP0}  # but its open store is claimed
    await world.table.revoked({TP0})
    assert opening.cancelled()
    assert world.table.opening == {}
    assert world.table.tasks == {}
    assert _state(task) is S.CLOSED
    await world.table.close()


async def test_revoking_a_partition_never_assigned_here_is_a_no_op(world: World) -> None:
    """A revocation naming partitions this table holds no task of closes nothing and raises nothing."""
    await world.table.revoked({TP1})
    assert world.table.tasks == {}


async def test_a_revoked_task_leaves_its_store_position_to_the_standbys(world: World) -> None:
    """The store a revoked task leaves on disk is remembered at the changelog offset it reflected."""
    await world.table.assigned({TP0})
    await world.opened()
    task = world.table.tasks[TP0]
    await world.table.revoked({TP0})
    assert task.state is S.CLOSED
    assert task.released_at is not None
    assert world.standbys.known == {TP0: task.released_at}


async def test_a_task_no_longer_assigned_when_it_opens_is_dropped_unserved(world: World) -> None:
    """The consumer dropped the partition while it opened: the task is closed and out of the table, never resumed."""
    world.consumer.assigned = set()
    await world.table.assigned({TP0})
    task = world.table.tasks[TP0]
    await world.opened()
    assert task.state is S.CLOSED
    assert world.table.tasks == {}
    assert world.consumer.seeks == []
    assert ("resume", TP0) not in world.consumer.events
    assert world.table.failure is None


async def test_a_broker_away_while_opening_is_retried_and_the_task_served(tmp_path: Path) -> None:
    """A retriable error while restoring is retried within open_timeout; the task ends up served."""
    world = _world(tmp_path, reader=_FlakyReader(), assigned={TP0})
    await world.table.assigned({TP0})
    await world.opened()
    assert world.table.tasks[TP0].state is S.READY
    assert world.table.failure is None
    await world.table.close()


async def test_a_legacy_fence_that_fails_once_is_retried_and_logged_with_the_partition(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """A broker away while fencing the old transactional id is retried; the warning names the partition's fence."""
    clients_io, clients = fake_io(consumer=world.consumer)
    world.table.io = clients_io
    clients.fence_refusals.append(KafkaConnectionError("away"))
    caplog.set_level(logging.WARNING, logger="pipeline.worker.opening")
    await world.table.assigned({TP0})
    await world.opened()
    assert world.table.tasks[TP0].state is S.READY
    assert clients.fenced == [f"webhooks-webhooks-{INPUT}-0"]
    assert any(r.getMessage().startswith(f"{INPUT}-0: fence failed") for r in caplog.records)


async def test_a_committed_offset_read_that_fails_once_is_retried_and_logged_with_the_partition(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """The group coordinator away while the committed offset is read: retried, the warning naming the partition's
    read; the partition then serves."""
    world.group.refusals.append(KafkaConnectionError("away"))
    caplog.set_level(logging.WARNING, logger="pipeline.worker.opening")
    await world.table.assigned({TP0})
    await world.opened()
    assert world.table.tasks[TP0].state is S.READY
    assert len(world.group.reads) == 2
    assert any(r.getMessage().startswith(f"{INPUT}-0: committed offset failed") for r in caplog.records)


async def test_an_assigned_partition_left_unserved_fails_the_worker_only_after_open_timeout(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unserved time is counted from when it was last assigned: a revocation forgets the earlier wait."""
    clock = _Clock()
    monkeypatch.setattr(tasks_module, "time", clock)
    world.consumer.assigned = {TP0}
    world.table.watch()  # assigned, no task: unserved from now
    clock.now += 0.5
    await world.table.revoked({TP0})
    await world.table.assigned(set())  # the rebalance ends; the consumer still names TP0
    world.table.watch()
    clock.now += 0.9  # 1.4 s after the first sighting, 0.9 s after the new assignment (open_timeout 1 s)
    world.table.watch()
    assert world.table.failure is None
    clock.now += 0.2
    world.table.watch()
    failure = _failure(world.table)
    assert isinstance(failure, PartitionUnservedError)
    assert str(failure) == f"partition {INPUT}-0 is assigned but not served for 1s"


async def test_observe_sets_the_gauges_of_serving_tasks_only(tmp_path: Path) -> None:
    """After a commit, a serving task's store gauges are set; a task still restoring reports nothing."""
    gate = asyncio.Event()
    world = _world(tmp_path, reader=FakeReader(gate), assigned={TP0, TP1})
    await world.table.assigned({TP0})
    for _ in range(20):
        await asyncio.sleep(0)
    assert world.table.tasks[TP0].state is S.RESTORING
    world.table.observe()
    assert _gauge(world, "store_keys", TP0) is None
    gate.set()
    await world.opened()
    world.table.observe()
    world.table.observe()  # the second measure is within the disk period: kept, not redone
    assert _gauge(world, "store_keys", TP0) == 0.0
    task = world.table.tasks[TP0]
    assert task.disk_measured_at > 0
    assert world.table.served_stores() == {(INPUT, 0): task.store}
    assert task.store is not None
    assert world.table.positions() == {TP0: task.store.changelog_offset}
    await world.table.close()


async def test_a_partition_far_behind_the_clock_is_warned_about_once_per_period(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """Stream time years behind the clock: one warning, not one per observation."""
    await world.table.assigned({TP0})
    await world.opened()
    h = world.harness
    h.tasks[TP0] = world.table.tasks[TP0]
    await h.handle_and_commit([record(0, K[0])])
    caplog.set_level(logging.WARNING, logger="pipeline.worker.observe")
    world.table.observe()
    world.table.observe()
    behind = [r for r in caplog.records if "behind the clock" in r.getMessage()]
    assert len(behind) == 1


async def test_an_aborted_transaction_rewinds_serving_assigned_tasks_then_rejoins_and_fails(
    world: World,
) -> None:
    """Apply: a serving task goes back and the consumer seeks it; the rejoin and the fatal error are passed on."""
    await world.table.assigned({TP0})
    await world.opened()
    fatal = PartitionUnservedError("partition gone")
    world.table.apply(Outcome(rewind={TP0: 7, TP1: 3}, rejoin=True, fatal=fatal))
    assert world.consumer.seeks[-1] == (TP0, 7)
    assert all(where != TP1 for where, _ in world.consumer.seeks)
    assert world.table.tasks[TP0].position == 7
    assert world.group.rejoins == 1
    assert world.table.failure is fatal


async def test_a_broken_task_is_closed_and_reopened_only_while_still_assigned(world: World) -> None:
    """Reaping: a BROKEN task assigned here is replaced by a new one opening; one no longer assigned is only closed."""
    await world.table.assigned({TP0, TP1})
    await world.opened()
    broken0, broken1 = world.table.tasks[TP0], world.table.tasks[TP1]
    broken0.lifecycle.move(S.BROKEN)
    broken1.lifecycle.move(S.BROKEN)
    world.consumer.assigned = {TP0}
    world.table.reap()
    assert broken0.state is S.CLOSED
    assert broken1.state is S.CLOSED
    assert set(world.table.tasks) == {TP0}
    assert world.table.tasks[TP0] is not broken0
    assert set(world.table.opening) == {TP0}
    assert {TP0, TP1} <= world.consumer.paused
    await world.opened()
    assert world.table.tasks[TP0].state is S.READY


async def test_a_task_is_paused_once_its_queue_is_full_and_resumed_once_it_drained(tmp_path: Path) -> None:
    """Backpressure at poll_records queued records: paused in the consumer, then resumed when the queue empties."""
    world = _world(tmp_path, assigned={TP0}, poll_records=2)
    await world.table.assigned({TP0})
    await world.opened()
    task = world.table.tasks[TP0]
    world.table.feed({TP0: [record(0, K[0])], TP1: [record(0, K[1], partition=1)]})
    world.table.backpressure()
    assert (task.paused, TP0 in world.consumer.paused) == (False, False)
    world.table.feed({TP0: [record(1, K[1])]})
    world.table.backpressure()
    assert (task.paused, TP0 in world.consumer.paused) == (True, True)
    task.rewind(0)
    world.table.backpressure()
    assert (task.paused, world.consumer.events[-1]) == (False, ("resume", TP0))
    await world.table.close()


async def test_closing_the_table_cancels_openings_and_closes_every_task(tmp_path: Path) -> None:
    """close(): an opening is cancelled, every task closed and gone, and nothing opens after."""
    world = _world(tmp_path, reader=FakeReader(asyncio.Event()), assigned={TP0, TP1})
    await world.table.assigned({TP0, TP1})
    await asyncio.sleep(0)
    tasks = dict(world.table.tasks)
    await world.table.close()
    assert all(t.state is S.CLOSED for t in tasks.values())
    assert (world.table.tasks, world.table.opening, world.table.stopping) == ({}, {}, True)
    await world.table.assigned({TP0})
    assert world.table.tasks == {}


def _state(task: ActiveTask) -> PartitionState:
    """The task's state, read anew (mypy keeps an earlier assert's narrowing across awaits: python/mypy#11969)."""
    return task.state


def _paused(task: ActiveTask) -> bool:
    """Whether the task is marked paused, read anew."""
    return task.paused


def _failure(table: TaskTable) -> PipelineError | None:
    """What stops the worker, read anew."""
    return table.failure


def _gauge(world: World, name: str, where: TopicPartition) -> float | None:
    gauge = getattr(world.harness.metrics, name)
    for metric in gauge.collect():
        for sample in metric.samples:
            if sample.labels.get("partition") == str(where.partition):
                return float(sample.value)
    return None
