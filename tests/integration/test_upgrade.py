"""A rolling upgrade from one producer per partition (older workers) to one per worker, on the real broker."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from pipeline.kafka.partitioner import owner_partition
from pipeline.worker.clients import legacy_transactional_id
from tests.integration.harness import Env, command_counts, read_committed, wait_for_audit

pytestmark = [pytest.mark.broker, pytest.mark.slow]

MakeEnv = Callable[..., Any]


def _keys_on(partition: int, partitions: int, count: int) -> list[str]:
    found: list[str] = []
    i = 0
    while len(found) < count:
        key = f"stripe:evt_up_{i}"
        if owner_partition(key.encode(), partitions) == partition:
            found.append(key)
        i += 1
    return found


async def _commit_as_an_older_worker(producer: AIOKafkaProducer, tp: TopicPartition, group: str) -> None:
    """The older worker's end of a batch: its offsets (TxnOffsetCommit v0), then the commit."""
    await producer.send_offsets_to_transaction({tp: 1}, group)
    await asyncio.wait_for(producer.commit_transaction(), 30)


async def test_a_new_worker_fences_an_older_workers_open_transaction_on_each_partition_it_takes(
    pipeline_env: MakeEnv,
) -> None:
    """An older worker (its producer's transactional id is the partition's) has an open transaction holding a
    command when it stalls, before its offsets; a worker of this version takes the partition over and handles it
    from offset 0. The older worker wakes and commits its offsets (v0: the group cannot check them) and its
    transaction: refused, it was fenced. Every key has one command."""
    env: Env = await pipeline_env()
    partitions = env.topo.topics.partitions
    keys = _keys_on(0, partitions, 4)
    await env.produce(
        (k.encode(), env.stripe_body(k.split(":", 1)[1]), [("source", b"stripe")], 0, None) for k in keys
    )
    old_id = legacy_transactional_id(env.topo.app, env.group, env.topo.topics.input, 0)
    zombie = AIOKafkaProducer(bootstrap_servers=env.bootstrap, transactional_id=old_id, acks="all")
    await zombie.start()
    try:
        await zombie.begin_transaction()
        command = orjson.dumps({"command": "handle", "key": keys[0]})
        await zombie.send_and_wait(env.topo.topics.commands, command, key=keys[0].encode())
        # ... and it stalls here, its transaction open (as an older worker paused mid-batch)

        env.start_worker("new")
        audit = await wait_for_audit(env, len(keys))
        assert sorted(a["offset"] for a in audit) == [0, 1, 2, 3]
        with pytest.raises(KafkaError):  # the older worker wakes up: fenced
            await _commit_as_an_older_worker(zombie, TopicPartition(env.topo.topics.input, 0), env.group)
    finally:
        env.stop_all()
        await zombie.stop()
    commands = await read_committed(env.bootstrap, env.topo.topics.commands, idle=1.0)
    assert command_counts(commands) == Counter(dict.fromkeys(keys, 1)), env.log_tail("new")
