"""Exactly-once through SIGKILLs and rebalances, checked by an independent read_committed consumer."""

from __future__ import annotations

import asyncio
import random
import signal
from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.harness import Env, check_exactly_once, produce_steadily, workload

pytestmark = [pytest.mark.broker, pytest.mark.slow]

MakeEnv = Callable[..., Any]


async def test_sigkill_mid_stream_loses_and_duplicates_nothing(pipeline_env: MakeEnv) -> None:
    """20,000 events (30% duplicates) streamed while the worker is SIGKILLed 4 times: one command per key."""
    env: Env = await pipeline_env()
    ids, waves = workload(14_000, 0.3, seed=7)
    total = sum(len(w) for w in waves)
    rng = random.Random(11)

    worker = env.start_worker("w1")
    producing = asyncio.create_task(produce_steadily(env, waves))
    kills = 0
    while kills < 4:
        await env.wait_assigned("w1", before=kills)
        await asyncio.sleep(rng.uniform(0.3, 1.5))  # into processing, mid-transaction
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        kills += 1
        worker = env.start_worker("w1")
    await producing
    await env.produce_stripe(rng.sample(ids, 500))  # duplicates produced only after the last restart
    total += 500

    await check_exactly_once(env, ids, total)
    log = (env.state_root / "w1.log").read_text()
    assert log.count("worker started") == kills + 1


async def test_rebalance_as_workers_join_and_leave_keeps_exactly_once(pipeline_env: MakeEnv) -> None:
    """Two workers share the input; a third joins and one leaves mid-stream: one command per key."""
    env: Env = await pipeline_env(partitions=6)
    ids, waves = workload(7_000, 0.3, seed=21)
    total = sum(len(w) for w in waves)

    await env.produce_stripe(waves[0])
    first = env.start_worker("a", "--max-batch", "300")
    env.start_worker("b", "--max-batch", "300")
    for index, wave in enumerate(waves[1:], start=1):
        await env.produce_stripe(wave)
        await asyncio.sleep(0.7)
        if index == 3:
            env.start_worker("c", "--max-batch", "300")
        if index == 6:
            first.send_signal(signal.SIGTERM)
    await check_exactly_once(env, ids, total)
    first.wait(timeout=30)
    assert first.returncode == 0, env.log_tail("a")
    assert "partitions revoked" in (env.state_root / "b.log").read_text()


async def test_a_static_member_killed_and_restarted_keeps_exactly_once(pipeline_env: MakeEnv) -> None:
    """With --instance-id, a SIGKILLed worker restarted under the same id takes its partitions back: one command per key."""
    env: Env = await pipeline_env()
    ids, waves = workload(3_000, 0.3, seed=33)
    total = sum(len(w) for w in waves)
    worker = env.start_worker("w1", "--instance-id", "worker-0")
    producing = asyncio.create_task(produce_steadily(env, waves))
    for kills in range(2):
        await env.wait_assigned("w1", before=kills)
        await asyncio.sleep(0.8)
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        worker = env.start_worker("w1", "--instance-id", "worker-0")
    await producing
    await check_exactly_once(env, ids, total)


async def test_a_second_worker_under_the_same_instance_id_stops_the_first_with_one_line(
    pipeline_env: MakeEnv,
) -> None:
    """Two live workers with one --instance-id: the group takes the second in the first's place, the first exits 1
    with one line that says so (not aiokafka's ``UnknownError()``), the second serves on: one command per key."""
    env: Env = await pipeline_env(partitions=4)
    ids, waves = workload(3_000, 0.3, seed=5)
    total = sum(len(w) for w in waves)
    first = env.start_worker("a", "--instance-id", "twin")
    await env.wait_assigned("a", before=0)
    producing = asyncio.create_task(produce_steadily(env, waves))
    await asyncio.sleep(0.5)
    second = env.start_worker("b", "--instance-id", "twin")
    assert await asyncio.to_thread(first.wait, 60) == 1, env.log_tail("a")
    last = env.log_tail("a", 1)
    assert last.startswith("pipeline: error: another worker joined group "), env.log_tail("a")
    assert last.endswith(
        " with --instance-id twin and took this one's place; two live workers must not share an instance id"
    )
    await producing
    await check_exactly_once(env, ids, total)
    assert second.poll() is None, env.log_tail("b")
