"""PoisonTracker: which records go to the DLQ alone, and the bisection that finds one the broker refuses."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from aiokafka.errors import CorruptRecordException, InvalidTimestampError, RecordTooLargeError

from pipeline.kafka.internals import InvalidRecordError
from pipeline.worker.poison import RESTAMP, UNPRODUCIBLE, PoisonTracker
from pipeline.worker.stage import HandlerFailedError, Poison

from .fakes import INPUT, Harness


def _limit(tracker: PoisonTracker) -> int | None:
    """The tracker's limit, read afresh (an assert on the attribute would narrow it for the lines after)."""
    return tracker.limit


def test_a_record_whose_handling_raised_is_poison_once() -> None:
    """The first failure marks the record with its reason and error; a second (its DLQ record failed) is refused."""
    tracker = PoisonTracker("raw-0")
    assert tracker.handler_failed(5, "handler-failed", "boom")
    assert tracker.poison == {5: Poison("handler-failed", "boom")}
    assert not tracker.handler_failed(5, "handler-failed", "again")
    assert tracker.poison == {5: Poison("handler-failed", "boom")}


def test_a_record_redone_to_be_restamped_can_still_become_poison() -> None:
    """A record marked only to have its outputs restamped, whose handling then raises, is poison."""
    tracker = PoisonTracker("raw-0")
    tracker.poison[5] = Poison(RESTAMP, "refused", restamp=True)
    assert tracker.handler_failed(5, "handler-failed", "boom")
    assert tracker.poison[5] == Poison("handler-failed", "boom")


def test_a_refusal_is_redone_once_before_the_batch_is_bisected() -> None:
    """Once may be chance: the same batch is redone whole; the same refusal from the same offset halves it."""
    tracker = PoisonTracker("raw-0")
    refused = RecordTooLargeError()
    assert tracker.commit_failed(10, 8, refused) is None
    assert _limit(tracker) is None
    assert tracker.commit_failed(10, 8, refused) is None
    assert _limit(tracker) == 4
    assert tracker.commit_failed(10, 4, refused) is None
    assert _limit(tracker) == 2
    assert tracker.poison == {}


def test_another_refusal_or_another_offset_is_redone_whole_again() -> None:
    """A refusal of another kind, or from another offset, is a new one: redone whole, not bisected."""
    tracker = PoisonTracker("raw-0")
    assert tracker.commit_failed(10, 8, RecordTooLargeError()) is None
    assert tracker.commit_failed(10, 8, InvalidTimestampError()) is None
    assert _limit(tracker) is None
    assert tracker.commit_failed(11, 8, InvalidTimestampError()) is None
    assert _limit(tracker) is None


def test_a_record_refused_alone_goes_to_the_dlq_with_the_brokers_error() -> None:
    """Bisected down to one record still refused: it is poison (unproducible), and transactions hold one record."""
    tracker = PoisonTracker("raw-0")
    refused = RecordTooLargeError("too big")
    tracker.commit_failed(10, 2, refused)
    tracker.commit_failed(10, 2, refused)
    assert _limit(tracker) == 1
    assert tracker.commit_failed(10, 1, refused) is None
    assert _limit(tracker) == 1
    assert tracker.poison == {10: Poison(UNPRODUCIBLE, f"the broker refused its outputs: {refused!r}")}


def test_a_record_the_broker_refuses_as_invalid_is_isolated_and_goes_to_the_dlq() -> None:
    """INVALID_RECORD (a keyless record on a compacted topic) is a refusal a record causes: the batch is
    bisected and the record alone goes to the DLQ naming the cause, instead of the batch being redone forever."""
    tracker = PoisonTracker("raw-0")
    refused = InvalidRecordError()
    tracker.commit_failed(10, 2, refused)
    tracker.commit_failed(10, 2, refused)
    assert _limit(tracker) == 1
    assert tracker.commit_failed(10, 1, refused) is None
    error = tracker.poison[10].error
    assert tracker.poison[10].reason == UNPRODUCIBLE
    assert "a record without a key on a compacted topic" in error


