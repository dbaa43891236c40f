"""Against the real broker: records dated far ahead, and a state dir that outlived its topics."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from pipeline.kafka.admin import NO_LIMIT_MS, admin_client, partition_count, topic_specs
from pipeline.kafka.alter_configs import set_topic_configs
from tests.integration.harness import Env, read_committed, wait_for_audit

pytestmark = [pytest.mark.broker, pytest.mark.slow]

MakeEnv = Callable[..., Any]
DAY_MS = 86_400_000


async def _set_after_max(env: Env, topics: list[str], value: int) -> None:
    await _set_config(env, topics, "message.timestamp.after.max.ms", value)


async def _set_config(env: Env, topics: list[str], name: str, value: int) -> None:
    """Set one config of ``topics``, the others left as they are (IncrementalAlterConfigs, as kafka-configs.sh
    does: the legacy AlterConfigs would drop the changelog's retention, which the worker refuses to start on)."""
    async with admin_client(env.bootstrap) as admin:
        await set_topic_configs(admin, {topic: {name: str(value)} for topic in topics})
    await asyncio.sleep(1.0)  # let every reader of the configs see them


def _outputs(env: Env) -> list[str]:
    topics = env.topo.topics
    return [topics.commands, topics.audit, topics.dlq, topics.changelog]


async def _future_dated_run(env: Env) -> tuple[Counter[str], list[Any]]:
    """Keys a, b; then c dated 60 days ahead; then copies of a, b and c: each key must make one command."""
    env.start_worker("w1")
    ahead = int(time.time() * 1000) + 60 * DAY_MS
    await env.produce_stripe(["evt_a", "evt_b"])
    await asyncio.sleep(2.0)
    await env.produce_stripe(["evt_c"], timestamp_ms=ahead)
    await asyncio.sleep(2.0)
    await env.produce_stripe(["evt_a", "evt_b", "evt_c"])
    audit = await wait_for_audit(env, 6, timeout=90)
    assert len(audit) == 6, audit
    commands = await read_committed(env.bootstrap, env.topo.topics.commands)
    assert env.processes[0].poll() is None, env.log_tail("w1")
    return Counter(r.key.decode() for r in commands), commands


async def test_a_record_dated_60_days_ahead_neither_expires_other_keys_nor_stops_its_partition(
    pipeline_env: MakeEnv,
) -> None:
    """On topics that take any timestamp (as Kafka 3 does): the future-dated record is handled at the clock-skew
    bound, the other keys stay live, and every copy of every key is a duplicate: one command each."""
    env: Env = await pipeline_env(partitions=1)
    await _set_after_max(env, _outputs(env), NO_LIMIT_MS)
    counts, _ = await _future_dated_run(env)
    assert counts == Counter({"stripe:evt_a": 1, "stripe:evt_b": 1, "stripe:evt_c": 1})


async def test_on_kafka_4_defaults_the_outputs_of_a_future_dated_record_are_stamped_now_and_written(
    pipeline_env: MakeEnv,
) -> None:
    """Outputs taking at most an hour ahead (Kafka 4's default): the record's outputs are stamped with the current
    time, the original kept in a header; nothing loops, nothing goes to the DLQ, one command per key."""
    env: Env = await pipeline_env(partitions=1)
    await _set_after_max(env, _outputs(env), 3_600_000)
    counts, commands = await _future_dated_run(env)
    assert counts == Counter({"stripe:evt_a": 1, "stripe:evt_b": 1, "stripe:evt_c": 1})
    [c] = [r for r in commands if r.key == b"stripe:evt_c"]
    assert c.timestamp <= int(time.time() * 1000) + 60_000
    assert dict(c.headers).get("original-timestamp") is not None
    assert await read_committed(env.bootstrap, env.topo.topics.dlq) == []


async def test_a_state_dir_that_outlived_its_topics_is_rebuilt_not_trusted(pipeline_env: MakeEnv) -> None:
    """Topics deleted and created again under the same names, the worker restarted on its old disk: the old
    store (which claims every key) is wiped with a warning, and each key sent again makes its one command."""
    env: Env = await pipeline_env(partitions=2)
    ids = [f"evt_{i}" for i in range(20)]
    worker = env.start_worker("w1")
    await env.produce_stripe(ids)
    assert len(await wait_for_audit(env, 20, timeout=90)) == 20
    env.stop_all()
    assert worker.returncode == 0
    names = [s.name for s in topic_specs(env.topo)]
    async with admin_client(env.bootstrap) as admin:
        await admin.delete_topics(names)
    for _ in range(100):  # deletion is asynchronous on the broker
        if [n for n in names if await partition_count(env.bootstrap, n) is not None] == []:
            break
        await asyncio.sleep(0.2)
    await env.create_topics()
    env.start_worker("w1")
    await env.produce_stripe(ids)
    audit = await wait_for_audit(env, 20, timeout=120)
    assert Counter(a["outcome"] for a in audit) == Counter({"first": 20}), env.log_tail("w1")
    commands = await read_committed(env.bootstrap, env.topo.topics.commands)
    assert Counter(r.key.decode() for r in commands) == Counter({f"stripe:{e}": 1 for e in ids})
    assert "wiping it and restoring from the changelog" in env.log_tail("w1", 400)


async def test_a_command_refused_for_its_size_whose_dlq_record_is_refused_for_its_timestamp_is_dead_lettered_now(
    pipeline_env: MakeEnv,
) -> None:
    """Seed 2489 on the real broker: both limits lowered while the worker runs (it read neither), a record dated 60
    days ahead whose command is too large goes to the DLQ, whose record is refused for its timestamp and then
    written once stamped now; its key stays unclaimed, the worker goes on. The first refusal, for the size, makes
    the worker read the limits again (seed 3276), so the record is dead-lettered as too-large before it is sent."""
    env: Env = await pipeline_env(partitions=1)
    await _set_after_max(env, _outputs(env), NO_LIMIT_MS)
    env.start_worker("w1")
    await env.produce_stripe(["evt_a"])
    assert len(await wait_for_audit(env, 1, timeout=90)) == 1
    await _set_config(env, [env.topo.topics.commands], "max.message.bytes", 2048)
    await _set_after_max(env, [env.topo.topics.dlq], 3_600_000)
    ahead = int(time.time() * 1000) + 60 * DAY_MS
    big = env.stripe_body("evt_big", size=4096)
    await env.produce([(b"stripe:evt_big", big, [("source", b"stripe")], None, ahead)])
    await env.produce_stripe(["evt_b"])
    audit = await wait_for_audit(env, 3, timeout=90)
    assert env.processes[0].poll() is None, env.log_tail("w1")
    commands = await read_committed(env.bootstrap, env.topo.topics.commands)
    assert sorted(r.key for r in commands) == [b"stripe:evt_a", b"stripe:evt_b"], env.log_tail("w1")
    [dead] = await read_committed(env.bootstrap, env.topo.topics.dlq)
    assert dead.key == b"stripe:evt_big"
    assert dead.timestamp <= int(time.time() * 1000) + 60_000
    assert dict(dead.headers).get("original-timestamp") == str(ahead).encode()
    assert orjson.loads(dead.value)["reason"] == "too-large"
    log_tail = env.log_tail("w1", 400)
    assert "topic limits changed under the worker" in log_tail, log_tail
    assert "offset 1 alone is refused for its timestamp" in log_tail, log_tail
    assert len(audit) == 3
