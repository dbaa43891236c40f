"""Failover to standby replicas on the real broker: SIGKILLed owners, stale and foreign standbys, a rolling restart.

Every test checks exactly once with an independent read_committed reader: one command per key, one
audit record per input record, and the first copy of each key audited ``first``.
"""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka import TopicPartition

from pipeline.kafka.topic_layout import topic_layout
from pipeline.state import directory
from pipeline.state.decision import Entry
from pipeline.state.store import Change, PartitionStore
from pipeline.state.store_meta import StoreIdentity
from tests.integration.harness import Env, check_exactly_once, produce_steadily, workload

pytestmark = [pytest.mark.broker, pytest.mark.slow]

MakeEnv = Callable[..., Any]
SESSION_MS = "3000"


def _start(env: Env, name: str) -> subprocess.Popen[bytes]:
    return env.start_worker(
        name, "--standby-replicas", "1", "--session-timeout-ms", SESSION_MS, "--max-batch", "300"
    )


def _log(env: Env, name: str) -> str:
    path = env.state_root / f"{name}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def _assigned(env: Env, name: str) -> list[str]:
    """The partitions of the worker's last assignment (its log's last ``partitions assigned`` line)."""
    found = re.findall(r"partitions assigned: \[(.*?)\]", _log(env, name))
    return re.findall(r"'([^']+)'", found[-1]) if found else []


async def _until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.1)


async def _standbys_following(env: Env, names: list[str]) -> None:
    """Wait until each worker follows at least one standby."""
    for name in names:

        def following(n: str = name) -> bool:
            return "standby " in _log(env, n) and "following" in _log(env, n)

        await _until(following, f"{name} has no standby")


async def _settled(env: Env, names: list[str]) -> None:
    """Wait until the workers' last assignments split every input partition between them, each worker
    holding one (its last ``partitions assigned`` after its last ``partitions revoked``): a generation
    that every worker has applied, so that ``_assigned`` reads what a worker serves now."""
    every = {f"{env.topo.topics.input}-{p}" for p in range(env.topo.topics.partitions)}

    def split() -> bool:
        held = []
        for name in names:
            log = _log(env, name)
            if log.rfind("partitions assigned: ") < log.rfind("partitions revoked: "):
                return False
            held.append(set(_assigned(env, name)))
        return sum(len(h) for h in held) == len(every) and set().union(*held) == every

    await _until(split, f"an assignment that {names} all applied")


def _promoted(env: Env, name: str, since: int = 0) -> list[str]:
    """The partitions worker ``name`` promoted from standby, in its log from character ``since`` on."""
    return re.findall(r"(\S+): promoted from standby", _log(env, name)[since:])


async def test_two_workers_a_sigkilled_owner_fails_over_to_its_standby(pipeline_env: MakeEnv) -> None:
    """Two workers with one standby each: the owner is SIGKILLed mid-stream, the survivor promotes its standbys; one command per key."""
    env: Env = await pipeline_env(partitions=4)
    ids, waves = workload(6_000, 0.3, seed=261)
    total = sum(len(w) for w in waves)
    a = _start(env, "a")
    _start(env, "b")
    await _standbys_following(env, ["a", "b"])
    producing = asyncio.create_task(produce_steadily(env, waves))
    await asyncio.sleep(4.0)
    await _settled(env, ["a", "b"])
    lost = _assigned(env, "a")
    seen = len(_log(env, "b"))
    a.send_signal(signal.SIGKILL)
    a.wait()
    await producing
    await check_exactly_once(env, ids, total)
    assert lost
    assert set(lost) <= set(_promoted(env, "b", seen)), _log(env, "b")[-3000:]


async def test_three_workers_a_sigkilled_owner_spreads_over_the_standbys(pipeline_env: MakeEnv) -> None:
    """Three workers, six partitions: the killed worker's partitions go to the workers holding their standbys; one command per key."""
    env: Env = await pipeline_env(partitions=6)
    ids, waves = workload(6_000, 0.3, seed=262)
    total = sum(len(w) for w in waves)
    workers = {name: _start(env, name) for name in ("a", "b", "c")}
    await _standbys_following(env, ["a", "b", "c"])
    producing = asyncio.create_task(produce_steadily(env, waves))
    await asyncio.sleep(4.0)
    await _settled(env, ["a", "b", "c"])
    lost = _assigned(env, "b")
    seen = {name: len(_log(env, name)) for name in ("a", "c")}
    workers["b"].send_signal(signal.SIGKILL)
    workers["b"].wait()
    await producing
    await check_exactly_once(env, ids, total)
    promoted = set(_promoted(env, "a", seen["a"])) | set(_promoted(env, "c", seen["c"]))
    assert lost
    assert set(lost) <= promoted, (_log(env, "a")[-2000:], _log(env, "c")[-2000:])


