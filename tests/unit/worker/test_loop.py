"""The worker loop over a stand-in consumer and producers: assignment, positioning, health and shutdown.

The consumer (:class:`FakeConsumer`) hands its assignment to the worker's
rebalance listener from inside the first poll, as aiokafka's does; partitions
open for real (RocksDB in tmp_path) over fake transactional producers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition

from pipeline import cli
from pipeline.errors import PartitionUnservedError
from pipeline.state.directory import store_path
from pipeline.state.store import PartitionStore, bucket_width
from pipeline.state.store_meta import StoreIdentity
from pipeline.worker.lifecycle import PartitionState
from pipeline.worker.loop import Worker
from pipeline.worker.pacing import poll_ms
from pipeline.worker.partition import Partition

from .fakes import (
    INPUT,
    TOPICS,
    TOPOLOGY,
    TOPOLOGY_PATH,
    Clients,
    FakeConsumer,
    ProducerFactory,
    Restore,
    body,
    install,
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


def _part(worker: Worker, tp: TopicPartition) -> Partition | None:
    """The partition ``worker`` owns at ``tp``, if any."""
    owned = worker.owned.get(tp)
    return owned.part if owned is not None else None


class Running:
    """A started worker over fakes, and its ``run()`` as a task."""

    def __init__(self, worker: Worker, clients: Clients) -> None:
        self.worker = worker
        self.clients = clients
        self.task: asyncio.Task[None] | None = None

    @property
    def consumer(self) -> FakeConsumer:
        return self.clients.consumer

    def states(self) -> dict[int, PartitionState]:
        return {t.partition: p.state for t, p in ((t, o.part) for t, o in self.worker.owned.items())}

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
async def start_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Starter]:
    """Start a Worker over a FakeConsumer (``assign``, ``committed``, ``logs``) and fake producers."""
    started: list[Running] = []

    async def start(
        *,
        assign: set[TopicPartition],
        committed: dict[TopicPartition, int] | None = None,
        logs: dict[TopicPartition, list[Any]] | None = None,
        restore: Restore | None = None,
        **overrides: Any,
    ) -> Running:
        consumer = FakeConsumer(assign=assign, committed=committed, logs=logs)
        clients = install(monkeypatch, producers=ProducerFactory(), restore=restore, consumer=consumer)
        # transactions stay open until the test acts, unless it asks for another policy
        values = {"commit_interval": 60.0, "commit_policy": "interval", "open_timeout": 5.0, **overrides}
        worker = Worker(settings(tmp_path, **values), TOPOLOGY)
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
    restore = Restore(gate)
    w = await start_worker(
        assign={TP0, TP1, TP2},
        committed={TP0: 1, TP2: 2},
        logs=_logs(3),
        restore=restore,
    )
    w.run()
    await eventually(lambda: len(restore.entered) == 3, what="all three partitions restoring")
    assert w.states() == {0: S.RESTORING, 1: S.RESTORING, 2: S.RESTORING}  # none waited for another
    assert {TP0, TP1, TP2} <= w.consumer.paused
    assert w.consumer.seeks == []
    assert w.clients.producers.of(0).calls == ["start"]  # no record handled before READY

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
        lambda: all(
            pt.queue == [] and pt.txn and pt.txn.records for pt in (o.part for o in w.worker.owned.values())
        )
    )
    await w.stop()
    audit = {
        p: sorted(s.json()["offset"] for s in w.clients.producers.of(p).committed_to(TOPICS.audit))
        for p in (0, 1, 2)
    }
    assert audit == {0: [1, 2], 1: [0, 1, 2], 2: [2]}  # from the committed offset on, nothing earlier


async def test_a_worker_restoring_is_alive_but_not_ready_and_ready_once_every_partition_is_served(
    start_worker: Starter,
) -> None:
    """/readyz: an assigned partition still restoring makes the worker not ready; /healthz: it is alive all along."""
    gate = asyncio.Event()
    restore = Restore(gate)
    w = await start_worker(assign={TP0, TP1}, restore=restore)
    w.run()
    await eventually(lambda: len(restore.entered) == 2)
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
    assert w.worker.owned == {}
    for producer in w.clients.producers.made.get(f"{TOPOLOGY.app}-{GROUP}-{INPUT}-0", []):
        assert "commit" not in producer.calls  # a stop after an exception never commits
        assert producer.stopped


def test_the_cli_exits_non_zero_with_one_line_when_a_partition_cannot_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`pipeline worker` with an unservable partition exits 1 and says which partition on one stderr line."""
    _conflicting_store(tmp_path, TP1)
    install(monkeypatch, consumer=FakeConsumer(assign={TP1}))
    monkeypatch.setattr(cli, "tune_gc", lambda: None)  # leave this process's collector alone
    status = cli.main(
        [
            "worker",
            "--bootstrap=x",
            f"--topology={TOPOLOGY_PATH}",
            f"--state-dir={tmp_path}",
            f"--group={GROUP}",
            "--open-timeout=5",
        ]
    )
    assert status == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith(f"pipeline: error: partition {INPUT}-1 cannot be served")


