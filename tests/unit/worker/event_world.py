"""A world for the event stage's unit tests: input partition 0's stage of a topology over an in-memory
store, a recording producer and a recording metrics recorder, and the records it is given."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from pipeline import topology as topology_module
from pipeline.kafka.partitioner import KeyPartitioner
from pipeline.state.partition_transaction import PartitionTransaction
from pipeline.state.store import Change
from pipeline.topology import Topology
from pipeline.worker.classify import Classifier
from pipeline.worker.emitter import OutputTopics
from pipeline.worker.event_stage import EventStage
from pipeline.worker.stage import Poison

from .effect_world import MemoryStore, Recorded
from .fakes import MIB, PARTITIONS, ROOT, T0, FakeProducer, Sent, part_transaction, record

SHOP = topology_module.load(ROOT / "topologies" / "stripe-fulfilment.toml")  # routes with effect keys
WALL_S = (T0 + 10_000) / 1000  # the stage's clock: ten seconds after T0
HORIZON = T0 + 10_000 + 3_600_000  # the clock plus the default max skew


def stripe_event(key: str, event_type: str, **data_object: Any) -> bytes:
    """A Stripe event body for ``key`` of ``event_type`` whose ``data.object`` holds ``data_object``."""
    return orjson.dumps(
        {"id": key.split(":", 1)[1], "type": event_type, "object": "event", "data": {"object": data_object}}
    )


def shop_record(
    offset: int, key: str, event_type: str, *, timestamp: int | None = None, **data_object: Any
) -> ConsumerRecord[bytes, bytes]:
    """An input record of the stripe-fulfilment topology on partition 0."""
    return record(
        offset,
        key,
        value=stripe_event(key, event_type, **data_object),
        topic=SHOP.topics.input,
        timestamp=timestamp,
    )


class RecordingStore(MemoryStore):
    """A :class:`MemoryStore` that also keeps every change it was asked to write."""

    def __init__(self) -> None:
        super().__init__()
        self.changes: list[Change] = []

    def write(
        self, changes: Mapping[bytes, Change], *, changelog_offset: int | None, stream_time: int
    ) -> None:
        """Keep the changes, then apply them."""
        self.changes.extend(changes.values())
        super().write(changes, changelog_offset=changelog_offset, stream_time=stream_time)


@dataclass
class EventWorld:
    """Input partition 0's event stage over a fake producer's transaction and an in-memory store."""

    topology: Topology
    stage: EventStage
    txn: PartitionTransaction
    producer: FakeProducer
    store: RecordingStore
    recorder: Recorded
    poison: dict[int, Poison] = field(default_factory=dict)

    async def run(self, records: list[ConsumerRecord[bytes, bytes]]) -> None:
        """Handle ``records`` and commit."""
        await self.stage.handle(records, self.poison)
        await self.txn.txn.commit()

    def sent(self, topic: str) -> list[Sent]:
        """The committed records of ``topic``."""
        return self.producer.committed_to(topic)

    def audit(self) -> list[dict[str, Any]]:
        """The committed audit records, as JSON."""
        return [s.json() for s in self.sent(self.topology.topics.audit)]

    def dlq(self) -> list[dict[str, Any]]:
        """The committed DLQ records, as JSON."""
        return [s.json() for s in self.sent(self.topology.topics.dlq)]


def build_event_world(
    topology: Topology,
    *,
    limits: dict[str, int] | None = None,
    partitioner: Callable[[bytes, int], int] | None = None,
    wall: Callable[[], float] = lambda: WALL_S,
    **kwargs: Any,
) -> EventWorld:
    """Input partition 0's stage of ``topology``: every topic of :data:`PARTITIONS` partitions; ``limits``
    override 4 MiB, ``partitioner`` the outputs' murmur2; the rest go to the stage."""
    topics = topology.topics
    names = [
        topics.input,
        topics.commands,
        topics.audit,
        topics.dlq,
        topics.changelog,
        topics.effects,
        topics.effects_changelog,
        *topology.command_topics(),
    ]
    all_limits = {**dict.fromkeys(names, 4 * MIB), **(limits or {})}
    outputs = OutputTopics(dict.fromkeys(names, PARTITIONS), partitioner or KeyPartitioner(), all_limits)
    store = RecordingStore()
    producer = FakeProducer("event-0")
    tp = TopicPartition(topics.input, 0)
    txn = part_transaction(
        producer, tp, store=store, changelog=TopicPartition(topics.changelog, 0), limits=outputs.limits
    )
    recorder = Recorded()
    stage = EventStage(
        tp=tp,
        topology=topology,
        classifier=Classifier(topology, KeyPartitioner(), input_partitions=PARTITIONS, environ={}),
        txn=txn,
        outputs=outputs,
        recorder=recorder,
        wall=wall,
        **kwargs,
    )
    return EventWorld(topology, stage, txn, producer, store, recorder)