async def test_a_standby_that_was_down_and_is_stale_still_gives_exactly_once(pipeline_env: MakeEnv) -> None:
    """The standby's worker is down while the owner takes on thousands of records; the owner dies right after it is back, so the stale copy is promoted and replays the rest."""
    env: Env = await pipeline_env(partitions=2)
    ids, waves = workload(5_000, 0.3, seed=263)
    total = sum(len(w) for w in waves)
    a = _start(env, "a")
    b = _start(env, "b")
    await _standbys_following(env, ["a", "b"])
    await env.produce_stripe(waves[0])
    await asyncio.sleep(1.0)
    b.send_signal(signal.SIGKILL)
    b.wait()
    for wave in waves[1:6]:  # while b is down: its copies fall behind
        await env.produce_stripe(wave)
    await env.wait_assigned("a", before=env.assignments("a"))  # a took b's partitions
    before = env.assignments("b")
    _start(env, "b")
    await env.wait_assigned("b", before=before)
    producing = asyncio.create_task(produce_steadily(env, waves[6:]))
    await asyncio.sleep(0.5)
    await _settled(env, ["a", "b"])
    lost = _assigned(env, "a")
    seen = len(_log(env, "b"))
    a.send_signal(signal.SIGKILL)
    a.wait()
    await producing
    await check_exactly_once(env, ids, total)
    assert lost
    assert set(lost) <= set(_promoted(env, "b", seen)), _log(env, "b")[seen:][
        -3000:
    ]  # the stale copy, promoted


async def test_a_standby_on_a_disk_from_another_changelog_rebuilds_it(pipeline_env: MakeEnv) -> None:
    """b's disk holds stores under the right names but of another cluster, claiming keys the workload sends: they are
    rebuilt, never trusted, so after the owner's death every key still has its one command."""
    env: Env = await pipeline_env(partitions=2)
    ids, waves = workload(3_000, 0.3, seed=264)
    total = sum(len(w) for w in waves)
    topo = env.topo
    topics = topo.topics
    layout = await topic_layout(env.bootstrap, topo)
    now = int(time.time() * 1000)
    for partition in range(2):
        tp_path = directory.store_path(
            env.state_root / "b", topo, env.group, TopicPartition(topics.input, partition)
        )
        foreign = StoreIdentity(
            topo.app, env.group, topics.input, partition, topics.changelog, "other-cluster", str(uuid.uuid4())
        )
        assert layout.cluster != foreign.cluster
        store = PartitionStore.open(tp_path, bucket_ms=directory.topology_bucket_ms(topo), identity=foreign)
        entry = Entry(now, now + 86_400_000, partition, 0, 0, now, "handle", topics.commands, None, 0)
        store.write(
            {f"stripe:{e}".encode(): Change.of(entry) for e in ids[:1000]},
            changelog_offset=5,
            stream_time=now,
        )
        store.close()
    a = _start(env, "a")
    _start(env, "b")
    await _standbys_following(env, ["a", "b"])
    producing = asyncio.create_task(produce_steadily(env, waves))
    await asyncio.sleep(3.0)
    a.send_signal(signal.SIGKILL)
    a.wait()
    await producing
    await check_exactly_once(env, ids, total)
    assert "caches changelog" in _log(env, "b")  # the foreign stores were seen for what they are


async def test_a_rolling_restart_of_every_worker_under_load_keeps_exactly_once(pipeline_env: MakeEnv) -> None:
    """Three workers with standbys, each stopped (SIGTERM) and started again in turn while events stream in;
    the survivors take each stopped worker's partitions (promoting their standbys) before it is back."""
    env: Env = await pipeline_env(partitions=6)
    ids, waves = workload(9_000, 0.3, seed=265)
    total = sum(len(w) for w in waves)
    workers = {name: _start(env, name) for name in ("a", "b", "c")}
    await _standbys_following(env, ["a", "b", "c"])
    producing = asyncio.create_task(produce_steadily(env, waves, pause=0.15))
    for name in ("a", "b", "c"):
        await asyncio.sleep(2.0)
        survivors = {other: env.assignments(other) for other in workers if other != name}
        workers[name].send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(workers[name].wait, 30) == 0, _log(env, name)[-2000:]
        for other, seen in survivors.items():  # a generation without it, not only its quick return
            await env.wait_assigned(other, before=seen)
        before = env.assignments(name)
        workers[name] = _start(env, name)
        await env.wait_assigned(name, before=before)
    await producing
    await check_exactly_once(env, ids, total)
    assert any(_promoted(env, name) for name in ("a", "b", "c"))
