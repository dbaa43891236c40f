"""When the worker loop fetches and when a partition counts as caught up: pure timing rules.

Kept apart from :mod:`pipeline.worker.loop`, which owns the consumer and the
partitions; these functions only read them.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Protocol

from aiokafka import TopicPartition

from pipeline.worker.lifecycle import PartitionState
from pipeline.worker.partition import Partition

HELD_POLL_MS = 2  # the fetch wait while records wait for their partition's commit to end...
HELD_POLL_FOR = 0.25  # ...for this long: a commit slower than that waits on a broker in trouble


class _StableEnds(Protocol):
    def last_stable_offset(self, partition: TopicPartition) -> int | None: ...


def poll_ms(partitions: Mapping[TopicPartition, Partition], *, commit_interval: float) -> int:
    """How long a fetch may wait: not at all when records wait to be handled, briefly when
    records wait for their partition's commit to end (so they follow it at once), else up
    to half the commit interval.

    Only for the first :data:`HELD_POLL_FOR` of a commit: each fetch that finds a fetch
    error wakes aiokafka's fetcher to try the broker again, so polling every 2 ms through
    a broker outage would retry (and log) hundreds of times a second.
    """
    held = False
    now = time.monotonic()
    for part in partitions.values():
        if part.queue:
            if part.state is PartitionState.READY:
                return 0
            if part.state is PartitionState.COMMITTING:
                held = held or now - part.state_since < HELD_POLL_FOR
    return HELD_POLL_MS if held else int(commit_interval * 500)


def caught_up(consumer: _StableEnds, part: Partition, *, fetched: bool) -> bool:
    """Nothing of ``part`` waits: its fetch came back empty, or it handled up to the log's stable end."""
    txn = part.txn
    if part.queue or txn is None or not txn.in_transaction:
        return False
    if not fetched:
        return True
    end = consumer.last_stable_offset(part.tp)
    return end is not None and txn.next_offset is not None and txn.next_offset >= end
