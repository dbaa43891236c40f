"""A changelog kept shorter than its claims live, on a real broker: the worker refuses to start, naming it.

The operator's mistake it stands for: a source's TTL raised in the topology and the workers restarted
without ``pipeline topics create``, so the changelog still deletes claims after the old TTL plus a day;
a store rebuilt from it after that (a failover, a new standby) would take the next copy of a key still
live for first. ``pipeline/kafka/topic_checks.py`` has the rules; this shows them on Kafka's answers."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from pipeline.kafka.admin import admin_client
from pipeline.kafka.alter_configs import set_topic_configs
from tests.integration.faults import Workers, free_port, keys, produce, stripe_record, wait_until
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


async def test_a_retention_lowered_under_a_running_worker_is_reported_until_fixed(
    pipeline_env: MakeEnv, workers: Workers
) -> None:
    """The changelog's retention.ms set to an hour under a running worker (TTL 1 day): within its check interval
    the worker logs the refusal once as an error, warns on /healthz while it stays ready, and sets
    pipeline_topic_config_refused to 1; after `pipeline topics create` the warning and the gauge are gone, and
    the worker served a record all along."""
    env: Env = await pipeline_env(partitions=1, ttl="1d")
    topics = env.topo.topics
    port = free_port()
    worker = workers.start(
        "w1",
        topology=env.topology_path,
        group=env.group,
        state_dir=env.state_root / "w1",
        extra=["--metrics-port", str(port), "--topic-check-interval", "1"],
    )
    base = f"http://127.0.0.1:{port}"
    await produce(env.bootstrap, topics.input, [stripe_record("evt_watch_1")])

    async def served() -> bool:
        return "stripe:evt_watch_1" in await keys(env.bootstrap, topics.commands)

    await wait_until(served, "the first command", timeout=60, alive=worker, log=lambda: workers.tail("w1"))
    async with admin_client(env.bootstrap) as admin:
        await set_topic_configs(admin, {topics.changelog: {"retention.ms": "3600000"}})

    async def warned() -> bool:
        return bool((await _health(base)).get("warnings"))

    await wait_until(
        warned, "the warning on /healthz", timeout=30, alive=worker, log=lambda: workers.tail("w1")
    )
    health = await _health(base)
    assert health["status"] == "ok"
    [warning] = health["warnings"]
    assert f"changelog {topics.changelog} has retention.ms=3600000 (1 h), shorter than" in warning, warning
    assert await _gauge(base) == 1.0
    errors = [line for line in workers.log("w1").splitlines() if "has retention.ms=3600000" in line]
    assert len(errors) == 1, errors
    assert "ERROR" in errors[0]

    topics_create(env)

    async def cleared() -> bool:
        return "warnings" not in await _health(base) and await _gauge(base) == 0.0

    await wait_until(cleared, "the warning gone", timeout=30, alive=worker, log=lambda: workers.tail("w1"))
    await produce(env.bootstrap, topics.input, [stripe_record("evt_watch_2")])

    async def second() -> bool:
        return "stripe:evt_watch_2" in await keys(env.bootstrap, topics.commands)

    await wait_until(second, "the second command", timeout=60, alive=worker, log=lambda: workers.tail("w1"))
    assert "the topics' configs are fixed" in workers.log("w1")


async def _health(base: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(f"{base}/healthz") as response:
        return json.loads(await response.text())  # type: ignore[no-any-return]


async def _gauge(base: str) -> float | None:
    async with aiohttp.ClientSession() as session, session.get(f"{base}/metrics") as response:
        text = await response.text()
    for line in text.splitlines():
        if line.startswith("pipeline_topic_config_refused "):
            return float(line.split()[1])
    return None


async def _exited(worker: Any) -> bool:
    return worker.poll() is not None