async def test_run_raising_mid_batch_aborts_the_open_transactions(
    start_worker: Starter, tmp_path: Path
) -> None:
    """An exception out of the fetch after records were handled: run() re-raises, the open transaction is aborted, never committed."""
    w = await start_worker(assign={TP0}, logs=_logs(3))

    def fail_once_handled(_poll: int) -> None:
        part = _part(w.worker, TP0)
        if part is not None and part.txn is not None and part.txn.records == 3:
            raise RuntimeError("the fetch blew up")

    w.consumer.on_poll = fail_once_handled
    with pytest.raises(RuntimeError, match="blew up"):
        await asyncio.wait_for(w.worker.run(), 5)
    producer = w.clients.producers.of(0)
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


async def test_a_clean_stop_commits_the_open_transactions(start_worker: Starter) -> None:
    """stop() (SIGTERM) after records were handled: run() returns, and the open transaction is committed, not aborted."""
    w = await start_worker(assign={TP0, TP1}, logs=_logs(3))

    def stop_once_handled(_poll: int) -> None:
        parts = [_part(w.worker, p) for p in (TP0, TP1)]
        if all(p is not None and p.txn is not None and p.txn.records == 3 for p in parts):
            w.worker.stop()

    w.consumer.on_poll = stop_once_handled
    await asyncio.wait_for(w.worker.run(), 5)
    for p in (0, 1):
        producer = w.clients.producers.of(p)
        assert "abort" not in producer.calls
        assert producer.offsets == [(tp(p), 3, GROUP)]
        assert [k.decode() for k in producer.committed_keys(TOPICS.commands) if k] == keys_for(p, 3)
        assert producer.stopped
    assert w.consumer.stopped


async def test_a_revoked_partition_commits_its_open_transaction_before_the_callback_returns(
    start_worker: Starter,
) -> None:
    """Revocation commits what the partition handled (so its next owner starts after it), then releases it."""
    w = await start_worker(assign={TP0}, logs=_logs(3))
    w.run()
    await eventually(
        lambda: (p := _part(w.worker, TP0)) is not None and p.txn is not None and p.txn.records == 3
    )
    part = w.worker.owned[TP0].part
    w.consumer.assigned.discard(TP0)
    await w.worker.partitions_revoked({TP0})
    producer = w.clients.producers.of(0)
    assert producer.offsets == [(TP0, 3, GROUP)]
    assert "abort" not in producer.calls
    assert producer.stopped
    assert part.state is S.CLOSED
    assert TP0 not in w.worker.owned
    await w.stop()


async def test_with_the_caught_up_policy_a_partition_commits_once_it_reached_the_end_of_its_log(
    start_worker: Starter,
) -> None:
    """commit_policy=caught-up: three records handled, nothing more to fetch: committed at once, not after the 60 s interval."""
    w = await start_worker(assign={TP0}, logs=_logs(3), commit_policy="caught-up")
    w.run()
    await eventually(lambda: (p := _part(w.worker, TP0)) is not None and p.serving)
    producer = w.clients.producers.of(0)
    await eventually(lambda: producer.offsets == [(tp(0), 3, GROUP)])
    assert [k.decode() for k in producer.committed_keys(TOPICS.commands) if k] == keys_for(0, 3)


