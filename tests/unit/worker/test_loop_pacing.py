"""When the worker loop commits and how long its fetch waits: at a revocation, by the commit policies and their
linger, a fetch that never outwaits a due commit, back-pressure, and what the loop asks of its fetch.

Over the same stand-ins as ``test_loop.py``: a :class:`FakeConsumer` and fake transactional producers.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaConnectionError, ProducerFenced

from pipeline.worker import loop as loop_module
from pipeline.worker import producer as producer_module
from pipeline.worker.executor import TaskExecutor
from pipeline.worker.fetch import LoopFetch
from pipeline.worker.lifecycle import PartitionState
from pipeline.worker.pacing import poll_ms

from .fakes import TOPICS, FakeProducer, Starter, body, keys_for, record, records, tp
from .test_loop import GROUP, TP0, S, _logs, _part, eventually


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


# -- what the loop asks of its fetch -------------------------------------------------------------------


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
    monkeypatch.setattr(producer_module, "PRODUCER_RETRY_S", 0.001)
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
