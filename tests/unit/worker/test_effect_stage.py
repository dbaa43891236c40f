"""The effect stage dedupes commands by effect key, on the one partition that owns each key."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from aiokafka import TopicPartition

from pipeline import topology as topology_module
from pipeline.headers import COMMAND_TOPIC_HEADER, EFFECT_TTL_HEADER
from pipeline.kafka.partitioner import KeyPartitioner, owner_partition
from pipeline.kafka.transactional import TransactionalProducer
from pipeline.state.store import PartitionStore
from pipeline.state.transaction import PartitionTransaction
from pipeline.worker.effect_stage import EffectStage
from pipeline.worker.emitter import OutputTopics

from .fakes import ROOT, FakeProducer, record

TOPOLOGY = topology_module.load(ROOT / "topologies" / "stripe-fulfilment.toml")
TOPICS = TOPOLOGY.topics
PARTITIONS = 4


def _key_on(partition: int) -> str:
    """An effect key murmur2 places on effects ``partition``."""
    i = 0
    while owner_partition(f"fulfil-order:pi_{i}".encode(), PARTITIONS) != partition:
        i += 1
    return f"fulfil-order:pi_{i}"


def _effect_record(offset: int, key: str, *, partition: int) -> object:
    command = {
        "command": "fulfil-order",
        "key": f"stripe:evt_{offset}",
        "source": "stripe",
        "event_type": "x",
    }
    headers = [(EFFECT_TTL_HEADER, b"2592000000"), (COMMAND_TOPIC_HEADER, b"shop.orders")]
    return record(
        offset, key, partition=partition, value=orjson.dumps(command), headers=headers, topic=TOPICS.effects
    )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[PartitionStore]:
    opened = PartitionStore.open(tmp_path / "effects-0", bucket_ms=3_600_000)
    yield opened
    opened.close()


async def test_a_record_on_a_partition_its_effect_key_does_not_hash_to_is_moved_not_deduped(
    store: PartitionStore,
) -> None:
    """After the effects topic grew, a record waiting on the old partition is rerouted to its key's owner
    (audited as rerouted) instead of being deduped there too, which would emit its effect twice."""
    names = [*TOPOLOGY.command_topics(), TOPICS.effects, TOPICS.effects_changelog, TOPICS.audit, TOPICS.dlq]
    outputs = OutputTopics(dict.fromkeys(names, PARTITIONS), KeyPartitioner(), dict.fromkeys(names, 1 << 22))
    producer = FakeProducer("effects-0")
    txn = PartitionTransaction(
        tp=TopicPartition(TOPICS.effects, 0),
        group="g",
        producer=TransactionalProducer(producer, "effects-0"),
        store=store,
        changelog=TopicPartition(TOPICS.effects_changelog, 0),
        limits=outputs.limits,
    )
    stage = EffectStage(tp=TopicPartition(TOPICS.effects, 0), topology=TOPOLOGY, txn=txn, outputs=outputs)
    ours, theirs = _key_on(0), _key_on(2)
    await stage.handle([_effect_record(5, ours, partition=0), _effect_record(6, theirs, partition=0)], {})
    await txn.commit()
    commands = producer.committed_to("shop.orders")
    assert [s.key for s in commands] == [ours.encode()]
    moved = producer.committed_to(TOPICS.effects)
    assert [(s.partition, s.key) for s in moved] == [(2, theirs.encode())]
    assert dict(moved[0].headers)["rerouted-from"] == b"0:6"
    audit = {s.json()["offset"]: s.json()["outcome"] for s in producer.committed_to(TOPICS.audit)}
    assert audit == {5: "first", 6: "rerouted"}
    assert store.get_many([theirs.encode()]) == {}  # never claimed here
