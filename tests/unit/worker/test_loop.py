"""The worker loop over a stand-in consumer and producers: assignment, positioning, health and shutdown.

The consumer (:class:`FakeConsumer`) hands its assignment to the worker's
rebalance listener from inside the first poll, as aiokafka's does; partitions
open for real (RocksDB in tmp_path) over fake transactional producers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaConnectionError, MessageSizeTooLargeError, ProducerFenced

from pipeline.cli import services
from pipeline.errors import (
    BrokerUnavailableError,
    PartitionUnservedError,
    ProducerFencedError,
    UnstableOffsetsError,
)
from pipeline.state.directory import store_path
from pipeline.state.store import PartitionStore, bucket_width
from pipeline.state.store_meta import StoreIdentity
from pipeline.worker import identity as identity_module
from pipeline.worker import loop as loop_module
from pipeline.worker import opening as opening_module
from pipeline.worker.assignor import decode_claim
from pipeline.worker.executor import TaskExecutor
from pipeline.worker.fetch import LoopFetch
from pipeline.worker.identity import FENCE_WINDOW_S, FENCES_ALLOWED
from pipeline.worker.lifecycle import PartitionState
from pipeline.worker.loop import Worker
from pipeline.worker.pacing import poll_ms
from pipeline.worker.task import ActiveTask

from .fakes import (
    INPUT,
    TOPICS,
    TOPOLOGY,
    Clients,
    FakeConsumer,
    FakeProducer,
    FakeReader,
    body,
    fake_io,
    keys_for,
    record,
    records,
    settings,
    tp,
)

S = PartitionState
GROUP = "webhooks"  # the default topology's app name: the default group
TP0, TP1, TP2 = tp(0), tp(1), tp(2)
BUCKET_MS = bucket_width(int(TOPOLOGY.max_ttl.total_seconds() * 1000))


async def eventually(condition: Callable[[], bool], *, timeout: float = 3.0, what: str = "") -> None:
    """Wait until ``condition()`` holds; fail after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        await asyncio.sleep(0.005)


def _logs(count: int = 3, first: int = 0) -> dict[TopicPartition, list[Any]]:
    """``count`` records with new keys on each of input partitions 0, 1 and 2, from offset ``first``."""
    return {tp(p): records(p, first, keys_for(p, count)) for p in (0, 1, 2)}


def _conflicting_store(state_dir: Path, partition: TopicPartition) -> None:
    """Put a store that belongs to another partition where ``partition``'s store goes."""
    other = StoreIdentity(TOPOLOGY.app, GROUP, INPUT, partition.partition + 1, TOPICS.changelog)
    path = store_path(state_dir, TOPOLOGY, GROUP, partition)
    PartitionStore.open(path, bucket_ms=BUCKET_MS, identity=other).close()


def _part(worker: Worker, tp: TopicPartition) -> ActiveTask | None:
    """The task ``worker`` has for ``tp``, if any."""
    return worker.tasks.get(tp)


class Running:
    """A started worker over fakes, and its ``run()`` as a task."""

    def __init__(self, worker: Worker, clients: Clients) -> None:
        self.worker = worker
        self.clients = clients
        self.task: asyncio.Task[None] | None = None

    @property
    def consumer(self) -> FakeConsumer:
        return self.clients.consumer

    @property
    def producer(self) -> FakeProducer:
        """The worker's producer (the latest, after a replacement)."""
        return self.clients.producers.latest()

    def states(self) -> dict[int, PartitionState]:
        return {t.partition: task.state for t, task in self.worker.tasks.items()}

    def run(self) -> asyncio.Task[None]:
        self.task = asyncio.create_task(self.worker.run())
        return self.task

    async def stop(self) -> None:
        """A clean stop (SIGTERM): run() returns."""
        self.worker.stop()
        if self.task is not None:
            await asyncio.wait_for(self.task, 5)


Starter = Callable[..., Any]


@pytest.fixture
async def start_worker(tmp_path: Path) -> AsyncIterator[Starter]:
    """Start a Worker over a FakeConsumer (``assign``, ``committed``, ``logs``), a fake producer and changelog."""
    started: list[Running] = []

    async def start(
        *,
        assign: set[TopicPartition],
        committed: dict[TopicPartition, int] | None = None,
        logs: dict[TopicPartition, list[Any]] | None = None,
        reader: FakeReader | None = None,
        limits: dict[str, str] | None = None,
        **overrides: Any,
    ) -> Running:
        consumer = FakeConsumer(assign=assign, committed=committed, logs=logs)
        io, clients = fake_io(reader=reader, consumer=consumer, limits=limits)
        # transactions stay open until the test acts, unless it asks for another policy
        values = {
            "commit_interval": 60.0,
            "transaction_timeout": 120.0,
            "commit_policy": "interval",
            "open_timeout": 5.0,
            **overrides,
        }
        worker = Worker(settings(tmp_path, **values), TOPOLOGY, io=io)
        await worker.start()
        running = Running(worker, clients)
        started.append(running)
        return running

    yield start
    for running in started:  # whatever a test left running is stopped (and its task awaited)
        running.worker.stop()
        if running.task is not None:
            await asyncio.gather(running.task, return_exceptions=True)
        elif running.worker._consumer is not None:
            await running.worker.run()


