"""What the worker asks its consumer group's coordinator, through its group consumer.

:class:`ConsumerGroup` is the real :class:`~pipeline.worker.io.GroupLink`: the committed offsets
a new owner starts from (read *stable*: a transaction that holds offsets for the partition and
has not ended yet is waited for, instead of the older offsets being read), whether the group
still counts this worker a member of its generation, the generation a transaction's offsets
carry, and a rejoin on request. Each is a door
of :mod:`pipeline.kafka.internals`.
"""

from __future__ import annotations

from collections.abc import Iterable

from aiokafka import AIOKafkaConsumer, TopicPartition

from pipeline.kafka import internals
from pipeline.kafka.requests import GroupMetadata
from pipeline.kafka.stable_offsets import committed_stable


class ConsumerGroup:
    """The group coordinator's answers about ``consumer``'s group."""

    def __init__(self, consumer: AIOKafkaConsumer) -> None:
        self.consumer = consumer

    async def committed(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        """The group's committed offset of each partition (None: none), waiting out pending transactions."""
        return await committed_stable(self.consumer, partitions)

    def metadata(self) -> GroupMetadata:
        """The group, generation, member id and group instance id the consumer holds now."""
        return internals.group_metadata(self.consumer)

    async def member(self) -> bool | None:
        """Whether the coordinator still counts this worker a member of its generation (None: unknown)."""
        return await internals.generation_current(self.consumer)

    def rejoin(self) -> None:
        """Rejoin the group at once: a new generation assigns every partition anew."""
        internals.request_rejoin(self.consumer)
