"""The changelog's time retention, on the real broker, never deletes a claim a backlog made while it is live."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from pipeline.kafka.admin import TopicSpec, ensure_topics
from tests.conftest import TopicFactory
from tests.integration.harness import Env, command_counts, read_committed, wait_for_audit

pytestmark = [pytest.mark.broker, pytest.mark.slow]

MakeEnv = Callable[..., Any]
DAY_MS = 86_400_000
EVENTS = 20


async def _log_starts(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    """Each partition's first offset (retention moves it)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        return {tp.partition: offset for tp, offset in (await consumer.beginning_offsets(tps)).items()}
    finally:
        await consumer.stop()


async def _until_the_broker_deleted_by_time(bootstrap: str, control: str, timeout: float) -> None:
    """Write a record stamped three days ago to ``control`` (compacted and deleted, retention two days) and
    wait until the broker has deleted it: the same pass ran over every changelog written before."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(
            control, b"old", key=b"k", timestamp_ms=int(time.time() * 1000) - 3 * DAY_MS
        )
    finally:
        await producer.stop()
    deadline = time.monotonic() + timeout
    while (await _log_starts(bootstrap, control, 1))[0] == 0:
        if time.monotonic() > deadline:
            pytest.fail(f"the broker's retention check did not run in {timeout:.0f}s")
        await asyncio.sleep(0.5)


async def test_claims_made_on_a_backlog_older_than_the_retention_margin_survive_retention_and_restore(
    pipeline_env: MakeEnv, make_topic: TopicFactory
) -> None:
    """A worker 2.5 days behind (TTL one day, changelog retention two) claims keys that are live in stream
    time; the broker's retention deletes none of their changelog records, and a worker that restores from
    the changelog alone still knows them: their copies are duplicates."""
    env: Env = await pipeline_env(ttl="1d")
    partitions = env.topo.topics.partitions
    # segments roll a day after their first record's time (as large segments roll by size): a segment
    # that starts with a claim stamped days ago rolls at the next append, its commit marker included
    roll = {"segment.ms": str(DAY_MS)}
    await ensure_topics(env.bootstrap, [TopicSpec(env.topo.topics.changelog, partitions, 1, roll)])
    behind = int(time.time() * 1000) - 5 * DAY_MS // 2
    ids = [f"evt_backlog_{i}" for i in range(EVENTS)]
    stamped = [
        (f"stripe:{e}".encode(), env.stripe_body(e), [("source", b"stripe")], None, behind + i)
        for i, e in enumerate(ids)
    ]
    env.start_worker("behind")
    await env.produce(stamped)
    assert len(await wait_for_audit(env, EVENTS)) == EVENTS
    env.stop_all()

    control = await make_topic(  # deleted by time as the changelog is: by the log cleaner's thread
        "retention-control", configs={"cleanup.policy": "compact,delete", "retention.ms": str(2 * DAY_MS)}
    )
    await _until_the_broker_deleted_by_time(env.bootstrap, control, timeout=120)
    assert await _log_starts(env.bootstrap, env.topo.topics.changelog, partitions) == dict.fromkeys(
        range(partitions), 0
    )

    env.start_worker("restored")  # an empty state dir: every store is rebuilt from the changelog
    await env.produce(stamped)  # the provider's copies, as old as the first ones
    audit = await wait_for_audit(env, 2 * EVENTS)
    env.stop_all()
    outcomes = Counter(a["outcome"] for a in audit)
    assert outcomes == Counter({"first": EVENTS, "duplicate": EVENTS}), env.log_tail("restored")
    commands = await read_committed(env.bootstrap, env.topo.topics.commands, idle=1.0)
    assert command_counts(commands) == Counter({f"stripe:{e}": 1 for e in ids})