async def test_the_worker_subscribes_to_the_input_topic_at_start(start_worker: Starter) -> None:
    """start() joins the group on the input topic with the worker's rebalance listener; nothing is assigned yet."""
    w = await start_worker(assign=set())
    assert w.consumer.started
    assert w.consumer.topics == [INPUT]
    assert w.consumer.listener is not None
    assert w.worker.health()[0]  # nothing assigned, nothing unserved


async def test_assigned_partitions_open_concurrently_paused_then_seek_to_committed_and_resume(
    start_worker: Starter,
) -> None:
    """Three partitions restore at once; each stays paused until READY, then moves to its committed offset (or the beginning) and resumes."""
    gate = asyncio.Event()
    reader = FakeReader(gate)
    w = await start_worker(
        assign={TP0, TP1, TP2},
        committed={TP0: 1, TP2: 2},
        logs=_logs(3),
        reader=reader,
        restore_budget_bytes=256 * 1024 * 1024,  # room for the three restores at once
    )
    w.run()
    await eventually(lambda: len(reader.entered) == 3, what="all three partitions restoring")
    assert w.states() == {0: S.RESTORING, 1: S.RESTORING, 2: S.RESTORING}  # none waited for another
    assert {TP0, TP1, TP2} <= w.consumer.paused
    assert w.consumer.seeks == []
    assert w.producer.calls == ["start"]  # the worker's producer started; no record handled before READY

    gate.set()
    await eventually(lambda: not w.consumer.paused, what="all three partitions resumed")
    assert w.states() == {0: S.READY, 1: S.READY, 2: S.READY}
    assert sorted(w.consumer.seeks, key=lambda s: s[0].partition) == [
        (TP0, 1),
        (TP1, "beginning"),
        (TP2, 2),
    ]
    for p in (TP0, TP1, TP2):  # positioned before resumed
        mine = [event for event, where in w.consumer.events if where == p]
        assert mine.index("seek") < len(mine) - 1 - mine[::-1].index("resume")
        assert mine[-1] == "resume"

    await eventually(
        lambda: all(t.queue == [] and t.part and t.part.records for t in w.worker.tasks.values())
    )
    await w.stop()
    audit: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for sent in w.producer.committed_to(TOPICS.audit):
        audit[sent.json()["partition"]].append(sent.json()["offset"])
    assert audit == {0: [1, 2], 1: [0, 1, 2], 2: [2]}  # from the committed offset on, nothing earlier
    assert w.producer.calls.count("commit") == 1  # one transaction for the three partitions


async def test_a_worker_restoring_is_alive_but_not_ready_and_ready_once_every_partition_is_served(
    start_worker: Starter,
) -> None:
    """/readyz: an assigned partition still restoring makes the worker not ready; /healthz: it is alive all along."""
    gate = asyncio.Event()
    reader = FakeReader(gate)
    w = await start_worker(assign={TP0, TP1}, reader=reader)
    w.run()
    await eventually(lambda: len(reader.entered) == 2)
    health = w.worker.health()
    assert not health.ready
    assert health.live  # a restart would only begin the restore again
    assert health.detail["status"] == "not ready"
    assert health.detail["partitions"] == {f"{INPUT}-0": "restoring", f"{INPUT}-1": "restoring"}
    assert len(health.detail["problems"]) == 2

    gate.set()
    await eventually(lambda: set(w.states().values()) == {S.READY})
    health = w.worker.health()
    assert health.ready
    assert health.live
    assert health.detail == {"status": "ok", "partitions": {f"{INPUT}-0": "ready", f"{INPUT}-1": "ready"}}
    w.worker.stop()
    stopping = w.worker.health()
    assert not stopping.ready  # no longer a place to send work to
    assert stopping.live  # committing what is open: a restart would abort it
    assert "the worker is stopping" in stopping.detail["problems"]
    await w.stop()
    assert w.worker.health() == (False, {"status": "stopped"}, False)


async def test_a_partition_that_cannot_open_makes_run_raise_partition_unserved(
    start_worker: Starter, tmp_path: Path
) -> None:
    """A store of another identity on one assigned partition: run() raises PartitionUnservedError and shuts down (aborting the rest)."""
    _conflicting_store(tmp_path, TP1)
    w = await start_worker(assign={TP0, TP1}, logs=_logs(2))
    with pytest.raises(PartitionUnservedError, match=f"{INPUT}-1"):
        await asyncio.wait_for(w.worker.run(), 5)
    assert w.consumer.stopped
    assert w.worker.tasks == {}
    assert "commit" not in w.producer.calls  # a stop after an exception never commits
    assert w.producer.stopped


async def test_the_service_stops_with_one_line_naming_the_partition_that_cannot_open(tmp_path: Path) -> None:
    """`pipeline worker` runs the worker as a service: an unservable partition ends it with a PartitionUnservedError
    whose one line names the partition (the CLI prints it and exits 1)."""
    _conflicting_store(tmp_path, TP1)
    io, _clients = fake_io(consumer=FakeConsumer(assign={TP1}))
    worker = Worker(settings(tmp_path, group=GROUP, open_timeout=5.0), TOPOLOGY, io=io)
    with pytest.raises(PartitionUnservedError) as failed:
        await asyncio.wait_for(services.run_service(worker), 10)
    assert str(failed.value).startswith(f"partition {INPUT}-1 cannot be served")
    assert "\n" not in str(failed.value)


