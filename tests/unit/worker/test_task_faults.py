"""A task under the faults the simulation found: refused timestamps, a refused DLQ, fences mid-batch, bad reads."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiokafka.errors import InvalidTimestampError, MessageSizeTooLargeError, ProducerFenced

from pipeline.errors import PartitionUnservedError
from pipeline.headers import ORIGINAL_TIMESTAMP_HEADER
from pipeline.worker.lifecycle import PartitionState

from .fakes import (
    TOPICS,
    Harness,
    Sent,
    keys_for,
    record,
    records,
    tp,
)

S = PartitionState
K = keys_for(0, 12)
TP0 = tp(0)
Opener = Callable[..., Awaitable[Harness]]


async def _drive(h: Harness, batch: list[Any], *, rounds: int = 30) -> None:
    """Handle and commit ``batch`` as the loop does, following every rewind, until all of it is committed."""
    position, end = batch[0].offset, batch[-1].offset + 1
    for _ in range(rounds):
        assert h.task().state is S.READY, h.task().state
        seeks = len(h.seeks)
        fetched = [r for r in batch if r.offset >= position]
        position = end
        if fetched:
            h.feed(fetched)
        await h.work()
        if len(h.seeks) == seeks:
            await h.commit()
        if len(h.seeks) > seeks:
            position = h.seeks[-1][1]
        elif not h.task().queue and h.producer.committed_offset() == end:
            return
    raise AssertionError(f"not committed in {rounds} rounds: {h.producer.calls[-12:]}")


def _refuse_timestamps_after(limit_ms: int) -> Callable[[list[Sent]], BaseException | None]:
    """A topic with message.timestamp.after.max.ms: any batch holding a record dated past ``limit_ms`` is refused."""

    def refuse(sent: list[Sent]) -> BaseException | None:
        return InvalidTimestampError() if any(s.timestamp > limit_ms for s in sent) else None

    return refuse


async def test_a_record_whose_outputs_are_refused_for_their_timestamp_is_redone_stamped_now(
    open_partition: Opener,
) -> None:
    """Outputs refused for a timestamp far ahead: the record alone is redone with its outputs stamped with the
    current time (the original kept in a header); its key gets its command; nothing loops, nothing goes to the DLQ."""
    h = await open_partition()
    now_ms = int(time.time() * 1000)
    ahead = now_ms + 60 * 86_400_000
    h.producer.fail_send_if = _refuse_timestamps_after(now_ms + 3_600_000)
    batch = [record(10, K[0]), record(11, K[1], timestamp=ahead), record(12, K[2])]
    await _drive(h, batch)
    commands = h.producer.committed_to(TOPICS.commands)
    assert sorted(s.json()["key"] for s in commands) == sorted(K[:3])
    restamped = [s for s in commands if s.key == K[1].encode()]
    assert restamped[0].timestamp <= int(time.time() * 1000)
    assert dict(restamped[0].headers)[ORIGINAL_TIMESTAMP_HEADER] == str(ahead).encode()
    assert h.producer.dlq() == []
    assert h.replaced >= 1  # the refused batch broke the producer's sequence: replaced


async def test_topics_bounds_known_at_start_stamp_outputs_now_without_a_refusal(
    open_partition: Opener,
) -> None:
    """With the topics' timestamp bounds known, an output that would be refused is stamped now at once."""
    h = await open_partition()
    h.txn.timestamps = {TOPICS.commands: (2**63 - 1, 3_600_000)}
    ahead = int(time.time() * 1000) + 60 * 86_400_000
    await _drive(h, [record(10, K[0], timestamp=ahead)])
    [command] = h.producer.committed_to(TOPICS.commands)
    assert command.timestamp < ahead
    assert dict(command.headers)[ORIGINAL_TIMESTAMP_HEADER] == str(ahead).encode()
    assert "abort" not in h.producer.calls


async def test_a_record_refused_even_stamped_now_goes_to_the_dlq_and_a_refused_dlq_stops_the_partition(
    open_partition: Opener,
) -> None:
    """Refused whatever its timestamp: to the DLQ (unproducible); when the DLQ refuses it too, one line, no loop."""
    h = await open_partition()

    def refuse_everything_of(sent: list[Sent]) -> BaseException | None:
        return MessageSizeTooLargeError() if any(s.key == K[1].encode() for s in sent) else None

    h.producer.fail_send_if = refuse_everything_of
    with pytest.raises(PartitionUnservedError, match="cannot be written even to the DLQ"):
        await _drive(h, records(0, 10, K[:3]))


