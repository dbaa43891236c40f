"""When the worker loop fetches and when a partition counts as caught up: pure timing rules.

Kept apart from :mod:`pipeline.worker.loop`, which owns the consumer and the
partitions; these functions only read them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from aiokafka import TopicPartition

from pipeline.worker.partition import Partition


class _StableEnds(Protocol):
    def last_stable_offset(self, partition: TopicPartition) -> int | None: ...


def poll_ms(partitions: Iterable[Partition], *, commit_interval: float) -> int:
    """How long a fetch may wait: not at all when records can be handled, else up to half
    the commit interval.

    Records held for a partition's commit (or at its bisecting limit until it commits) do not
    shorten the wait: the end of that commit wakes the loop, however long it took.
    """
    for part in partitions:
        if part.can_work:
            return 0
    return int(commit_interval * 500)


def caught_up(consumer: _StableEnds, part: Partition, *, fetched: bool) -> bool:
    """Nothing of ``part`` waits: its fetch came back empty, or it handled up to the log's stable end."""
    txn = part.txn
    if part.queue or txn is None or not txn.in_transaction:
        return False
    if not fetched:
        return True
    end = consumer.last_stable_offset(part.tp)
    return end is not None and txn.next_offset is not None and txn.next_offset >= end