async def test_run_raising_mid_batch_aborts_the_open_transactions(
    start_worker: Starter, tmp_path: Path
) -> None:
    """An exception out of the fetch after records were handled: run() re-raises, the open transaction is aborted, never committed."""
    w = await start_worker(assign={TP0}, logs=_logs(3))

    def fail_once_handled(_poll: int) -> None:
        part = _part(w.worker, TP0)
        if part is not None and part.part is not None and part.part.records == 3:
            raise RuntimeError("the fetch blew up")

    w.consumer.on_poll = fail_once_handled
    with pytest.raises(RuntimeError, match="blew up"):
        await asyncio.wait_for(w.worker.run(), 5)
    producer = w.producer
    assert "begin" in producer.calls
    assert "abort" in producer.calls
    assert "commit" not in producer.calls
    assert producer.committed == []
    assert producer.offsets == []
    assert producer.stopped
    assert w.consumer.stopped
    store = PartitionStore.open(store_path(tmp_path, TOPOLOGY, GROUP, TP0), bucket_ms=BUCKET_MS)
    try:  # nothing claimed, and the lock was released
        assert store.get_many([k.encode() for k in keys_for(0, 3)]) == {}
    finally:
        store.close()


async def test_a_clean_stop_commits_the_open_transaction(start_worker: Starter) -> None:
    """stop() (SIGTERM) after records were handled: run() returns, and the open transaction (both partitions)
    is committed, not aborted."""
    w = await start_worker(assign={TP0, TP1}, logs=_logs(3))

    def stop_once_handled(_poll: int) -> None:
        tasks = [_part(w.worker, p) for p in (TP0, TP1)]
        if all(t is not None and t.part is not None and t.part.records == 3 for t in tasks):
            w.worker.stop()

    w.consumer.on_poll = stop_once_handled
    await asyncio.wait_for(w.worker.run(), 5)
    producer = w.producer
    assert "abort" not in producer.calls
    assert sorted(producer.offsets, key=lambda o: o[0].partition) == [(TP0, 3, GROUP), (TP1, 3, GROUP)]
    for p in (0, 1):
        keys = [s.key.decode() for s in producer.committed_to(TOPICS.commands) if s.key]
        assert set(keys_for(p, 3)) <= set(keys)
    assert producer.calls.count("commit") == 1
    assert producer.stopped
    assert w.consumer.stopped


async def test_a_revocation_commits_the_open_transaction_before_the_callback_returns(
    start_worker: Starter,
) -> None:
    """Revocation commits what every partition of the transaction handled (so the next owners start after it),
    then closes the revoked task; the worker's producer stays."""
    w = await start_worker(assign={TP0}, logs=_logs(3))
    w.run()
    await eventually(
        lambda: (t := _part(w.worker, TP0)) is not None and t.part is not None and t.part.records == 3
    )
    task = w.worker.tasks[TP0]
    w.consumer.assigned.discard(TP0)
    await w.worker.partitions_revoked({TP0})
    producer = w.producer
    assert producer.offsets == [(TP0, 3, GROUP)]
    assert "abort" not in producer.calls
    assert not producer.stopped
    assert task.state is S.CLOSED
    assert TP0 not in w.worker.tasks
    await w.stop()


async def test_with_the_caught_up_policy_a_partition_commits_once_it_reached_the_end_of_its_log(
    start_worker: Starter,
) -> None:
    """commit_policy=caught-up: three records handled, nothing more to fetch: committed at once, not after the 60 s interval."""
    w = await start_worker(assign={TP0}, logs=_logs(3), commit_policy="caught-up")
    w.run()
    await eventually(lambda: (p := _part(w.worker, TP0)) is not None and p.serving)
    producer = w.producer
    await eventually(lambda: producer.offsets == [(tp(0), 3, GROUP)])
    assert [k.decode() for k in producer.committed_keys(TOPICS.commands) if k] == keys_for(0, 3)


async def test_records_that_came_during_a_slow_commit_are_handled_as_soon_as_it_ends(
    start_worker: Starter,
) -> None:
    """A commit (here 0.4 s long) holds the loop; what arrived meanwhile is fetched and committed right after it,
    not a fetch wait later."""
    w = await start_worker(assign={TP0}, logs={}, commit_policy="caught-up", commit_interval=4.0)
    w.run()
    await eventually(lambda: (t := _part(w.worker, TP0)) is not None and t.serving)
    producer = w.producer
    gate = producer.commit_gate = asyncio.Event()
    w.consumer.logs[TP0].extend(records(0, 0, keys_for(0, 3)))
    await eventually(lambda: any(c.startswith("offsets") for c in producer.calls), what="the first commit")
    w.consumer.logs[TP0].extend(records(0, 3, keys_for(0, 2, start=3)))
    w.consumer.max_wait_ms = 10_000  # from now on an empty fetch waits its whole timeout (2 s)
    await asyncio.sleep(0.4)
    gate.set()
    await eventually(
        lambda: producer.offsets == [(TP0, 3, GROUP), (TP0, 5, GROUP)], timeout=1.0, what="the second commit"
    )
    assert w.consumer.cancelled_fetches == 0  # a fetch is never cancelled: aiokafka's is not cancel-safe


async def test_stop_cuts_a_waiting_fetch_short(start_worker: Starter) -> None:
    """stop() on an idle worker returns from run() at once, not after the fetch's wait (10 s here)."""
    w = await start_worker(assign={TP0}, logs={}, commit_interval=20.0)
    task = w.run()
    await eventually(lambda: (p := _part(w.worker, TP0)) is not None and p.serving)
    w.consumer.max_wait_ms = 60_000
    await asyncio.sleep(0.05)  # the loop is in its fetch now
    began = time.monotonic()
    w.worker.stop()
    await asyncio.wait_for(task, 1.0)
    assert time.monotonic() - began < 1.0


