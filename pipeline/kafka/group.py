"""What the worker asks its consumer group's coordinator, through its group consumer.

:class:`ConsumerGroup` is the real :class:`~pipeline.worker.io.GroupLink`: the committed offsets
a new owner starts from (read *stable*: a transaction that holds offsets for the partition and
has not ended yet is waited for, instead of the older offsets being read), whether the group
still counts this worker a member of its generation, and a rejoin on request. Each is a door
of :mod:`pipeline.kafka.internals`.
"""

from __future__ import annotations

from collections.abc import Iterable

from aiokafka import AIOKafkaConsumer, TopicPartition

from pipeline.kafka import internals


class ConsumerGroup:
    """The group coordinator's answers about ``consumer``'s group."""

    def __init__(self, consumer: AIOKafkaConsumer) -> None:
        self.consumer = consumer

    async def committed(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        """The group's committed offset of each partition (None: none), waiting out pending transactions."""
        wanted = list(partitions)
        stable = getattr(internals, "committed_stable", None)
        if stable is not None:
            found: dict[TopicPartition, int | None] = await stable(self.consumer, wanted)
            return found
        return {tp: await self.consumer.committed(tp) for tp in wanted}

    async def member(self) -> bool | None:
        """Whether the coordinator still counts this worker a member of its generation (None: unknown)."""
        return await internals.generation_current(self.consumer)

    def rejoin(self) -> None:
        """Rejoin the group at once: a new generation assigns every partition anew."""
        internals.request_rejoin(self.consumer)
