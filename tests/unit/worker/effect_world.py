"""A world for the effect stage's unit tests: effects partition 0's stage over an in-memory store, a
recording producer and a recording metrics recorder, and the records it is given."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from pipeline import topology as topology_module
from pipeline.headers import (
    COMMAND_TOPIC_HEADER,
    EFFECT_TTL_HEADER,
)
from pipeline.kafka.partitioner import KeyPartitioner, owner_partition
from pipeline.state.decision import Entry
from pipeline.state.partition_transaction import PartitionTransaction
from pipeline.state.store import Change
from pipeline.worker.effect_stage import EffectStage
from pipeline.worker.emitter import OutputTopics
from pipeline.worker.stage import Poison

from .fakes import ROOT, FakeProducer, Sent, part_transaction

TOPOLOGY = topology_module.load(ROOT / "topologies" / "stripe-fulfilment.toml")
TOPICS = TOPOLOGY.topics
EFFECTS = TOPICS.effects
PARTITIONS = 4
T0 = 1_700_000_000_000  # record timestamps (ms)
WALL_S = 1_700_000_010.0  # the stage's clock: ten seconds after T0
HORIZON = 1_700_000_010_000 + 3_600_000  # the clock plus the default max skew
TTL = 2_592_000_000  # 30 days, the route's effect_ttl
ORDERS = "shop.orders"


def key_on(partition: int, *, prefix: bytes = b"fulfil-order:pi_", start: int = 0) -> bytes:
    """An effect key murmur2 places on effects ``partition``."""
    i = start
    while owner_partition(prefix + str(i).encode(), PARTITIONS) != partition:
        i += 1
    return prefix + str(i).encode()


def command_of(offset: int, **fields: Any) -> dict[str, Any]:
    """The command JSON the event stage writes for event ``stripe:evt_<offset>`` (``fields`` override)."""
    command: dict[str, Any] = {
        "command": "fulfil-order",
        "key": f"stripe:evt_{offset}",
        "effect_key": "ignored",
        "source": "stripe",
        "event_type": "checkout.session.completed",
        "received_at": T0 - 1000 + offset,
        "event": {"id": f"evt_{offset}"},
    }
    command.update(fields)
    return {name: value for name, value in command.items() if value is not ABSENT}


ABSENT: Any = object()  # a field left out of a command


def effect(
    offset: int,
    key: bytes | None,
    *,
    partition: int = 0,
    value: bytes | None = None,
    ttl: bytes | None = str(TTL).encode(),
    topic: bytes | None = ORDERS.encode(),
    extra_headers: list[tuple[str, bytes]] | None = None,
    timestamp: int | None = None,
) -> ConsumerRecord[bytes, bytes]:
    """An effects-topic record as the event stage writes it (``None`` leaves a header out)."""
    body = orjson.dumps(command_of(offset)) if value is None else value
    headers = [(EFFECT_TTL_HEADER, ttl), (COMMAND_TOPIC_HEADER, topic), *(extra_headers or [])]
    kept = [(name, raw) for name, raw in headers if raw is not None]
    return ConsumerRecord(
        topic=EFFECTS,
        partition=partition,
        offset=offset,
        timestamp=T0 + offset if timestamp is None else timestamp,
        timestamp_type=0,
        key=key,
        value=body,
        checksum=None,
        serialized_key_size=len(key) if key else -1,
        serialized_value_size=len(body),
        headers=kept,
    )


@dataclass
class Recorded:
    """A recorder that keeps every count it is given."""

    outcomes: Counter[tuple[str | None, str]] = field(default_factory=Counter)
    commands: list[str] = field(default_factory=list)
    dlqs: list[str] = field(default_factory=list)
    skews: int = 0

    def outcome(self, source: str | None, outcome: str, count: int = 1) -> None:
        """Count an outcome."""
        self.outcomes[(source, outcome)] += count

    def command(self, topic: str, count: int = 1) -> None:
        """Note a command."""
        self.commands.extend([topic] * count)

    def dlq(self, reason: str, count: int = 1) -> None:
        """Note a DLQ record."""
        self.dlqs.extend([reason] * count)

    def skewed(self, count: int = 1) -> None:
        """Count a record dated past the skew bound."""
        self.skews += count


class MemoryStore:
    """A partition's seen-set in a dict, as the store holds it after each commit (no RocksDB: fast)."""

    def __init__(self) -> None:
        self.entries: dict[bytes, Entry] = {}
        self.stream_time = 0

    def get_many(self, keys: list[bytes]) -> dict[bytes, Entry]:
        """The entries of ``keys`` held."""
        return {key: self.entries[key] for key in keys if key in self.entries}

    def write(
        self, changes: Mapping[bytes, Change], *, changelog_offset: int | None, stream_time: int
    ) -> None:
        """Apply a committed part's changes."""
        self.entries.update({key: change.entry for key, change in changes.items()})
        self.stream_time = max(self.stream_time, stream_time)

    def expire(self) -> int:
        """Nothing expires here."""
        return 0


@dataclass
class World:
    """Effects partition 0's stage over a fake producer's transaction and an in-memory store."""

    stage: EffectStage
    txn: PartitionTransaction
    producer: FakeProducer
    store: MemoryStore
    recorder: Recorded

    async def run(
        self, records: list[ConsumerRecord[bytes, bytes]], poison: dict[int, Poison] | None = None
    ) -> None:
        """Handle ``records`` and commit."""
        await self.stage.handle(records, poison or {})
        await self.txn.txn.commit()

    def sent(self, topic: str) -> list[Sent]:
        """The committed records of ``topic``."""
        return self.producer.committed_to(topic)

    def audit(self) -> list[dict[str, Any]]:
        """The committed audit records, as JSON."""
        return [s.json() for s in self.sent(TOPICS.audit)]

    def dlq(self) -> list[dict[str, Any]]:
        """The committed DLQ records, as JSON."""
        return [s.json() for s in self.sent(TOPICS.dlq)]


Make = Callable[..., Awaitable[World]]


async def build_world(
    *,
    limits: dict[str, int] | None = None,
    partitioner: Callable[[bytes, int], int] | None = None,
    **kwargs: Any,
) -> World:
    """Effects partition 0's stage: ``limits`` override 4 MiB, ``partitioner`` murmur2, the rest go to the stage."""
    names = [*TOPOLOGY.command_topics(), EFFECTS, TOPICS.effects_changelog, TOPICS.audit, TOPICS.dlq]
    all_limits = {**dict.fromkeys(names, 1 << 22), **(limits or {})}
    outputs = OutputTopics(dict.fromkeys(names, PARTITIONS), partitioner or KeyPartitioner(), all_limits)
    store = MemoryStore()
    producer = FakeProducer("effects-0")
    txn = part_transaction(
        producer,
        TopicPartition(EFFECTS, 0),
        store=store,
        changelog=TopicPartition(TOPICS.effects_changelog, 0),
        limits=outputs.limits,
    )
    recorder = Recorded()
    stage = EffectStage(
        tp=TopicPartition(EFFECTS, 0),
        topology=TOPOLOGY,
        txn=txn,
        outputs=outputs,
        recorder=recorder,
        wall=lambda: WALL_S,
        **kwargs,
    )
    return World(stage, txn, producer, store, recorder)
