"""Every way a worker reaches outside its process, in one value: :class:`WorkerIO`.

The worker is built with one (:func:`kafka_io` by default): its group consumer and its one
transactional producer, what it asks the group coordinator (:class:`GroupLink`), the fence
of a transactional id, the changelog reader of its restore service, the topics' layout, how
stores open, and the wall clock. Unit tests and the simulation pass their own; nothing
replaces a module's attributes.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from pipeline.kafka import internals
from pipeline.kafka.admin import TopicLayout, topic_layout
from pipeline.kafka.changelog import ChangelogReader
from pipeline.kafka.clients import STANDBY_CLIENT_ID, transactional_producer, worker_consumer
from pipeline.kafka.group import ConsumerGroup
from pipeline.state.directory import StoreOpener
from pipeline.state.store import PartitionStore
from pipeline.topology import Topology
from pipeline.worker.settings import WorkerSettings


class GroupLink(Protocol):
    """What the worker asks its group coordinator."""

    async def committed(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        """Each partition's committed offset (None: none yet), read stable: pending transactions waited out."""
        ...

    async def member(self) -> bool | None:
        """Whether the group counts this worker a member of its current generation (None: unknown)."""
        ...

    def rejoin(self) -> None:
        """Rejoin the group now."""
        ...


@dataclass(frozen=True)
class WorkerIO:
    """The worker's outside world (see the module docstring)."""

    consumer: Callable[..., AIOKafkaConsumer]  # (settings, *, assignor) -> the group consumer
    producer: Callable[[WorkerSettings, str, AIOKafkaConsumer], AIOKafkaProducer]  # (settings, txn id, group)
    group: Callable[[AIOKafkaConsumer], GroupLink]
    fence: Callable[[AIOKafkaProducer, str], Awaitable[None]]  # InitProducerId for a transactional id
    changelog_reader: Callable[[WorkerSettings], ChangelogReader]
    layout: Callable[[str, Topology], Awaitable[TopicLayout]]
    open_store: StoreOpener = PartitionStore.open
    wall: Callable[[], float] = time.time


def _producer(settings: WorkerSettings, transactional_id: str, consumer: AIOKafkaConsumer) -> AIOKafkaProducer:
    """The worker's transactional producer, its offsets sent with ``consumer``'s group generation."""
    producer = transactional_producer(settings, transactional_id)
    use_group = getattr(internals, "use_group_metadata", None)
    if use_group is not None:
        use_group(producer, consumer)
    return producer


async def _fence(producer: AIOKafkaProducer, transactional_id: str) -> None:
    fence = getattr(internals, "fence_transactional_id", None)
    if fence is not None:
        await fence(producer, transactional_id)


def _reader(settings: WorkerSettings) -> ChangelogReader:
    # two fetches of a restore in flight: each takes half of what the restore holds of the budget
    return ChangelogReader(
        settings.bootstrap, fetch_bytes=max(settings.restore_fetch_bytes // 2, 1), client_id=STANDBY_CLIENT_ID
    )


def kafka_io(open_store: StoreOpener = PartitionStore.open) -> WorkerIO:
    """The real world: aiokafka clients to the settings' bootstrap servers, RocksDB stores, the system clock."""
    return WorkerIO(
        consumer=worker_consumer,
        producer=_producer,
        group=ConsumerGroup,
        fence=_fence,
        changelog_reader=_reader,
        layout=topic_layout,
        open_store=open_store,
    )


def describe(value: Any) -> str:
    """A short name for a client, in log lines."""
    return type(value).__name__
