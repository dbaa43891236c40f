"""The worker's one transaction over several partitions: what a failure in one of them aborts, and who goes next."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError, MessageSizeTooLargeError, ProducerFenced

from pipeline.errors import GroupGenerationFencedError
from pipeline.kafka.internals import InvalidRecordError

from .fakes import TOPICS, Harness, Sent, keys_for, records, tp

A, B = keys_for(0, 8), keys_for(1, 8)


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    made = Harness(tmp_path)
    yield made
    made.close()


def _commands(h: Harness) -> set[str]:
    return {k.decode() for k in h.producer.committed_keys(TOPICS.commands) if k is not None}


async def test_records_of_several_partitions_commit_in_one_transaction(harness: Harness) -> None:
    """Two partitions' records: one begin, one offset commit naming both partitions, one commit."""
    await harness.open(0)
    await harness.open(1)
    await harness.handle_and_commit([*records(0, 0, A[:3]), *records(1, 0, B[:2])])
    calls = [c for c in harness.producer.calls if not c.startswith("send")]
    assert calls == ["begin", f"offsets {TOPICS.input}-0:3 {TOPICS.input}-1:2", "commit"]
    assert _commands(harness) == set(A[:3] + B[:2])


async def test_a_record_that_raises_aborts_every_partition_which_redoes_once(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record of partition 1 makes the handler raise: the whole transaction aborts, both partitions go back to
    their first records; on the redo the record goes to the DLQ alone and everything else commits."""
    await harness.open(0)
    await harness.open(1)
    classify = harness.context.classifier.classify

    def exploding(delivery: object) -> object:
        if getattr(delivery, "partition", None) == 1 and getattr(delivery, "offset", None) == 1:
            raise ValueError("a bug")
        return classify(delivery)  # type: ignore[arg-type]

    monkeypatch.setattr(harness.context.classifier, "classify", exploding)
    batch = [*records(0, 0, A[:3]), *records(1, 0, B[:3])]
    harness.feed(batch)
    await harness.work()
    assert harness.producer.committed == []
    assert sorted(harness.seeks, key=lambda s: s[0].partition) == [(tp(0), 0), (tp(1), 0)]
    await harness.handle_and_commit(batch)  # the consumer, moved back, fetches them again
    assert _commands(harness) == {*A[:3], B[0], B[2]}
    assert [(d["partition"], d["offset"], d["reason"]) for d in harness.producer.dlq()] == [
        (1, 1, "handler-error")
    ]
    assert harness.producer.calls.count("abort") == 1  # the other partition redid its records once


def _refuse(key: str, error: type[BaseException] = MessageSizeTooLargeError) -> object:
    def refuse(sent: list[Sent]) -> BaseException | None:
        hit = any(s.topic == TOPICS.commands and s.key == key.encode() for s in sent)
        return error() if hit else None

    return refuse


@pytest.mark.parametrize("error", [MessageSizeTooLargeError, InvalidRecordError])
async def test_a_refusal_a_record_causes_in_a_transaction_of_two_partitions_finds_the_record_alone(
    harness: Harness, error: type[BaseException]
) -> None:
    """The broker refuses a transaction of two partitions for one record (its size, or INVALID_RECORD: a keyless
    record on a compacted topic, which was redone whole for ever): each partition then commits alone in turn, the
    one holding the record bisects until it goes to the DLQ, and the other partition's records commit."""
    await harness.open(0)
    await harness.open(1)
    bad = B[2]
    harness.producer.fail_commit_if = _refuse(bad, error)  # type: ignore[assignment]
    logs = {0: records(0, 0, A[:4]), 1: records(1, 0, B[:4])}
    positions = {0: 0, 1: 0}
    for _ in range(40):
        seeks = len(harness.seeks)
        for p, log in logs.items():
            fetched = [r for r in log if r.offset >= positions[p]]
            positions[p] = 4
            if fetched:
                harness.task(p).feed(fetched)
        await harness.work()
        if len(harness.seeks) == seeks:
            await harness.commit()
        for where, offset in harness.seeks[seeks:]:
            positions[where.partition] = offset
        if harness.producer.offsets and {o[0].partition: o[1] for o in harness.producer.offsets} == {
            0: 4,
            1: 4,
        }:
            break
    assert _commands(harness) == set(A[:4] + B[:4]) - {bad}
    assert [(d["partition"], d["reason"]) for d in harness.producer.dlq()] == [(1, "unproducible")]
    assert harness.executor.suspects == []


async def test_a_partition_bisecting_with_nothing_to_do_never_holds_the_others_back(harness: Harness) -> None:
    """A partition left with a bisecting limit and no records (its producer went quiet) lets the others commit:
    a limit goes alone only while it has records (seed 331 starved every other partition of its worker)."""
    first = await harness.open(0)
    await harness.open(1)
    first.poison.limit = 8  # growing back after an isolated record, and nothing more comes
    first.poison._growing = True
    await harness.handle_and_commit(records(1, 0, B[:3]))
    assert _commands(harness) == set(B[:3])


async def test_a_bisecting_partition_and_the_others_take_turns(harness: Harness) -> None:
    """With records on a bisecting partition and on another, the transactions alternate: one holds the bisecting
    partition alone, the next the others."""
    first = await harness.open(0)
    await harness.open(1)
    first.poison.limit = 1
    first.poison._until = 100
    harness.feed([*records(0, 0, A[:3]), *records(1, 0, B[:3])])
    held = []
    for _ in range(4):
        await harness.work()
        held.append(sorted(where.partition for where in harness.txn.parts))
        await harness.commit()
    assert held == [[0], [1], [0], [0]]  # alone, the others (all of partition 1's), alone, alone


async def test_offsets_the_group_refuses_abort_the_transaction_and_ask_for_a_rejoin(harness: Harness) -> None:
    """The group went on without this worker (a zombie): its offsets are refused, nothing is committed, the
    partitions go back, and the worker rejoins; its producer is kept."""
    await harness.open(0)
    harness.producer.fail["offsets"].append(GroupGenerationFencedError("generation 1 is over"))
    harness.feed(records(0, 0, A[:2]))
    await harness.work()
    outcome = await harness.commit()
    assert outcome.rejoin
    assert not outcome.replace_producer
    assert harness.producer.committed == []
    assert harness.producer.calls[-1] == "abort"
    assert harness.seeks == [(tp(0), 0)]


@pytest.mark.parametrize(("policy", "lingers"), [("caught-up", True), ("interval", False)])
async def test_a_caught_up_transaction_lingers_until_it_is_due(
    tmp_path: Path, policy: str, *, lingers: bool
) -> None:
    """Policy caught-up: once every task in the open transaction is caught up it lingers (the loop gathers
    what comes meanwhile) until commit_linger has passed; never with no transaction open, never under a backlog."""
    h = Harness(tmp_path, {"commit_policy": policy, "commit_linger": 0.05})
    try:
        await h.open(0)
        assert not h.executor.lingering(h.tasks)  # none open
        h.feed(records(0, 0, A[:2]))
        await h.work()
        assert h.executor.txn.open
        task = h.task()
        task.caught_up = False
        assert not h.executor.lingering(h.tasks)  # more records to come
        task.caught_up = True
        assert h.executor.lingering(h.tasks) is lingers
        h.executor.txn.opened_at -= 0.05  # the linger has passed: due, no more waiting
        assert not h.executor.lingering(h.tasks)
    finally:
        h.close()


def _explode_at(harness: Harness, monkeypatch: pytest.MonkeyPatch, offset: int) -> None:
    """Make classifying the record at ``offset`` raise, as a bug would."""
    classify = harness.context.classifier.classify

    def exploding(delivery: Any) -> Any:
        if delivery.offset == offset:
            raise ValueError("a bug")
        return classify(delivery)

    monkeypatch.setattr(harness.context.classifier, "classify", exploding)


@pytest.mark.parametrize(
    ("abort_error", "replace_producer", "rejoin"),
    [(None, False, False), (ProducerFenced(), True, True), (KafkaConnectionError(), True, False)],
)
async def test_an_abort_after_a_record_raised_asks_for_what_the_abort_found(
    harness: Harness,
    monkeypatch: pytest.MonkeyPatch,
    abort_error: Exception | None,
    replace_producer: bool,
    rejoin: bool,
) -> None:
    """The abort after a record raised: clean, nothing more; fenced, a new producer and a rejoin; the producer
    unusable, a new producer only. The partition goes back to its first record each time."""
    await harness.open(0)
    _explode_at(harness, monkeypatch, 1)
    if abort_error is not None:
        harness.producer.fail["abort"].append(abort_error)
    harness.feed(records(0, 0, A[:3]))
    outcome = await harness.executor.process(harness.tasks)
    assert (outcome.replace_producer, outcome.rejoin, outcome.rewind) == (
        replace_producer,
        rejoin,
        {tp(0): 0},
    )


async def test_a_producer_that_cannot_go_on_before_the_commit_is_replaced_without_a_rejoin(
    harness: Harness,
) -> None:
    """The producer refuses the offsets as a dead producer does: aborted, the partition back, a new producer, no rejoin."""
    await harness.open(0)
    harness.feed(records(0, 5, A[:2]))
    await harness.work()
    harness.producer.fail["offsets"].append(AssertionError("no transaction"))
    outcome = await harness.executor.commit(harness.tasks)
    assert (outcome.replace_producer, outcome.rejoin, outcome.rewind, outcome.fatal) == (
        True,
        False,
        {tp(0): 5},
        None,
    )


async def test_a_commit_that_may_have_taken_reopens_its_partitions_saying_why(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """The broker commits and its answer is a fence: each partition in it is reopened (BROKEN), and its log line
    names the error; nothing is rewound."""
    await harness.open(0)
    harness.feed(records(0, 5, A[:2]))
    await harness.work()
    harness.producer.fail_after["commit"].append(ProducerFenced())
    caplog.set_level(logging.WARNING)
    outcome = await harness.executor.commit(harness.tasks)
    assert (outcome.replace_producer, outcome.rejoin, outcome.rewind) == (True, True, {})
    assert harness.task(0).state.value == "broken"
    (said,) = [
        m
        for m in caplog.messages
        if m.endswith(f"; reopening {TOPICS.input}-0 from the group's committed offsets")
    ]
    error = said.removesuffix(f"; reopening {TOPICS.input}-0 from the group's committed offsets")
    assert f"{TOPICS.input}-0: {error}; reopening it" in caplog.messages


async def test_a_refusal_of_two_partitions_names_both_and_makes_each_a_suspect(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """A transaction of two partitions refused for a record: both named with where they redo from, both suspects."""
    await harness.open(0)
    await harness.open(1)
    harness.feed([*records(0, 10, A[:2]), *records(1, 20, B[:2])])
    await harness.work()
    harness.producer.fail["commit"].append(MessageSizeTooLargeError())
    caplog.set_level(logging.WARNING, logger="pipeline.worker.executor")
    outcome = await harness.executor.commit(harness.tasks)
    assert outcome.rewind == {tp(0): 10, tp(1): 20}
    assert harness.executor.suspects == [tp(0), tp(1)]
    names = f"{TOPICS.input}-0, {TOPICS.input}-1"
    (refused,) = [m for m in caplog.messages if m.startswith("transaction of ")]
    assert refused.startswith(f"transaction of {names} refused: ")
    assert refused.endswith(f"; redoing from {TOPICS.input}-0@10, {TOPICS.input}-1@20")
    assert f"transactions hold one partition each until {names} commit alone" in caplog.messages


async def test_a_refused_transaction_counts_nothing_of_what_it_held(harness: Harness) -> None:
    """The outcomes of records in a transaction refused for a record are dropped at once, never counted."""
    await harness.open(0)
    harness.feed(records(0, 0, A[:2]))
    await harness.work()
    harness.producer.fail["commit"].append(MessageSizeTooLargeError())
    await harness.executor.commit(harness.tasks)
    harness.task(0).tally.flush()
    events = harness.metrics.registry.get_sample_value
    assert events("pipeline_events_total", {"source": "stripe", "outcome": "first"}) is None


async def test_a_refused_partition_no_longer_in_the_table_is_only_rewound(harness: Harness) -> None:
    """A partition closed since its records went in: the refusal asks nothing of its task, and no stop."""
    await harness.open(0)
    harness.feed(records(0, 0, A[:2]))
    await harness.work()
    harness.producer.fail["commit"].append(MessageSizeTooLargeError())
    outcome = await harness.executor.commit({})
    assert (outcome.rewind, outcome.fatal) == ({tp(0): 0}, None)