@pytest.mark.parametrize(
    ("partitions", "expected"),
    [
        ([], 50),  # nothing waits: up to half the commit interval
        ([(PartitionState.READY, 0)], 50),
        ([(PartitionState.BROKEN, 3), (PartitionState.READY, 2)], 0),  # records to handle
        ([(PartitionState.OPENING, 3)], 50),
    ],
)
def test_the_fetch_does_not_wait_only_when_records_can_be_handled(
    partitions: list[tuple[PartitionState, int]], expected: int
) -> None:
    """The poll timeout: 0 with handleable records, else half the commit interval."""
    parts = [SimpleNamespace(can_work=st is PartitionState.READY and queued > 0) for st, queued in partitions]
    assert poll_ms(parts, commit_interval=0.1) == expected  # type: ignore[arg-type]


async def test_a_partition_revoked_while_it_reopens_leaves_the_table_and_is_not_positioned_after(
    start_worker: Starter,
) -> None:
    """A BROKEN task is reopened; the group revokes it mid-open (aiokafka still lists it until the sync): it
    leaves the table at once, its opening never moves the consumer afterwards, and a later assignment opens
    it again."""
    gate = asyncio.Event()
    reader = FakeReader(gate)
    w = await start_worker(assign={TP0}, logs=_logs(2), reader=reader)
    gate.set()
    w.run()
    await eventually(lambda: (t := _part(w.worker, TP0)) is not None and t.serving)
    task = w.worker.tasks[TP0]
    gate.clear()  # the reopen's restore will wait
    task.lifecycle.move(S.BROKEN)  # as a store failure leaves it
    await eventually(lambda: (t := _part(w.worker, TP0)) is not None and t is not task)
    reopening = w.worker.tasks[TP0]
    seeks_before = len(w.consumer.seeks)
    await w.worker.partitions_revoked({TP0})  # the consumer still lists TP0: a rebalance is under way
    assert TP0 not in w.worker.tasks
    assert reopening.state is S.CLOSED
    gate.set()
    await asyncio.sleep(0.05)
    assert len(w.consumer.seeks) == seeks_before  # the cancelled opening moved nothing
    assert TP0 not in w.worker.tasks  # not reopened while the group rebalances
    await w.worker.partitions_assigned({TP0})
    await eventually(lambda: (t := _part(w.worker, TP0)) is not None and t.serving)
    await w.stop()


async def test_a_fenced_producer_is_replaced_and_the_worker_rejoins_its_group(start_worker: Starter) -> None:
    """The producer is fenced at a commit (the broker aborted a transaction open past its timeout): nothing
    committed, a new producer with the same transactional id, and the worker rejoins its group; its
    partitions are redone from their committed offsets."""
    w = await start_worker(assign={TP0}, logs=_logs(2), commit_policy="caught-up")
    w.producer.fail["commit"].append(ProducerFenced())  # the first commit finds it fenced
    w.run()
    await eventually(lambda: w.clients.group.rejoins == 1, what="the rejoin")
    made = next(iter(w.clients.producers.made.values()))
    assert len(made) == 2  # the fenced one, then a new one with the same id
    assert made[0].stopped
    await eventually(lambda: w.producer.offsets == [(TP0, 2, GROUP)], what="the redo committed")
    assert [k.decode() for k in w.producer.committed_keys(TOPICS.commands) if k] == keys_for(0, 2)
    await w.stop()


async def test_a_fence_answering_a_commit_that_took_reopens_the_partition_and_redoes_nothing(
    start_worker: Starter,
) -> None:
    """The broker committed, then the producer learned it was fenced (seed 23108): the partition reopens from
    its committed offset, so each record has one command, and no second transaction commits its offsets."""
    w = await start_worker(assign={TP0}, logs=_logs(2), commit_policy="caught-up")
    w.producer.fail_after["commit"].append(ProducerFenced())
    w.producer.group_offsets = w.consumer.committed_offsets  # the group's offsets follow a commit that takes
    w.run()
    await eventually(lambda: w.clients.group.rejoins == 1, what="the rejoin")
    await eventually(lambda: (t := _part(w.worker, TP0)) is not None and t.serving, what="the reopen")
    await asyncio.sleep(0.2)
    assert [k.decode() for k in w.producer.committed_keys(TOPICS.commands) if k] == keys_for(0, 2)
    assert w.producer.offsets == [(TP0, 2, GROUP)]
    await w.stop()


async def test_the_loop_yields_every_cycle_so_a_commit_runs_while_records_wait(start_worker: Starter) -> None:
    """A partition held at its bisecting limit with records queued: the loop still yields, so the due commit runs
    (a fetch that does not wait never yields in aiokafka: the worker spun forever)."""
    w = await start_worker(assign={TP0}, logs={TP0: []}, commit_policy="interval", commit_interval=60.0)
    w.run()
    await eventually(lambda: (p := _part(w.worker, TP0)) is not None and p.serving)
    part = w.worker.tasks[TP0]
    part.poison.limit = 1  # as after a refusal: one record per transaction, up to offset 4
    part.poison._until = 4
    w.consumer.logs[TP0].extend(records(0, 0, keys_for(0, 4)))
    await eventually(lambda: w.producer.committed_offset() == 4, timeout=3.0)
    await w.stop()


