"""An audit or DLQ topic made compacted: a keyless input record's audit and DLQ records have no key, which a
compacted topic refuses (INVALID_RECORD). Tried on a real broker first: the worker redid the whole transaction
twice a second for ever, naming only ``UnknownError()``, and no partition in it moved."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from pipeline.kafka.admin import admin_client
from pipeline.kafka.alter_configs import set_topic_configs
from tests.integration.faults import Workers, keys, produce, stripe_record, values, wait_until
from tests.integration.harness import Env
from tests.integration.test_failure_paths import topics_create

pytestmark = [pytest.mark.broker, pytest.mark.slow]

MakeEnv = Callable[..., Any]
KEYLESS = (None, b'{"no": "id"}', [("source", b"stripe")])  # no key, and none in the body: missing-key


async def compact(env: Env, topic: str) -> None:
    """Set ``topic``'s cleanup.policy to compact, as an operator might, and wait until the broker applies it."""
    async with admin_client(env.bootstrap) as admin:
        await set_topic_configs(admin, {topic: {"cleanup.policy": "compact"}})
    await asyncio.sleep(1.0)  # the broker's config change reaches the log a moment after the answer


def last_line(workers: Workers, name: str) -> str:
    return [line for line in workers.log(name).splitlines() if line.strip()][-1]


async def test_a_compacted_audit_topic_stops_the_worker_at_start_with_one_line(
    pipeline_env: MakeEnv, workers: Workers
) -> None:
    """A worker started on a compacted audit topic exits non-zero before it handles a record, its last line
    naming the topic and the fix; `pipeline topics create` sets the policy back and the next worker serves."""
    env: Env = await pipeline_env(partitions=1)
    topics = env.topo.topics
    await compact(env, topics.audit)
    await produce(env.bootstrap, topics.input, [stripe_record("evt_1")])
    worker = workers.start("w1", topology=env.topology_path, group=env.group, state_dir=env.state_root / "w1")
    await wait_until(lambda: _exited(worker), "the worker's exit", timeout=60, log=lambda: workers.tail("w1"))
    assert worker.returncode != 0
    line = last_line(workers, "w1")
    assert f"topic {topics.audit} has cleanup.policy=compact" in line, line
    assert "Traceback" not in workers.log("w1")

    topics_create(env)
    worker = workers.start("w2", topology=env.topology_path, group=env.group, state_dir=env.state_root / "w2")

    async def served() -> bool:
        return "stripe:evt_1" in await keys(env.bootstrap, topics.commands)

    await wait_until(served, "the command", timeout=60, alive=worker, log=lambda: workers.tail("w2"))


async def test_a_keyless_record_refused_by_an_audit_topic_compacted_mid_run_stops_the_worker_naming_it(
    pipeline_env: MakeEnv, workers: Workers
) -> None:
    """The audit topic made compacted under a running worker: the keyless record's transaction is refused
    (INVALID_RECORD), bisected to that record alone, and since even its DLQ record's audit record is refused
    the worker stops with one line naming the offset and the cause. After `pipeline topics create` a restarted
    worker dead-letters it, and each valid key, before and after it, has one command."""
    env: Env = await pipeline_env(partitions=1)
    topics = env.topo.topics
    await produce(env.bootstrap, topics.input, [stripe_record("evt_before")])
    worker = workers.start("w1", topology=env.topology_path, group=env.group, state_dir=env.state_root / "w1")

    async def commands() -> Counter[str]:
        return Counter(await keys(env.bootstrap, topics.commands))

    async def has(key: str) -> bool:
        return key in await commands()

    await wait_until(lambda: has("stripe:evt_before"), "the first command", timeout=60, alive=worker)
    await compact(env, topics.audit)
    await produce(env.bootstrap, topics.input, [KEYLESS, stripe_record("evt_after")])
    await wait_until(lambda: _exited(worker), "the worker's stop", timeout=60, log=lambda: workers.tail("w1"))
    assert worker.returncode != 0
    line = last_line(workers, "w1")
    assert "offset 1 cannot be written even to the DLQ" in line, line
    assert "compacted topic" in line, line
    assert "Traceback" not in workers.log("w1")
    assert "UnknownError" not in workers.log("w1")

    topics_create(env)
    worker = workers.start("w2", topology=env.topology_path, group=env.group, state_dir=env.state_root / "w2")
    await wait_until(lambda: has("stripe:evt_after"), "the last command", timeout=60, alive=worker)
    assert await commands() == Counter({"stripe:evt_before": 1, "stripe:evt_after": 1})
    dlq = await values(env.bootstrap, topics.dlq)
    assert [d["offset"] for d in dlq] == [1]
    assert dlq[0]["reason"] in ("missing-key", "unproducible")


async def _exited(worker: Any) -> bool:
    return worker.poll() is not None
