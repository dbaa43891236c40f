"""When the worker loop fetches and when a partition counts as caught up: pure timing rules.

Kept apart from :mod:`pipeline.worker.loop`, which owns the consumer, and the task table;
these functions only read them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from aiokafka import TopicPartition

from pipeline.worker.task import ActiveTask


class _StableEnds(Protocol):
    def last_stable_offset(self, partition: TopicPartition) -> int | None: ...


def poll_ms(tasks: Iterable[ActiveTask], *, commit_interval: float) -> int:
    """How long a fetch may wait: not at all when records can be handled, else up to half
    the commit interval (a task held at its bisecting limit waits for its commit)."""
    for task in tasks:
        if task.can_work:
            return 0
    return int(commit_interval * 500)


def caught_up(consumer: _StableEnds, task: ActiveTask, *, fetched: bool) -> bool:
    """Nothing of ``task`` waits: its fetch came back empty, or it handled up to the log's stable end."""
    part = task.part
    if task.queue or part is None or not part.in_transaction:
        return False
    if not fetched:
        return True
    end = consumer.last_stable_offset(task.tp)
    return end is not None and part.next_offset is not None and part.next_offset >= end