async def test_a_partition_is_paused_by_the_bytes_it_has_queued_not_only_by_their_count(
    start_worker: Starter,
) -> None:
    """Back-pressure counts bytes too: a few large records reaching --queue-bytes pause the partition while they
    wait (here, held at a bisecting limit of one record a transaction), though their count is far below
    --poll-records."""
    big = [record(i, key, value=body(key, pad=300_000)) for i, key in enumerate(keys_for(0, 6))]
    w = await start_worker(assign={TP0}, logs={TP0: []}, queue_bytes=1024 * 1024, poll_records=1000)
    w.run()
    await eventually(lambda: (t := _part(w.worker, TP0)) is not None and t.serving)
    task = w.worker.tasks[TP0]
    task.poison.limit = 1  # one record a transaction: the rest waits in the queue
    task.poison._until = 100
    gate = w.producer.commit_gate = asyncio.Event()  # ... while the first commit takes its time
    w.consumer.logs[TP0].extend(big)
    await eventually(lambda: TP0 in w.consumer.paused and task.queue != [])
    assert task.queued_bytes >= 1024 * 1024
    assert len(task.queue) < 1000
    gate.set()
    await eventually(lambda: TP0 not in w.consumer.paused, what="resumed once it drained")
    await w.stop()


async def test_a_broken_partition_found_as_a_rebalance_begins_is_not_reopened_for_the_old_assignment(
    start_worker: Starter,
) -> None:
    """A task is BROKEN when the group starts rebalancing (aiokafka still lists the old assignment until the
    sync): it is closed and not reopened meanwhile, and nothing of it stays in the table to be skipped when
    the group gives it back."""
    w = await start_worker(assign={TP0}, logs=_logs(2))
    w.run()
    await eventually(lambda: (t := _part(w.worker, TP0)) is not None and t.serving)
    task = w.worker.tasks[TP0]
    task.lifecycle.move(S.BROKEN)
    await w.worker.partitions_revoked(set())  # the rebalance begins (nothing revoked yet)
    await eventually(lambda: TP0 not in w.worker.tasks)  # the loop closed it...
    await asyncio.sleep(0.05)
    assert TP0 not in w.worker.tasks  # ... and did not reopen it for the old assignment
    assert task.state is S.CLOSED
    w.consumer.assigned.discard(TP0)  # the sync gave it to another worker
    await w.worker.partitions_assigned(set())
    w.consumer.assigned.add(TP0)  # ... and a later rebalance gives it back here
    await w.worker.partitions_assigned({TP0})
    await eventually(lambda: (t := _part(w.worker, TP0)) is not None and t.serving)
    await w.stop()


async def test_records_fetched_while_a_new_producer_cannot_start_are_handled_once_it_does(
    start_worker: Starter,
) -> None:
    """The producer is fenced and its replacement cannot start at once (the broker away): no record is fetched
    meanwhile, so none is dropped; once a producer starts, every record is committed (seed 242 kept a partition
    stuck behind records fetched and dropped)."""
    w = await start_worker(assign={TP0}, logs=_logs(2), commit_policy="caught-up")
    w.producer.fail["commit"].append(ProducerFenced())
    refusals = [KafkaConnectionError(), KafkaConnectionError()]  # two replacements fail, the third starts
    w.clients.producers.prepare = lambda p: p.fail["start"].extend(refusals[:1] and [refusals.pop()])
    w.run()
    await eventually(lambda: len(next(iter(w.clients.producers.made.values()))) >= 2, timeout=5.0)
    w.consumer.logs[TP0].extend(records(0, 2, keys_for(0, 4)[2:]))  # come while no producer can start
    await eventually(
        lambda: w.producer.offsets[-1:] == [(TP0, 4, GROUP)], timeout=8.0, what="all four committed"
    )
    assert [k.decode() for k in w.producer.committed_keys(TOPICS.commands) if k] == keys_for(0, 4)
    await w.stop()


async def test_a_producer_that_cannot_start_at_start_is_the_broker_unavailable(tmp_path: Path) -> None:
    """The broker goes away between the consumer's start and the producer's: the worker's start fails with
    BrokerUnavailableError (one line; a supervisor starts it again), not aiokafka's error (seed 483)."""
    io, clients = fake_io(consumer=FakeConsumer())
    clients.producers.prepare = lambda p: p.fail["start"].append(KafkaConnectionError("unable to bootstrap"))
    worker = Worker(settings(tmp_path), TOPOLOGY, io=io)
    with pytest.raises(BrokerUnavailableError, match="cannot reach Kafka"):
        await worker.start()
    assert clients.consumer.stopped


async def test_a_caught_up_transaction_lingers_for_more_records_then_commits_without_a_fetch_outwaiting_it(
    start_worker: Starter,
) -> None:
    """--commit-linger 0.3: records handled and caught up are committed 0.3 s after the transaction opened, with
    what came meanwhile, in one transaction; the loop's fetch (up to 2 s here) never delays that commit."""
    w = await start_worker(
        assign={TP0}, logs={}, commit_policy="caught-up", commit_interval=4.0, commit_linger=0.3
    )
    w.run()
    await eventually(lambda: (t := _part(w.worker, TP0)) is not None and t.serving)
    w.consumer.max_wait_ms = 10_000  # an empty fetch waits its whole timeout
    began = time.monotonic()
    w.consumer.logs[TP0].extend(records(0, 0, keys_for(0, 4)[:2]))
    await asyncio.sleep(0.1)
    w.consumer.logs[TP0].extend(records(0, 2, keys_for(0, 4)[2:]))
    await eventually(lambda: w.producer.offsets != [], timeout=2.0, what="the commit")
    took = time.monotonic() - began
    assert w.producer.offsets == [(TP0, 4, GROUP)]  # one transaction, all four records
    assert 0.3 <= took < 0.9
    await w.stop()