async def test_records_held_for_a_slow_commit_are_handled_as_soon_as_it_ends(start_worker: Starter) -> None:
    """The end of a commit (here 0.4 s long) wakes the loop from its fetch: the held records commit at once, not a fetch wait later."""
    w = await start_worker(assign={TP0}, logs={}, commit_policy="caught-up", commit_interval=4.0)
    w.run()
    await eventually(lambda: (p := _part(w.worker, TP0)) is not None and p.serving)
    part = w.worker.owned[TP0].part
    producer = w.clients.producers.of(0)
    gate = producer.commit_gate = asyncio.Event()
    w.consumer.logs[TP0].extend(records(0, 0, keys_for(0, 3)))
    await eventually(lambda: part.state is PartitionState.COMMITTING, what="the first commit")
    w.consumer.logs[TP0].extend(records(0, 3, keys_for(0, 2, start=3)))
    await eventually(lambda: len(part.queue) == 2, what="two records held for the commit")
    w.consumer.max_wait_ms = 10_000  # from now on an empty fetch waits its whole timeout (2 s)
    await asyncio.sleep(0.4)
    gate.set()
    await eventually(
        lambda: producer.offsets == [(TP0, 3, GROUP), (TP0, 5, GROUP)], timeout=1.0, what="the second commit"
    )
    assert (
        w.consumer.cancelled_fetches == 0
    )  # the fetch cut short stays pending: aiokafka's is not cancel-safe


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
        ([(PartitionState.COMMITTING, 3)], 50),  # records wait for a commit: its end wakes the fetch
        ([(PartitionState.COMMITTING, 3), (PartitionState.READY, 2)], 0),  # records to handle
        ([(PartitionState.OPENING, 3)], 50),
    ],
)
def test_the_fetch_does_not_wait_only_when_records_can_be_handled(
    partitions: list[tuple[PartitionState, int]], expected: int
) -> None:
    """The poll timeout: 0 with handleable records, else half the commit interval (no polling while a commit holds records)."""
    parts = [SimpleNamespace(can_work=st is PartitionState.READY and queued > 0) for st, queued in partitions]
    assert poll_ms(parts, commit_interval=0.1) == expected  # type: ignore[arg-type]


async def test_a_partition_revoked_while_it_reopens_leaves_the_table_and_starts_no_producer_after(
    start_worker: Starter,
) -> None:
    """A BROKEN partition is reopened; the group revokes it mid-open (aiokafka still lists it until the sync):
    it leaves the table at once, no producer starts for it afterwards, and a later assignment opens it again."""
    gate = asyncio.Event()
    w = await start_worker(assign={TP0}, logs=_logs(2), restore=Restore(gate))
    gate.set()
    w.run()
    await eventually(lambda: (p := _part(w.worker, TP0)) is not None and p.serving)
    part = w.worker.owned[TP0].part
    gate.clear()  # the reopen's restore will wait
    part.lifecycle.move(S.BROKEN)  # as a producer gone fatal leaves it
    await eventually(lambda: (p := _part(w.worker, TP0)) is not None and p is not part)
    reopening = w.worker.owned[TP0]
    assert reopening.opening is not None
    producers = w.clients.producers.made[f"{TOPOLOGY.app}-{GROUP}-{INPUT}-0"]
    started_before = len(producers)
    await w.worker.partitions_revoked({TP0})  # the consumer still lists TP0: a rebalance is under way
    assert TP0 not in w.worker.owned
    assert reopening.part.state is S.CLOSED
    gate.set()
    await asyncio.sleep(0.05)
    assert len(producers) == started_before  # nothing started for it after the revocation
    assert TP0 not in w.worker.owned  # not reopened while the group rebalances
    await w.worker.partitions_assigned({TP0})
    await eventually(lambda: (p := _part(w.worker, TP0)) is not None and p.serving)
    await w.stop()


