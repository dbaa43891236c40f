"""The worker loop's producer: fenced and replaced, unable to start, and refusing a transaction its records
outgrew (the topic limits read again).

Over the same stand-ins as ``test_loop.py``: a :class:`FakeConsumer` and fake transactional producers.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError, MessageSizeTooLargeError, ProducerFenced

from pipeline.errors import BrokerUnavailableError, ProducerFencedError
from pipeline.worker import identity as identity_module
from pipeline.worker import opening as opening_module
from pipeline.worker import producer as producer_module
from pipeline.worker.identity import FENCE_WINDOW_S, FENCES_ALLOWED
from pipeline.worker.loop import Worker

from .fakes import (
    INPUT,
    TOPICS,
    TOPOLOGY,
    FakeConsumer,
    Running,
    Starter,
    body,
    fake_io,
    keys_for,
    record,
    records,
    settings,
)
from .test_loop import GROUP, TP0, S, _logs, _part, eventually


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


async def test_a_revocation_while_a_new_producer_cannot_start_aborts_and_closes_the_partition(
    start_worker: Starter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fenced and no producer can start yet: a revocation aborts what is open (nothing to commit through) and
    closes the revoked task."""
    monkeypatch.setattr(producer_module, "PRODUCER_RETRY_S", 0.001)
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
