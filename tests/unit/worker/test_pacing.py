"""When the loop fetches and when a partition counts as caught up (``pipeline.worker.pacing``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition

from pipeline.worker.pacing import caught_up, poll_ms

TP = TopicPartition("events", 0)


class Ends:
    """The consumer's view of the log's stable end."""

    def __init__(self, end: int | None) -> None:
        self.end = end

    def last_stable_offset(self, partition: TopicPartition) -> int | None:
        assert partition == TP
        return self.end


def _task(
    *, queue: int = 0, part: bool = True, in_transaction: bool = True, next_offset: int | None = 5
) -> Any:
    """A task stand-in: ``queue`` records waiting, and its part of the transaction (or none)."""
    txn = SimpleNamespace(in_transaction=in_transaction, next_offset=next_offset) if part else None
    return SimpleNamespace(tp=TP, queue=[object()] * queue, part=txn)


@pytest.mark.parametrize(
    "task",
    [_task(queue=1), _task(part=False), _task(in_transaction=False)],
    ids=["records-queued", "no-part", "not-in-the-transaction"],
)
@pytest.mark.parametrize("fetched", [False, True])
def test_a_task_with_records_waiting_or_nothing_handled_is_not_caught_up(task: Any, fetched: bool) -> None:
    """Records still queued, or no part in the open transaction: never caught up, whatever the fetch said."""
    assert caught_up(Ends(0), task, fetched=fetched) is False


def test_an_empty_fetch_means_caught_up() -> None:
    """A task in the transaction with nothing queued and nothing fetched: caught up, the log's end unread."""
    assert caught_up(Ends(None), _task(next_offset=None), fetched=False) is True


@pytest.mark.parametrize(
    ("end", "next_offset", "expected"),
    [(5, 5, True), (4, 5, True), (6, 5, False), (None, 5, False), (5, None, False)],
)
def test_after_a_fetch_a_task_is_caught_up_once_it_handled_up_to_the_stable_end(
    end: int | None, next_offset: int | None, expected: bool
) -> None:
    """Records fetched: caught up only when the next offset reached the last stable offset (both known)."""
    assert caught_up(Ends(end), _task(next_offset=next_offset), fetched=True) is expected


def test_the_fetch_waits_half_the_commit_interval_when_nothing_can_be_handled() -> None:
    """No task that can work: half the commit interval in ms; one that can: no wait."""
    idle: Any = SimpleNamespace(can_work=False)
    busy: Any = SimpleNamespace(can_work=True)
    assert poll_ms([idle], commit_interval=2.0) == 1000
    assert poll_ms([idle, busy], commit_interval=2.0) == 0
