"""A changelog kept shorter than its claims live, on a real broker: the worker refuses to start, naming it.

The operator's mistake it stands for: a source's TTL raised in the topology and the workers restarted
without ``pipeline topics create``, so the changelog still deletes claims after the old TTL plus a day;
a store rebuilt from it after that (a failover, a new standby) would take the next copy of a key still
live for first. ``pipeline/kafka/topic_checks.py`` has the rules; this shows them on Kafka's answers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.faults import Workers, keys, produce, stripe_record, wait_until
from tests.integration.harness import Env, write_topology
from tests.integration.test_failure_paths import topics_create

pytestmark = [pytest.mark.broker, pytest.mark.slow]

MakeEnv = Callable[..., Any]


async def test_a_ttl_raised_without_topics_create_stops_the_worker_at_start_with_one_line(
    pipeline_env: MakeEnv, workers: Workers
) -> None:
    """TTL 1 day raised to 3: the changelog keeps 2 days where 4 are needed; the worker exits non-zero before
    it handles a record, its last line naming the changelog, both durations and the fix; once
    `pipeline topics create` has set the retention, the next worker serves the record."""
    env: Env = await pipeline_env(partitions=1, ttl="1d")
    write_topology(env.topology_path, env.topo.app, partitions=1, ttl="3d")  # the operator's edit
    topics = env.topo.topics
    await produce(env.bootstrap, topics.input, [stripe_record("evt_ttl_1")])
    worker = workers.start("w1", topology=env.topology_path, group=env.group, state_dir=env.state_root / "w1")
    await wait_until(lambda: _exited(worker), "the worker's exit", timeout=60, log=lambda: workers.tail("w1"))
    assert worker.returncode != 0
    line = [line for line in workers.log("w1").splitlines() if line.strip()][-1]
    assert (
        f"changelog {topics.changelog} has retention.ms=172800000 (2 days), shorter than the largest TTL plus a"
        " day (4 days)" in line
    ), line
    assert "Traceback" not in workers.log("w1")
    assert await keys(env.bootstrap, topics.commands) == []

    topics_create(env)
    worker = workers.start("w2", topology=env.topology_path, group=env.group, state_dir=env.state_root / "w2")

    async def served() -> bool:
        return "stripe:evt_ttl_1" in await keys(env.bootstrap, topics.commands)

    await wait_until(served, "the command", timeout=60, alive=worker, log=lambda: workers.tail("w2"))


async def _exited(worker: Any) -> bool:
    return worker.poll() is not None