async def test_a_fenced_partition_is_closed_never_reopened_and_the_worker_rejoins_its_group(
    start_worker: Starter,
) -> None:
    """FENCED: closed, not opened again while assigned, and the consumer asked to rejoin (a new generation
    assigns every partition anew: to its rightful owner, or back here after a fence by the broker's timeout)."""
    w = await start_worker(assign={TP0}, logs=_logs(2))
    rejoins: list[bool] = []
    w.consumer._coordinator = SimpleNamespace(request_rejoin=lambda: rejoins.append(True))
    w.run()
    await eventually(lambda: (p := _part(w.worker, TP0)) is not None and p.serving)
    part = w.worker.owned[TP0].part
    part.lifecycle.move(S.FENCED)
    await eventually(lambda: rejoins == [True])
    assert part.state is S.CLOSED
    assert TP0 not in w.worker.owned
    await asyncio.sleep(0.05)
    assert TP0 not in w.worker.owned  # never reopened in place
    await w.stop()


async def test_the_loop_yields_every_cycle_so_a_commit_runs_while_records_wait(start_worker: Starter) -> None:
    """A partition held at its bisecting limit with records queued: the loop still yields, so the due commit runs
    (a fetch that does not wait never yields in aiokafka: the worker spun forever)."""
    w = await start_worker(assign={TP0}, logs={TP0: []}, commit_policy="interval", commit_interval=60.0)
    w.run()
    await eventually(lambda: (p := _part(w.worker, TP0)) is not None and p.serving)
    part = w.worker.owned[TP0].part
    part.poison.limit = 1  # as after a refusal: one record per transaction, up to offset 4
    part.poison._until = 4
    w.consumer.logs[TP0].extend(records(0, 0, keys_for(0, 4)))
    await eventually(lambda: w.clients.producers.of(0).committed_offset() == 4, timeout=3.0)
    await w.stop()


async def test_a_partition_is_paused_by_the_bytes_it_has_queued_not_only_by_their_count(
    start_worker: Starter,
) -> None:
    """Back-pressure counts bytes too: a few large records reaching --queue-bytes pause the partition while its
    commit holds them, though their count is far below --poll-records."""
    big = [record(i, key, value=body(key, pad=300_000)) for i, key in enumerate(keys_for(0, 6))]
    w = await start_worker(assign={TP0}, logs={TP0: big}, queue_bytes=1024 * 1024, poll_records=1000)
    w.run()
    await eventually(lambda: (p := _part(w.worker, TP0)) is not None and p.serving)
    part = w.worker.owned[TP0].part
    async with part.lock:  # as while a commit runs: what is fetched waits in the queue
        await eventually(lambda: TP0 in w.consumer.paused and part.queue != [])
        assert part.queued_bytes >= 1024 * 1024
        assert len(part.queue) < 1000
    await w.stop()


async def test_a_broken_partition_closing_as_a_rebalance_begins_is_not_reopened_for_the_old_assignment(
    start_worker: Starter,
) -> None:
    """A BROKEN partition is being closed when the group starts rebalancing (aiokafka still lists the old
    assignment until the sync): it is not reopened meanwhile, so no producer fences the partition's next owner,
    and nothing of it stays in the worker's table to be skipped when the group gives it back."""
    w = await start_worker(assign={TP0}, logs=_logs(2))
    w.run()
    await eventually(lambda: (p := _part(w.worker, TP0)) is not None and p.serving)
    part = w.worker.owned[TP0].part
    producers = w.clients.producers.made[f"{TOPOLOGY.app}-{GROUP}-{INPUT}-0"]
    gate = asyncio.Event()
    producers[-1].stop_gate = gate  # its close takes a while
    part.lifecycle.move(S.BROKEN)
    await eventually(lambda: TP0 not in w.worker.owned)  # the loop took it out and is closing it
    made = len(producers)
    await w.worker.partitions_revoked(set())  # the rebalance begins (nothing of TP0 left to revoke)
    gate.set()
    await asyncio.sleep(0.05)
    assert len(producers) == made  # no producer started for it while the group rebalances
    assert TP0 not in w.worker.owned
    w.consumer.assigned.discard(TP0)  # the sync gave it to another worker
    await w.worker.partitions_assigned(set())
    w.consumer.assigned.add(TP0)  # ... and a later rebalance gives it back here
    await w.worker.partitions_assigned({TP0})
    await eventually(lambda: (p := _part(w.worker, TP0)) is not None and p.serving)
    await w.stop()
