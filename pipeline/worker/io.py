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
from typing import Protocol

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from pipeline.kafka import internals
from pipeline.kafka.changelog import ChangelogReader
from pipeline.kafka.clients import STANDBY_CLIENT_ID
from pipeline.kafka.fencing import fence_transactional_id
from pipeline.kafka.group import ConsumerGroup
from pipeline.kafka.requests import GroupMetadata
from pipeline.kafka.topic_layout import TopicLayout, topic_layout
from pipeline.kafka.transactional import SendOffsets
from pipeline.state.directory import StoreOpener
from pipeline.state.store import PartitionStore
from pipeline.topology import Topology
from pipeline.worker.clients import transactional_producer, worker_consumer
from pipeline.worker.settings import WorkerSettings


def wall_clock() -> float:
    """The system clock, read at each call (the simulation's virtual clock replaces ``time.time``)."""
    return time.time()


class GroupLink(Protocol):
    """What the worker asks its group coordinator."""

    async def committed(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        """Each partition's committed offset (None: none yet), read stable: pending transactions waited out."""
        ...

    async def member(self) -> bool | None:
        """Whether the group counts this worker a member of its current generation (None: unknown)."""
        ...

    def metadata(self) -> GroupMetadata:
        """The group's generation and this member's ids now (what a transaction's offsets carry)."""
        ...

    def rejoin(self) -> None:
        """Rejoin the group now."""
        ...


@dataclass(frozen=True)
class WorkerIO:
    """The worker's outside world (see the module docstring)."""

    consumer: Callable[..., AIOKafkaConsumer]  # (settings, *, assignor) -> the group consumer
    producer: Callable[[WorkerSettings, str], AIOKafkaProducer]  # (settings, transactional id)
    group: Callable[[AIOKafkaConsumer], GroupLink]
    fence: Callable[[AIOKafkaProducer, str], Awaitable[object]]  # InitProducerId for a transactional id
    changelog_reader: Callable[[WorkerSettings], ChangelogReader]
    layout: Callable[[str, Topology], Awaitable[TopicLayout]]
    send_offsets: SendOffsets = internals.send_offsets_with_group_metadata  # into the open transaction
    open_store: StoreOpener = PartitionStore.open
    wall: Callable[[], float] = wall_clock


def _reader(settings: WorkerSettings) -> ChangelogReader:
    # two fetches of a restore in flight: each takes half of what the restore holds of the budget
    return ChangelogReader(
        settings.bootstrap, fetch_bytes=max(settings.restore_fetch_bytes // 2, 1), client_id=STANDBY_CLIENT_ID
    )


def kafka_io(open_store: StoreOpener = PartitionStore.open) -> WorkerIO:
    """The real world: aiokafka clients to the settings' bootstrap servers, RocksDB stores, the system clock."""
    return WorkerIO(
        consumer=worker_consumer,
        producer=transactional_producer,
        group=ConsumerGroup,
        fence=fence_transactional_id,
        changelog_reader=_reader,
        layout=topic_layout,
        open_store=open_store,
    )
