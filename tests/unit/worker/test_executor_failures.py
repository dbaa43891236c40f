"""What the executor makes of failures while records are handled and of a commit that went through."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka.errors import InvalidTimestampError, KafkaConnectionError, MessageSizeTooLargeError

from pipeline.errors import PartitionUnservedError
from pipeline.worker.emitter import Emitter

from .fakes import INPUT, Harness, keys_for, records, tp

A = keys_for(0, 6)


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    made = Harness(tmp_path)
    yield made
    made.close()


async def test_a_record_whose_dead_lettering_fails_too_stops_the_partition_naming_it(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Offset 1's handling raises, and so does writing it to the DLQ on the redo: the outcome is fatal, naming
    the partition, the offset and the error (not even the DLQ takes it)."""
    await harness.open(0)
    classify = harness.context.classifier.classify

    def exploding(delivery: Any) -> Any:
        if delivery.offset == 1:
            raise ValueError("a bug")
        return classify(delivery)

    dlq = Emitter.dlq

    def dlq_failing(emitter: Emitter, delivery: Any, **fields: Any) -> None:
        if delivery.offset == 1:
            raise RuntimeError("the DLQ path blew up")
        dlq(emitter, delivery, **fields)

    monkeypatch.setattr(harness.context.classifier, "classify", exploding)
    monkeypatch.setattr(Emitter, "dlq", dlq_failing)
    harness.feed(records(0, 0, A[:3]))
    first = await harness.executor.process(harness.tasks)
    assert (first.fatal, first.rewind) == (None, {tp(0): 0})
    await harness.apply(first)
    harness.feed(records(0, 0, A[:3]))
    second = await harness.executor.process(harness.tasks)
    assert isinstance(second.fatal, PartitionUnservedError)
    assert str(second.fatal) == (
        f"partition {INPUT}-0: offset 1 cannot even go to the DLQ: RuntimeError('the DLQ path blew up')"
    )
    assert second.rewind == {tp(0): 0}


async def test_a_transaction_the_broker_cannot_begin_is_aborted_and_its_records_fetched_again(
    harness: Harness,
) -> None:
    """The broker away as the transaction begins: nothing is handled, and the partition goes back to the first
    record it had taken; no new producer, no rejoin."""
    await harness.open(0)
    harness.producer.fail["begin"].append(KafkaConnectionError())
    harness.feed(records(0, 0, A[:3]))
    outcome = await harness.executor.process(harness.tasks)
    assert (outcome.replace_producer, outcome.rejoin, outcome.fatal) == (False, False, None)
    assert outcome.rewind == {tp(0): 0}
    assert harness.producer.committed == []


async def test_a_commit_is_timed_and_counted_for_each_partition_in_it(harness: Harness) -> None:
    """One commit: one observation of its time (well under a second here), and each task's records counted
    once it is through."""
    await harness.open(0)
    harness.feed(records(0, 0, A[:3]))
    await harness.work()
    await harness.commit()
    sample = harness.metrics.registry.get_sample_value
    assert sample("pipeline_transaction_commit_seconds_count") == 1
    seconds = sample("pipeline_transaction_commit_seconds_sum")
    assert seconds is not None
    assert 0 <= seconds < 1
    assert sample("pipeline_batch_records_sum") == 3


async def test_a_suspect_that_committed_alone_is_no_longer_a_suspect(harness: Harness) -> None:
    """Of two suspects, the one whose transaction went through is cleared; the other stays one."""
    await harness.open(0)
    await harness.open(1)
    harness.executor.suspects = [tp(0), tp(1)]
    harness.feed(records(0, 0, A[:2]))
    await harness.work()
    assert sorted(where.partition for where in harness.txn.parts) == [0]
    await harness.commit()
    assert harness.executor.suspects == [tp(1)]


@pytest.mark.parametrize(
    ("error", "reread"), [(MessageSizeTooLargeError(), True), (InvalidTimestampError(), False)]
)
async def test_a_commit_refused_for_a_records_size_asks_for_the_topic_limits_to_be_read_again(
    harness: Harness, error: Exception, *, reread: bool
) -> None:
    """A refusal for size may mean a topic's limit was lowered: the outcome asks for the limits again; a refusal
    for anything else a record is does not."""
    await harness.open(0)
    harness.producer.fail_commit_if = lambda _sent: error
    harness.feed(records(0, 0, A[:2]))
    await harness.work()
    outcome = await harness.executor.commit(harness.tasks)
    assert outcome.reread_limits is reread
    assert outcome.rewind == {tp(0): 0}


async def test_an_abort_on_the_way_out_sends_each_partition_in_the_transaction_back_to_its_first_record(
    harness: Harness,
) -> None:
    """abort() (a failure, a revocation without a producer): every partition in the open transaction goes back to
    its first record in it."""
    await harness.open(0)
    await harness.open(1)
    harness.feed([*records(0, 3, A[:2]), *records(1, 5, keys_for(1, 2))])
    await harness.work()
    outcome = await harness.executor.abort()
    assert outcome.rewind == {tp(0): 3, tp(1): 5}
    assert not harness.txn.open


async def test_a_refusal_between_two_suspects_turns_keeps_the_suspects_it_did_not_hold(
    harness: Harness,
) -> None:
    """Partitions 0 and 1 are suspects; the transaction of the others (2 and 3) is refused too: all four are
    suspects, so 0 and 1 are not merged back into a transaction the broker refuses again (found by poison seed 40:
    two pairs took turns being refused, none committing, for 8 s)."""
    for partition in range(4):
        await harness.open(partition)
    harness.executor.suspects = [tp(0), tp(1)]
    harness.feed([*records(2, 0, keys_for(2, 2)), *records(3, 0, keys_for(3, 2))])
    await harness.work()
    assert sorted(where.partition for where in harness.txn.parts) == [2, 3]
    harness.producer.fail["commit"].append(InvalidTimestampError())
    await harness.executor.commit(harness.tasks)
    assert harness.executor.suspects == [tp(0), tp(1), tp(2), tp(3)]
