"""Exactly-once through SIGKILLs and rebalances, checked by an independent read_committed consumer."""

from __future__ import annotations

import asyncio
import random
import signal
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.harness import Env, command_counts, read_committed, wait_for_audit

pytestmark = [pytest.mark.broker, pytest.mark.slow]

MakeEnv = Callable[..., Any]


def _workload(unique_count: int, duplicate_ratio: float, seed: int) -> tuple[list[str], list[list[str]]]:
    """Unique event ids and the stream cut into 10 waves; duplicates trail their originals by up to 3 waves."""
    rng = random.Random(seed)
    ids = [f"evt_{seed}_{i}" for i in range(unique_count)]
    total = int(unique_count / (1 - duplicate_ratio))
    waves: list[list[str]] = [[] for _ in range(10)]
    per_wave = unique_count // 10
    for index, event_id in enumerate(ids):
        waves[min(index // per_wave, 9)].append(event_id)
    for _ in range(total - unique_count):
        index = rng.randrange(unique_count)
        later = min(min(index // per_wave, 9) + rng.randint(0, 3), 9)
        waves[later].append(ids[index])
    for wave in waves:
        rng.shuffle(wave)
    return ids, waves


async def _check_exactly_once(env: Env, ids: list[str], total: int) -> None:
    audit = await wait_for_audit(env, total, timeout=180)
    commands = await read_committed(env.bootstrap, env.topo.topics.commands)
    counts = command_counts(commands)
    positions = Counter((a["partition"], a["offset"]) for a in audit)
    twice = sorted(p for p, n in positions.items() if n > 1)
    assert not twice, f"input records audited more than once: {twice[:20]}"
    assert len(audit) == total, f"audit has {len(audit)} records for {total} inputs"
    assert counts == Counter({f"stripe:{e}": 1 for e in ids}), (
        f"{sum(1 for c in counts.values() if c > 1)} keys duplicated, "
        f"{len({f'stripe:{e}' for e in ids} - set(counts))} keys missing"
    )
    outcomes = Counter(a["outcome"] for a in audit)
    assert outcomes == Counter({"first": len(ids), "duplicate": total - len(ids)})


async def _produce_steadily(env: Env, waves: list[list[str]], chunk: int = 200, pause: float = 0.1) -> None:
    """Produce the waves in small chunks so the worker always has a transaction open."""
    for wave in waves:
        for start in range(0, len(wave), chunk):
            await env.produce_stripe(wave[start : start + chunk])
            await asyncio.sleep(pause)


async def test_sigkill_mid_stream_loses_and_duplicates_nothing(pipeline_env: MakeEnv) -> None:
    """20,000 events (30% duplicates) streamed while the worker is SIGKILLed 4 times: one command per key."""
    env: Env = await pipeline_env()
    ids, waves = _workload(14_000, 0.3, seed=7)
    total = sum(len(w) for w in waves)
    rng = random.Random(11)

    worker = env.start_worker("w1")
    producing = asyncio.create_task(_produce_steadily(env, waves))
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

    await _check_exactly_once(env, ids, total)
    log = (env.state_root / "w1.log").read_text()
    assert log.count("worker started") == kills + 1


async def test_rebalance_as_workers_join_and_leave_keeps_exactly_once(pipeline_env: MakeEnv) -> None:
    """Two workers share the input; a third joins and one leaves mid-stream: one command per key."""
    env: Env = await pipeline_env(partitions=6)
    ids, waves = _workload(7_000, 0.3, seed=21)
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
    await _check_exactly_once(env, ids, total)
    first.wait(timeout=30)
    assert first.returncode == 0, env.log_tail("a")
    assert "partitions revoked" in (env.state_root / "b.log").read_text()


async def test_a_static_member_killed_and_restarted_keeps_exactly_once(pipeline_env: MakeEnv) -> None:
    """With --instance-id, a SIGKILLed worker restarted under the same id takes its partitions back: one command per key."""
    env: Env = await pipeline_env()
    ids, waves = _workload(3_000, 0.3, seed=33)
    total = sum(len(w) for w in waves)
    worker = env.start_worker("w1", "--instance-id", "worker-0")
    producing = asyncio.create_task(_produce_steadily(env, waves))
    for kills in range(2):
        await env.wait_assigned("w1", before=kills)
        await asyncio.sleep(0.8)
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        worker = env.start_worker("w1", "--instance-id", "worker-0")
    await producing
    await _check_exactly_once(env, ids, total)