async def test_a_partition_whose_old_id_cannot_be_fenced_yet_opens_once_the_broker_answers(
    start_worker: Starter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker is away when a partition opens (the old per-partition id's fence times out): the step is
    retried, the partition opens, and the old id is fenced (seed 5842: the opening died silently and the
    partition stayed unserved until the worker gave up)."""
    monkeypatch.setattr(opening_module, "BACKOFF_FIRST", 0.01)
    w = await start_worker(assign=set(), logs=_logs(2))
    w.clients.fence_refusals.append(BrokerUnavailableError("cannot fence: the broker is away"))
    w.consumer.to_assign = {TP0}
    w.run()
    await eventually(lambda: (t := _part(w.worker, TP0)) is not None and t.serving, what="served")
    assert w.clients.fenced == [f"{TOPOLOGY.app}-{GROUP}-{INPUT}-0"]
    await w.stop()


async def test_a_committed_offset_that_stays_unreadable_stops_the_worker_with_one_line(
    tmp_path: Path,
) -> None:
    """A transaction keeps holding a partition's offsets past --open-timeout: the worker stops with one line naming
    the partition, never idles with the partition unserved."""
    io, clients = fake_io(consumer=FakeConsumer(assign={TP0}))
    worker = Worker(settings(tmp_path, open_timeout=0.3), TOPOLOGY, io=io)
    await worker.start()
    clients.group.refusals.extend(UnstableOffsetsError("held by a pending transaction") for _ in range(100))
    with pytest.raises(PartitionUnservedError, match=f"partition {INPUT}-0 cannot be served"):
        await asyncio.wait_for(worker.run(), 10)


async def test_a_topic_limit_lowered_under_the_worker_is_read_again_after_one_refusal_and_the_rest_dead_lettered_up_front(
    start_worker: Starter,
) -> None:
    """The command topic's max.message.bytes falls below the commands' size while the worker runs: the first
    refused transaction makes the worker read the limits again, and the redo dead-letters every record too
    large by the size check (too-large, keys unclaimed), with no further refusal (seed 3276: each record cost one
    or two refused transactions and a new producer)."""
    limits: dict[str, str] = {}
    keys = keys_for(0, 6)
    w = await start_worker(
        assign={TP0}, logs={}, limits=limits, commit_policy="caught-up", commit_interval=4.0
    )
    w.run()
    await eventually(lambda: (t := _part(w.worker, TP0)) is not None and t.serving)
    limits[TOPICS.commands] = "5000"  # lowered on the broker after the worker read its layout
    w.producer.fail_commit_if = lambda sent: next(
        (MessageSizeTooLargeError() for s in sent if s.topic == TOPICS.commands and len(s.value) > 5000),
        None,
    )
    w.consumer.logs[TP0].extend(record(i, key, value=body(key, pad=6000)) for i, key in enumerate(keys))
    await eventually(lambda: w.producer.committed_offset() == 6, timeout=5.0, what="all six committed")
    assert w.producer.calls.count("abort") == 1  # the one refusal that taught the worker the new limit
    assert [(d["offset"], d["reason"]) for d in w.producer.dlq()] == [(i, "too-large") for i in range(6)]
    assert w.producer.committed_keys(TOPICS.commands) == []
    await w.stop()


async def test_limits_that_cannot_be_read_again_leave_the_refused_records_to_the_bisection(
    tmp_path: Path,
) -> None:
    """The broker is away when the worker reads the limits again: it keeps those it had, and the refused record
    still reaches the DLQ alone (unproducible) by the bisection; the others commit."""
    io, clients = fake_io(consumer=FakeConsumer(assign={TP0}, logs={}))
    first_layout = io.layout

    async def layout_once(bootstrap: str, topology: Any) -> Any:
        if clients.consumer.started:
            raise KafkaConnectionError("the broker is away")
        return await first_layout(bootstrap, topology)

    io = dataclasses.replace(io, layout=layout_once)
    worker = Worker(settings(tmp_path, commit_policy="caught-up", commit_interval=4.0), TOPOLOGY, io=io)
    await worker.start()
    w = Running(worker, clients)
    w.run()
    await eventually(lambda: (t := _part(worker, TP0)) is not None and t.serving)
    keys = keys_for(0, 4)
    w.producer.fail_commit_if = lambda sent: next(
        (MessageSizeTooLargeError() for s in sent if s.topic == TOPICS.commands and len(s.value) > 5000), None
    )
    w.consumer.logs[TP0].extend(
        record(i, key, value=body(key, pad=6000 if i == 2 else 0)) for i, key in enumerate(keys)
    )
    await eventually(lambda: w.producer.committed_offset() == 4, timeout=5.0, what="all four committed")
    assert [(d["offset"], d["reason"]) for d in w.producer.dlq()] == [(2, "unproducible")]
    assert [k.decode() for k in w.producer.committed_keys(TOPICS.commands) if k] == [
        k for i, k in enumerate(keys) if i != 2
    ]
    assert w.task is not None
    assert not w.task.done()  # the worker goes on
    await w.stop()


# -- what the loop asks of its fetch, its HTTP endpoint, its group metadata --------------------------


class RecordingFetch(LoopFetch):
    """The loop's fetch, noting how each call was asked: (wait_ms, hurry, gather)."""

    asks: list[tuple[int, bool, bool]]

    async def next(
        self, consumer: Any, wait_ms: int, *, hurry: bool = False, gather: bool = False
    ) -> dict[TopicPartition, list[Any]]:
        self.asks.append((wait_ms, hurry, gather))
        return await super().next(consumer, wait_ms, hurry=hurry, gather=gather)


@pytest.fixture
def fetch_asks(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, bool, bool]]:
    """Every (wait_ms, hurry, gather) the worker's loop asks its fetch for, in order."""
    asks: list[tuple[int, bool, bool]] = []
    monkeypatch.setattr(RecordingFetch, "asks", asks, raising=False)
    monkeypatch.setattr(loop_module, "LoopFetch", RecordingFetch)
    return asks


async def test_nothing_is_fetched_while_a_new_producer_cannot_start_and_a_stop_meanwhile_hurries_the_fetch(
    start_worker: Starter, fetch_asks: list[tuple[int, bool, bool]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fenced, then two replacements fail: the consumer is not polled until one starts; a stop() arriving while it
    starts makes that cycle's fetch a hurried one (it does not wait)."""
    monkeypatch.setattr(loop_module, "PRODUCER_RETRY_S", 0.001)
    w = await start_worker(assign={TP0}, logs=_logs(2), commit_policy="caught-up")
    w.producer.fail["commit"].append(ProducerFenced())
    polls_at_attempt: list[int] = []

    def prepare(producer: FakeProducer) -> None:
        polls_at_attempt.append(w.consumer.polls)
        if len(polls_at_attempt) < 3:
            producer.fail["start"].append(KafkaConnectionError())
        else:
            w.worker.stop()

    w.clients.producers.prepare = prepare
    await asyncio.wait_for(w.worker.run(), 5)
    assert len(polls_at_attempt) == 3
    assert len(set(polls_at_attempt)) == 1  # not one fetch between the fence and the new producer
    assert fetch_asks[-1][1] is True


async def test_a_lingering_transaction_gathers_what_comes_in_one_fetch(
    start_worker: Starter, fetch_asks: list[tuple[int, bool, bool]]
) -> None:
    """While a caught-up transaction lingers, the loop asks for a gathering fetch (never while hurried or not waiting)."""
    w = await start_worker(
        assign={TP0}, logs={}, commit_policy="caught-up", commit_interval=4.0, commit_linger=0.2
    )
    w.run()
    await eventually(lambda: (t := _part(w.worker, TP0)) is not None and t.serving)
    w.consumer.logs[TP0].extend(records(0, 0, keys_for(0, 2)))
    await eventually(lambda: w.producer.offsets != [], what="the commit")
    gathering = [ask for ask in fetch_asks if ask[2]]
    assert gathering
    assert all(wait > 0 and not hurry for wait, hurry, _ in gathering)
    await w.stop()


async def test_a_fetch_waits_until_the_open_transaction_is_due_and_not_at_all_once_it_is(
    start_worker: Starter, fetch_asks: list[tuple[int, bool, bool]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Due in 2.5 s (the poll wait being 30 s): the fetch waits 2500 ms; overdue: 0 ms."""
    due = {"in": 2.5}
    real_due_in = TaskExecutor.due_in

    def due_in(self: TaskExecutor, tasks: Any) -> float | None:
        return None if real_due_in(self, tasks) is None else due["in"]

    monkeypatch.setattr(TaskExecutor, "due_in", due_in)
    w = await start_worker(assign={TP0}, logs=_logs(2), commit_policy="interval", commit_interval=60.0)
    w.run()
    await eventually(
        lambda: (t := _part(w.worker, TP0)) is not None and t.part is not None and t.part.records == 2
    )
    await eventually(lambda: len(fetch_asks) >= 3)
    assert 2500 in {wait for wait, _, _ in fetch_asks}
    due["in"] = -0.5
    await eventually(lambda: w.producer.offsets != [], what="the overdue commit")
    assert {wait for wait, _, _ in fetch_asks} <= {0, 2500, 30_000}
    await w.stop()


async def test_the_worker_serves_its_http_endpoint_on_the_host_and_port_it_is_given(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """--metrics-port: /metrics, /healthz, /readyz, /partitions and /keys/{key} answer for this worker, on
    --http-host only."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.2", 0))
        port = probe.getsockname()[1]
    io, clients = fake_io(consumer=FakeConsumer(assign={TP0}, logs=_logs(2)))
    worker = Worker(settings(tmp_path, metrics_port=port, http_host="127.0.0.2"), TOPOLOGY, io=io)
    with caplog.at_level(logging.INFO, logger="pipeline.worker.loop"):
        await worker.start()
    assert f"metrics and inspect endpoint on port {port}" in caplog.text
    w = Running(worker, clients)
    w.run()
    try:
        await eventually(lambda: (t := _part(worker, TP0)) is not None and t.serving)
        await eventually(lambda: w.producer.committed_offset() == 2, what="the commit")
        base = f"http://127.0.0.2:{port}"
        key = keys_for(0, 1)[0]
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/metrics") as answer:
                assert answer.status == 200
                assert "pipeline_" in await answer.text()
            for probe_path in ("/healthz", "/readyz"):
                async with http.get(base + probe_path) as answer:
                    assert (answer.status, await answer.json()) == (
                        200,
                        {"status": "ok", "partitions": {f"{INPUT}-0": "ready"}},
                    )
            async with http.get(f"{base}/partitions") as answer:
                assert await answer.json() == {"partitions": {INPUT: [0]}, "standby": {}, "standbys": {}}
            async with http.get(f"{base}/keys/{key}") as answer:
                found = await answer.json()
                assert (answer.status, found["owned"], found["partition"], found["known"]) == (
                    200,
                    True,
                    0,
                    True,
                )
            async with http.get(f"{base}/keys/{keys_for(1, 1)[0]}") as answer:
                assert answer.status == 404  # partition 1's key: not owned here
            with pytest.raises(aiohttp.ClientConnectionError):
                await http.get(f"http://127.0.0.1:{port}/healthz")
    finally:
        await w.stop()


async def test_the_worker_claims_its_served_partitions_store_positions_in_its_group_metadata(
    tmp_path: Path,
) -> None:
    """What the worker's assignor tells the group: each served partition's store at its changelog position."""
    assignors: list[Any] = []
    io, clients = fake_io(consumer=FakeConsumer(assign={TP0}, logs=_logs(2)))

    def consumer(_settings: Any, *, assignor: Any) -> FakeConsumer:
        assignors.append(assignor)
        return clients.consumer

    io = dataclasses.replace(io, consumer=consumer)
    worker = Worker(settings(tmp_path, commit_policy="caught-up"), TOPOLOGY, io=io)
    assert worker.standby_partitions() == set()
    await worker.start()
    w = Running(worker, clients)
    w.run()
    try:
        await eventually(lambda: w.producer.committed_offset() == 2, what="the commit")
        store = worker.tasks[TP0].store
        assert store is not None
        metadata = assignors[0].metadata([INPUT])
        claim = decode_claim(metadata.subscription, metadata.user_data)
        assert claim.positions == {TP0: store.changelog_offset}
        assert worker.standby_partitions() == set()
    finally:
        await w.stop()


async def test_a_failed_worker_is_not_alive(start_worker: Starter, tmp_path: Path) -> None:
    """A partition that cannot be served fails the worker: /healthz says so (not alive, the failure named)."""
    _conflicting_store(tmp_path, TP1)
    w = await start_worker(assign=set())
    w.consumer.assigned.add(TP1)
    await w.worker.partitions_assigned({TP1})
    await eventually(lambda: not w.worker.health().live, what="the failure")
    health = w.worker.health()
    assert health.detail["status"] == "unhealthy"
    assert "the worker failed and is stopping" in health.detail["problems"]
    with pytest.raises(PartitionUnservedError):
        await asyncio.wait_for(w.worker.run(), 5)


async def test_a_revocation_while_a_new_producer_cannot_start_aborts_and_closes_the_partition(
    start_worker: Starter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fenced and no producer can start yet: a revocation aborts what is open (nothing to commit through) and
    closes the revoked task."""
    monkeypatch.setattr(loop_module, "PRODUCER_RETRY_S", 0.001)
    w = await start_worker(assign={TP0}, logs=_logs(2), commit_policy="caught-up")
    w.producer.fail["commit"].append(ProducerFenced())
    broker_away = [True]
    w.clients.producers.prepare = lambda p: p.fail["start"].extend(
        [KafkaConnectionError()] if broker_away[0] else []
    )
    w.run()
    await eventually(
        lambda: len(next(iter(w.clients.producers.made.values()))) >= 3, what="failed replacements"
    )
    task = w.worker.tasks[TP0]
    w.consumer.assigned.discard(TP0)
    await w.worker.partitions_revoked({TP0})
    assert task.state is S.CLOSED
    assert TP0 not in w.worker.tasks
    assert w.producer.calls.count("commit") == 1  # the fenced one: nothing committed since
    broker_away[0] = False
    await w.stop()


@pytest.mark.parametrize(("apart", "fails"), [(1.0, True), (FENCE_WINDOW_S / 4, False)])
async def test_five_fences_within_the_window_stop_the_worker_naming_the_transactional_id(
    start_worker: Starter, monkeypatch: pytest.MonkeyPatch, apart: float, fails: bool
) -> None:
    """Five fences within 60 s stop the worker with one line naming its transactional id; five spread over
    exactly 60 s (15 s apart) never add up, and the sixth commit goes through."""
    clock = iter(1000.0 + apart * i for i in range(100))
    monkeypatch.setattr(identity_module, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    w = await start_worker(assign={TP0}, logs=_logs(2), commit_policy="caught-up")
    w.producer.fail["commit"].extend(ProducerFenced() for _ in range(FENCES_ALLOWED))
    if fails:
        with pytest.raises(ProducerFencedError) as raised:
            await asyncio.wait_for(w.worker.run(), 5)
        assert str(raised.value) == (
            f"the producer was fenced 5 times in 60s: another process uses transactional id "
            f"{w.worker.transactional_id} (the same --instance-id, or the same host and state dir)"
        )
        assert w.producer.offsets == []
    else:
        w.run()
        await eventually(lambda: w.producer.offsets == [(TP0, 2, GROUP)], what="the sixth commit")
        assert w.clients.group.rejoins == FENCES_ALLOWED
        await w.stop()