def test_a_record_refused_alone_for_its_timestamp_is_first_redone_stamped_now() -> None:
    """Alone and refused for its timestamp: redone with its outputs stamped now, not yet poison."""
    tracker = PoisonTracker("raw-0")
    refused = InvalidTimestampError("too old")
    tracker.commit_failed(10, 2, refused)
    tracker.commit_failed(10, 2, refused)
    assert tracker.commit_failed(10, 1, refused) is None
    assert tracker.poison == {10: Poison(RESTAMP, repr(refused), restamp=True)}


def test_a_dlq_record_refused_for_its_timestamp_is_restamped_once_then_the_partition_cannot_go_on() -> None:
    """A poison record's DLQ record refused for its timestamp is redone stamped now; refused again, the
    partition stops with one line naming the offset, the reason, the host's clock as the likely cause, and the
    broker's error."""
    tracker = PoisonTracker("raw-0")
    tracker.handler_failed(10, "handler-failed", "boom")
    tracker.limit = 1
    refused = InvalidTimestampError("still too old")
    assert tracker.commit_failed(10, 1, refused) is None  # once may be chance
    assert tracker.poison[10] == Poison("handler-failed", "boom")
    assert tracker.commit_failed(10, 1, refused) is None
    assert tracker.poison[10] == Poison("handler-failed", "boom", restamp=True)
    assert tracker.commit_failed(10, 1, refused) is None
    line = tracker.commit_failed(10, 1, refused)
    assert (
        line
        == f"offset 10 cannot be written even to the DLQ (handler-failed), not even stamped with this host's clock "
        "(is the clock further from the broker's than the DLQ topic's message.timestamp.after.max.ms or "
        f"before.max.ms allow?): the broker refused it: {refused!r}"
    )


def test_after_an_isolated_record_transactions_grow_back_doubling_to_the_batch_that_failed() -> None:
    """A slow start: 1, 2, 4 records, then full transactions once the limit reaches the failed batch's size."""
    tracker = PoisonTracker("raw-0")
    refused = RecordTooLargeError()
    for count in (8, 8, 4, 2, 1):
        tracker.commit_failed(10, count, refused)
    assert _limit(tracker) == 1
    tracker.committed(11)
    assert _limit(tracker) == 2
    tracker.committed(13)
    assert _limit(tracker) == 4
    tracker.committed(17)
    assert _limit(tracker) is None


def test_a_bisection_that_isolates_nothing_ends_past_the_batch_that_failed() -> None:
    """Halves committed without a record isolated: full transactions again once past the failed batch's end."""
    tracker = PoisonTracker("raw-0")
    refused = RecordTooLargeError()
    tracker.commit_failed(10, 8, refused)
    tracker.commit_failed(10, 8, refused)
    assert _limit(tracker) == 4
    tracker.committed(14)
    assert _limit(tracker) == 4
    tracker.committed(18)
    assert _limit(tracker) is None


def test_a_commit_forgets_the_poison_behind_it_and_the_last_refusal() -> None:
    """Poison records before the committed end are forgotten, later ones kept; a commit with no end keeps them."""
    tracker = PoisonTracker("raw-0")
    tracker.handler_failed(3, "handler-failed", "a")
    tracker.handler_failed(4, "handler-failed", "b")
    tracker.committed(None)
    assert sorted(tracker.poison) == [3, 4]
    tracker.committed(4)  # up to 4, exclusive
    assert sorted(tracker.poison) == [4]
    refused = RecordTooLargeError()
    tracker.commit_failed(20, 4, refused)
    tracker.committed(None)
    assert tracker.commit_failed(20, 4, refused) is None
    assert _limit(tracker) is None  # the refusal before the commit is forgotten: redone whole once more