async def test_a_dlq_record_refused_for_its_timestamp_is_redone_stamped_now(open_partition: Opener) -> None:
    """Outputs refused (too large), then their DLQ record refused for its timestamp: the DLQ record is redone
    stamped with the current time (the original in a header); the partition goes on (simulation seed 2489)."""
    h = await open_partition()
    now_ms = int(time.time() * 1000)
    ahead = now_ms + 60 * 86_400_000

    def refuse(sent: list[Sent]) -> BaseException | None:
        refused: BaseException | None = None
        if any(s.timestamp > now_ms + 3_600_000 for s in sent):
            refused = InvalidTimestampError()
        elif any(s.key == K[1].encode() and s.topic == TOPICS.commands for s in sent):
            refused = MessageSizeTooLargeError()
        return refused

    h.producer.fail_send_if = refuse
    await _drive(h, [record(10, K[0]), record(11, K[1], timestamp=ahead), record(12, K[2])])
    assert sorted(s.json()["key"] for s in h.producer.committed_to(TOPICS.commands)) == sorted([K[0], K[2]])
    [dead] = h.producer.committed_to(TOPICS.dlq)
    assert dead.json()["reason"] == "unproducible"
    assert dead.timestamp <= int(time.time() * 1000)
    assert dict(dead.headers)[ORIGINAL_TIMESTAMP_HEADER] == str(ahead).encode()
    assert h.task().state is S.READY


async def test_a_dlq_record_refused_for_its_timestamp_even_stamped_now_stops_the_partition(
    open_partition: Opener,
) -> None:
    """A DLQ that refuses every timestamp: its record is redone stamped now once, then one line, no loop."""
    h = await open_partition()

    def refuse(sent: list[Sent]) -> BaseException | None:
        refused: BaseException | None = None
        if any(s.topic == TOPICS.dlq for s in sent):
            refused = InvalidTimestampError()
        elif any(s.key == K[1].encode() for s in sent):
            refused = MessageSizeTooLargeError()
        return refused

    h.producer.fail_send_if = refuse
    with pytest.raises(
        PartitionUnservedError, match=r"cannot be written even to the DLQ.*InvalidTimestampError"
    ):
        await _drive(h, records(0, 10, K[:3]), rounds=60)


async def test_a_fence_seen_while_aborting_asks_for_a_new_producer_and_a_rejoin(
    open_partition: Opener,
) -> None:
    """A transaction is refused, and its abort finds the producer fenced: a new producer and a rejoin are
    asked for, the task goes back to its first record and stays READY."""
    h = await open_partition()
    h.producer.fail["send"].append(MessageSizeTooLargeError())
    h.producer.fail["abort"].append(ProducerFenced())
    h.feed(records(0, 10, K[:2]))
    await h.work()
    await h.commit()
    assert [(o.replace_producer, o.rejoin) for o in h.outcomes if o.replace_producer] == [(True, True)]
    assert h.replaced == 1
    assert h.seeks == [(TP0, 10)]
    assert h.task().state is S.READY


async def test_an_entry_the_store_cannot_read_breaks_the_partition_and_wipes_the_store(
    open_partition: Opener,
) -> None:
    """A lookup that finds an undecodable entry: the batch is aborted, the partition BROKEN, its store wiped on close."""
    h = await open_partition()
    await _drive(h, [record(10, K[0])])
    store = h.task().store
    assert store is not None
    [bucket] = list(store.buckets())
    store._buckets[bucket][K[1].encode()] = b"not an entry"
    h.feed([record(11, K[1])])
    await h.work()
    assert h.task().state is S.BROKEN
    path = store.path
    h.task().close()
    assert not path.exists()  # restored from the changelog when the partition opens again


async def test_a_failed_read_of_the_store_breaks_the_partition_instead_of_the_worker(
    open_partition: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RocksDB failing a read (a disk error) aborts the batch and makes the partition BROKEN: reopened, not a crash."""
    h = await open_partition()
    await _drive(h, [record(10, K[0])])
    store = h.task().store
    assert store is not None

    class Failing:
        def get(self, *_: Any) -> Any:
            raise Exception("IO error: read failed")

    monkeypatch.setattr(store, "_buckets", {b: Failing() for b in store.buckets()})
    h.feed([record(11, K[1])])
    await h.work()
    assert h.task().state is S.BROKEN
    assert "abort" in h.producer.calls


async def test_only_accepted_records_move_stream_time_and_never_past_the_skew_bound(
    open_partition: Opener,
) -> None:
    """An invalid record dated far ahead moves nothing; a valid one dated far ahead moves stream time to the bound."""
    h = await open_partition(max_clock_skew=3600.0)
    ahead = int(time.time() * 1000) + 60 * 86_400_000
    bad = record(10, None, value=b"not json", timestamp=ahead)
    await _drive(h, [bad])
    store = h.task().store
    assert store is not None
    before = store.stream_time
    assert before < ahead - 86_400_000
    began = int(time.time() * 1000)
    await _drive(h, [record(11, K[0], timestamp=ahead)])
    moved = store.stream_time
    assert began + 3_600_000 <= moved <= int(time.time() * 1000) + 3_600_000
    audit = [s.json() for s in h.producer.committed_to(TOPICS.audit)]
    assert audit[-1]["expires_at"] <= moved + 7 * 86_400_000  # claimed at the bound, not 60 days ahead
