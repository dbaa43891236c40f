"""The effect stage dedupes commands by effect key, on the one partition that owns each key."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import TopicPartition

from pipeline import topology as topology_module
from pipeline.headers import COMMAND_TOPIC_HEADER, EFFECT_TTL_HEADER, REPLAYED_FROM_HEADER
from pipeline.kafka.partitioner import KeyPartitioner, owner_partition
from pipeline.state.store import PartitionStore
from pipeline.worker.classify import Classifier
from pipeline.worker.effect_stage import EffectStage
from pipeline.worker.emitter import OutputTopics
from pipeline.worker.event_stage import EventStage

from .fakes import ROOT, T0, FakeProducer, part_transaction, record

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


def _effects_partition_0(store: PartitionStore) -> tuple[EffectStage, Any, FakeProducer]:
    """The effect stage of effects partition 0 over ``store``, its transaction and its producer."""
    names = [*TOPOLOGY.command_topics(), TOPICS.effects, TOPICS.effects_changelog, TOPICS.audit, TOPICS.dlq]
    outputs = OutputTopics(dict.fromkeys(names, PARTITIONS), KeyPartitioner(), dict.fromkeys(names, 1 << 22))
    producer = FakeProducer("effects-0")
    txn = part_transaction(
        producer,
        TopicPartition(TOPICS.effects, 0),
        store=store,
        changelog=TopicPartition(TOPICS.effects_changelog, 0),
        limits=outputs.limits,
    )
    stage = EffectStage(tp=TopicPartition(TOPICS.effects, 0), topology=TOPOLOGY, txn=txn, outputs=outputs)
    return stage, txn, producer


async def test_a_record_on_a_partition_its_effect_key_does_not_hash_to_is_moved_not_deduped(
    store: PartitionStore,
) -> None:
    """After the effects topic grew, a record waiting on the old partition is rerouted to its key's owner
    (audited as rerouted) instead of being deduped there too, which would emit its effect twice."""
    stage, txn, producer = _effects_partition_0(store)
    ours, theirs = _key_on(0), _key_on(2)
    await stage.handle([_effect_record(5, ours, partition=0), _effect_record(6, theirs, partition=0)], {})
    await txn.txn.commit()
    commands = producer.committed_to("shop.orders")
    assert [s.key for s in commands] == [ours.encode()]
    moved = producer.committed_to(TOPICS.effects)
    assert [(s.partition, s.key) for s in moved] == [(2, theirs.encode())]
    assert dict(moved[0].headers)["rerouted-from"] == b"0:6"
    audit = {s.json()["offset"]: s.json()["outcome"] for s in producer.committed_to(TOPICS.audit)}
    assert audit == {5: "first", 6: "rerouted"}
    assert store.get_many([theirs.encode()]) == {}  # never claimed here


async def test_a_redriven_effect_record_is_audited_with_where_it_was_redriven_from(
    store: PartitionStore,
) -> None:
    """An effect-stage record `pipeline dlq replay` sent back carries `replayed-from`; its audit record names it, as
    the first stage's do (the console follows a redrive's outcome by it)."""
    stage, txn, producer = _effects_partition_0(store)
    redriven = _effect_record(5, _key_on(0), partition=0)
    redriven.headers.append((REPLAYED_FROM_HEADER, b"shop.dlq:0:7"))  # type: ignore[attr-defined]
    await stage.handle([redriven], {})
    await txn.txn.commit()
    [audit] = [s.json() for s in producer.committed_to(TOPICS.audit)]
    assert (audit["outcome"], audit["replayed_from"]) == ("first", "shop.dlq:0:7")


def _payment_key_on(partition: int, start: int) -> str:
    """An event key murmur2 places on input ``partition``."""
    i = start
    while owner_partition(f"stripe:evt_cs_{i}".encode(), PARTITIONS) != partition:
        i += 1
    return f"stripe:evt_cs_{i}"


def _checkout(offset: int, key: str, *, pad: int) -> object:
    """A checkout.session.completed for payment ``pi_<offset>`` on input partition 0, ``pad`` bytes of filler."""
    session = {"id": f"cs_{offset}", "payment_intent": f"pi_{offset}", "pad": "x" * pad}
    event = {"id": key.split(":", 1)[1], "type": "checkout.session.completed", "data": {"object": session}}
    return record(offset, key, partition=0, value=orjson.dumps(event), topic=TOPICS.input)


async def test_a_command_too_large_for_its_command_topic_is_dead_lettered_at_the_event_stage_unclaimed(
    store: PartitionStore,
) -> None:
    """An effects record that fits the effects topic but not its command topic goes to the DLQ (too-large) from the
    event stage with its event key unclaimed, so replaying it later gives the effect; the next record goes on."""
    names = [
        *TOPOLOGY.command_topics(),
        TOPICS.input,
        TOPICS.changelog,
        TOPICS.effects,
        TOPICS.audit,
        TOPICS.dlq,
    ]
    limits = {**dict.fromkeys(names, 1 << 22), "shop.orders": 3000}
    outputs = OutputTopics(dict.fromkeys(names, PARTITIONS), KeyPartitioner(), limits)
    producer = FakeProducer("raw-0")
    tp = TopicPartition(TOPICS.input, 0)
    txn = part_transaction(
        producer, tp, store=store, changelog=TopicPartition(TOPICS.changelog, 0), limits=outputs.limits
    )
    classifier = Classifier(TOPOLOGY, KeyPartitioner(), input_partitions=PARTITIONS, environ={})
    stage = EventStage(tp=tp, topology=TOPOLOGY, classifier=classifier, txn=txn, outputs=outputs)
    big, small = _payment_key_on(0, 0), _payment_key_on(0, 1000)
    await stage.handle([_checkout(5, big, pad=4000), _checkout(6, small, pad=10)], {})
    await txn.txn.commit()
    [dead] = [s.json() for s in producer.committed_to(TOPICS.dlq)]
    assert (dead["reason"], dead["offset"], dead["topic"]) == ("too-large", 5, TOPICS.input)
    assert "shop.orders" in dead["error"]
    assert [s.key for s in producer.committed_to(TOPICS.effects)] == [b"fulfil-order:pi_6"]
    assert store.get_many([big.encode()]) == {}  # unclaimed: a replay is handled as a first copy
    assert set(store.get_many([small.encode()])) == {small.encode()}
    audit = {s.json()["offset"]: s.json()["outcome"] for s in producer.committed_to(TOPICS.audit)}
    assert audit == {5: "invalid", 6: "first"}


async def test_an_effect_key_claimed_again_after_its_claim_expired_is_held_once_in_its_new_bucket(
    store: PartitionStore,
) -> None:
    """A copy arriving once an effect key's claim has expired claims it again; the store moves the key to the
    new claim's expiry bucket instead of keeping a stale copy in the old one (which counts as a held key)."""
    stage, txn, producer = _effects_partition_0(store)
    key, hour = _key_on(0), 3_600_000  # the TTL is one store bucket
    headers = [(EFFECT_TTL_HEADER, str(hour).encode()), (COMMAND_TOPIC_HEADER, b"shop.orders")]
    value = orjson.dumps({"command": "fulfil-order", "key": "stripe:evt_1", "source": "stripe"})
    for offset, timestamp in [(5, T0), (6, T0 + hour)]:
        copy = record(offset, key, value=value, headers=headers, timestamp=timestamp, topic=TOPICS.effects)
        await stage.handle([copy], {})
        await txn.txn.commit()
    assert [s.json()["outcome"] for s in producer.committed_to(TOPICS.audit)] == ["first", "first"]
    assert [s.key for s in producer.committed_to("shop.orders")] == [key.encode()] * 2
    assert len(list(store.buckets())) == 2  # the old bucket is still live: only the key left it
    assert store.key_count() == 1
