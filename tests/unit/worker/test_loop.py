"""The worker loop over a stand-in consumer and producers: assignment, positioning, health and shutdown.

The consumer (:class:`FakeConsumer`) hands its assignment to the worker's
rebalance listener from inside the first poll, as aiokafka's does; partitions
open for real (RocksDB in tmp_path) over fake transactional producers. The producer's fences and refusals are
in ``test_loop_producer.py``; when the loop commits and how long its fetch waits, in ``test_loop_pacing.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiokafka import TopicPartition

from pipeline.cli import services
from pipeline.errors import PartitionUnservedError, UnstableOffsetsError
from pipeline.state.directory import store_path
from pipeline.state.store import PartitionStore, bucket_width
from pipeline.state.store_meta import StoreIdentity
from pipeline.worker.assignor import decode_claim
from pipeline.worker.lifecycle import PartitionState
from pipeline.worker.loop import Worker
from pipeline.worker.task import ActiveTask

from .fakes import (
    INPUT,
    TOPICS,
    TOPOLOGY,
    FakeConsumer,
    FakeReader,
    Running,
    Starter,
    fake_io,
    keys_for,
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


# -- its health, its HTTP endpoint, its group metadata ----------------------------------------------


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
