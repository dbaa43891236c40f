"""Input partitions whose committed offset trails the end only by what no reader ever gets.

A worker commits its input offsets in the transaction of what it handled. What a
read_committed reader skips (the records of an aborted transaction: a fenced zombie's
reroutes into the input topic; and every transaction's marker) is never handled, so when
it ends a partition and nothing arrives after it, the group's committed offset stays
before it though nothing is left to do: "committed reached the end" would never hold.
:class:`Settled` asks the broker instead, through a read_committed consumer of its own
(confluent-kafka; it never commits), whether any record is readable between a committed
offset and the end.
"""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, KafkaException, TopicPartition

from tests.chaos.cluster import Sample

CHECK_EVERY = 3.0  # seconds between two checks of the same partition


class Settled:
    """Remembers each partition found with nothing readable from its committed offset to its end."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"chaos-settled-{uuid.uuid4().hex[:8]}",  # assign() only: never joins, never commits
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            }
        )
        self.found: dict[
            int, tuple[int, int]
        ] = {}  # partition -> (committed, end) with nothing readable between
        self._checked: dict[int, float] = {}

    def holds(self, partition: int, committed: int, end: int) -> bool:
        """Whether ``partition`` was found with nothing readable from ``committed`` to ``end``."""
        return self.found.get(partition) == (committed, end)

    def check(self, sample: Sample, lagging: list[int]) -> None:
        """Check the ``lagging`` partitions of ``sample`` (each at most every few seconds)."""
        now = time.monotonic()
        for p in lagging:
            where = (sample.committed[p], sample.ends[p])
            if self.found.get(p) == where or now - self._checked.get(p, 0.0) < CHECK_EVERY:
                continue
            self._checked[p] = now
            if self.nothing_readable(p, *where):
                self.found[p] = where

    def nothing_readable(self, partition: int, start: int, end: int, timeout: float = 5.0) -> bool:
        """True when a read_committed read from ``start`` reaches ``end`` without a record (False when it gets one,
        or cannot tell in ``timeout``)."""
        tp = TopicPartition(self.topic, partition)
        try:
            self.consumer.assign([TopicPartition(self.topic, partition, start)])
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                for message in self.consumer.consume(100, timeout=0.5):
                    offset = message.offset()
                    if message.error() is None and offset is not None and offset < end:
                        return False
                if self.consumer.position([tp])[0].offset >= end:
                    return True
            return False
        except KafkaException:
            return False
        finally:
            self.consumer.unassign()

    def close(self) -> None:
        self.consumer.close()