def test_a_bisection_after_a_slow_start_that_ended_is_not_a_slow_start() -> None:
    """Grown back to full transactions after an isolated record, a new refusal bisects as a first one does:
    halves committed keep their size until past the batch that failed."""
    tracker = PoisonTracker("raw-0")
    refused = RecordTooLargeError()
    for count in (2, 2, 1):
        tracker.commit_failed(10, count, refused)
    tracker.committed(11)
    assert _limit(tracker) is None
    tracker.commit_failed(30, 8, refused)
    tracker.commit_failed(30, 8, refused)
    tracker.committed(34)
    assert _limit(tracker) == 4


def test_the_error_a_poison_record_carries_is_cut_at_1000_characters() -> None:
    """However long the broker's error, the poison record's error text (its DLQ record's) is 1000 characters."""
    refused = RecordTooLargeError("x" * 3000)
    timestamp = InvalidTimestampError("y" * 3000)
    unproducible, restamped, dlq = PoisonTracker("a"), PoisonTracker("b"), PoisonTracker("c")
    for tracker, cause in ((unproducible, refused), (restamped, timestamp)):
        tracker.limit = 1
        tracker.commit_failed(10, 1, cause)
        tracker.commit_failed(10, 1, cause)
    dlq.handler_failed(10, "handler-failed", "boom")
    dlq.limit = 1
    dlq.commit_failed(10, 1, refused)
    line = dlq.commit_failed(10, 1, refused)
    assert [len(unproducible.poison[10].error), len(restamped.poison[10].error), len(line or "")] == [
        1000
    ] * 3


def test_a_one_off_refusal_of_a_record_alone_is_redone_before_it_is_judged() -> None:
    """Bisecting, a record alone refused once (a bit flipped on the wire: CORRUPT_MESSAGE) is redone, not
    dead-lettered, and a poison record's DLQ record refused once does not stop the partition (poison seed 6)."""
    tracker = PoisonTracker("raw-0")
    tracker.limit = 1
    assert tracker.commit_failed(10, 1, CorruptRecordException()) is None
    assert tracker.poison == {}
    tracker.committed(11)
    tracker.handler_failed(11, "handler-failed", "boom")
    assert tracker.commit_failed(11, 1, CorruptRecordException()) is None
    assert tracker.poison == {11: Poison("handler-failed", "boom")}
    tracker.committed(12)
    assert tracker.commit_failed(12, 1, InvalidTimestampError()) is None
    assert tracker.commit_failed(12, 1, CorruptRecordException()) is None  # another failure: not a repeat
    assert tracker.poison == {}


def test_halving_a_batch_already_bisected_needs_no_second_look() -> None:
    """While bisecting, a refused half is halved at once: only the judgement of a record alone waits for a repeat."""
    tracker = PoisonTracker("raw-0")
    tracker.limit = 4
    tracker._until = 100
    assert tracker.commit_failed(20, 4, RecordTooLargeError()) is None
    assert _limit(tracker) == 2


def test_a_handler_failure_says_which_offset_failed_and_how() -> None:
    """HandlerFailedError keeps the offset and the error, and its message names both."""
    exc = HandlerFailedError(7, "ValueError('a bug')")
    assert (exc.offset, exc.error, str(exc)) == (7, "ValueError('a bug')", "offset 7: ValueError('a bug')")


def test_a_record_refused_alone_is_logged_naming_its_partition_and_offset(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The warning that a record alone fails to commit names the partition whose tracker it is (a task's own, by
    the task's name) and the offset."""
    task = Harness(tmp_path).task(3)
    refused = RecordTooLargeError("too big")
    with caplog.at_level(logging.WARNING, logger="pipeline.worker.poison"):
        for tracker in (PoisonTracker("raw-0"), task.poison):
            tracker.commit_failed(10, 1, refused)
            tracker.commit_failed(10, 1, refused)
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "raw-0: offset 10 alone fails to commit",
        f"{INPUT}-3: offset 10 alone fails to commit",
    ]
