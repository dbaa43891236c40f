"""``pipeline worker --processes 2``: one command, two workers in one group, a child SIGKILLed and restarted."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import Env, command_counts, read_committed, wait_for_audit

pytestmark = [pytest.mark.broker, pytest.mark.slow]

MakeEnv = Callable[..., Any]


def _children(parent: int) -> dict[int, str]:
    """The live child processes of ``parent``: pid -> start time (from /proc, so a reused pid is told apart)."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if int(fields[1]) == parent and fields[0] != "Z":
            found[int(stat.parent.name)] = fields[19]
    return found


def _alive(pid: int, started: str) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return False
    return fields[19] == started and fields[0] != "Z"


async def _until(check: Callable[[], bool], what: str, env: Env, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout:g}s:\n{env.log_tail('sup')}")
        await asyncio.sleep(0.2)


async def test_two_processes_keep_exactly_once_through_a_sigkilled_child(pipeline_env: MakeEnv) -> None:
    """4 partitions, 2 children; one is SIGKILLed mid-stream and restarted: one command per key, clean exit 0 on SIGTERM."""
    env: Env = await pipeline_env(partitions=4)
    rng = random.Random(13)
    ids = [f"evt_sup_{i}" for i in range(2_000)]
    waves = [ids[i : i + 200] for i in range(0, len(ids), 200)]
    for index, wave in enumerate(waves):  # 30% duplicates, each after its first copy
        wave.extend(rng.choices(ids[: (index + 1) * 200], k=85))
        rng.shuffle(wave)
    total = sum(len(w) for w in waves)

    sup = env.start_worker(
        "sup",
        "--processes",
        "2",
        "--instance-id",
        "sup",
        "--session-timeout-ms",
        "6000",
        "--max-batch",
        "200",
    )
    log = env.state_root / "sup.log"
    await _until(lambda: len(_children(sup.pid)) == 2, "two children", env)
    await _until(lambda: log.read_text().count("partitions assigned") >= 2, "assignments", env)
    first = _children(sup.pid)

    for wave in waves[:4]:
        await env.produce_stripe(wave)
        await asyncio.sleep(0.2)
    victim = min(first)
    producing = asyncio.create_task(_produce_waves(env, waves[4:]))
    await asyncio.sleep(0.3)  # the next waves are arriving: the victim has a transaction open
    assert victim in _children(sup.pid), env.log_tail("sup")
    os.kill(victim, signal.SIGKILL)
    await producing
    await _until(lambda: len(_children(sup.pid)) == 2 and victim not in _children(sup.pid), "restart", env)
    assert f"(pid {victim}) exited with SIGKILL; restarting in 1 s" in log.read_text()

    audit = await wait_for_audit(env, total, timeout=120)
    commands = await read_committed(env.bootstrap, env.topo.topics.commands)
    positions = Counter((a["partition"], a["offset"]) for a in audit)
    assert not [p for p, n in positions.items() if n > 1], "input records audited more than once"
    assert len(audit) == total
    assert command_counts(commands) == Counter({f"stripe:{e}": 1 for e in ids})
    assert Counter(a["outcome"] for a in audit) == Counter({"first": len(ids), "duplicate": total - len(ids)})

    running = _children(sup.pid)
    sup.send_signal(signal.SIGTERM)
    assert sup.wait(timeout=45) == 0, env.log_tail("sup")
    assert not [pid for pid, started in {**first, **running}.items() if _alive(pid, started)]
    text = log.read_text()
    assert "supervisor stopped: every worker process exited cleanly" in text
    assert text.count("worker stopped") >= 2
    stores = {p.parent.parent.parent.name for p in (env.state_root / "sup").glob("proc-*/*/*/*")}
    assert stores == {"proc-0", "proc-1"}  # each child's stores under its own state dir


async def _produce_waves(env: Env, waves: list[list[str]]) -> None:
    for wave in waves:
        await env.produce_stripe(wave)
        await asyncio.sleep(0.3)


async def test_children_of_a_sigkilled_supervisor_stop_and_free_their_stores(pipeline_env: MakeEnv) -> None:
    """SIGKILL the supervisor: its children commit and exit by themselves, and a new supervisor on the same state dir takes over."""
    env: Env = await pipeline_env(partitions=4)
    first_ids = [f"evt_orphan_a_{i}" for i in range(300)]
    later_ids = [f"evt_orphan_b_{i}" for i in range(300)]
    flags = ("--processes", "2", "--instance-id", "orph", "--session-timeout-ms", "6000")
    sup = env.start_worker("orph", *flags)
    log = env.state_root / "orph.log"
    await _until(lambda: len(_children(sup.pid)) == 2, "two children", env)
    await _until(lambda: log.read_text().count("partitions assigned") >= 2, "assignments", env)
    children = _children(sup.pid)
    await env.produce_stripe(first_ids + first_ids[:50])
    await wait_for_audit(env, 350, timeout=60)

    sup.send_signal(signal.SIGKILL)
    assert sup.wait(timeout=10) == -signal.SIGKILL
    deadline = time.monotonic() + 30
    while [pid for pid, started in children.items() if _alive(pid, started)]:
        assert time.monotonic() < deadline, f"orphaned children still run:\n{env.log_tail('orph')}"
        await asyncio.sleep(0.2)
    text = log.read_text()
    assert text.count(f"supervisor (pid {sup.pid}) is gone; stopping this worker process") == 2
    assert text.count("worker stopped") >= 2  # a clean stop, as on SIGTERM

    again = env.start_worker("orph", *flags)  # the same state dir: the stores must be free
    await _until(lambda: len(_children(again.pid)) == 2, "two new children", env)
    await env.produce_stripe(later_ids + first_ids[:20])
    audit = await wait_for_audit(env, 350 + 320, timeout=90)
    commands = await read_committed(env.bootstrap, env.topo.topics.commands)
    assert command_counts(commands) == Counter({f"stripe:{e}": 1 for e in first_ids + later_ids})
    assert Counter(a["outcome"] for a in audit) == Counter({"first": 600, "duplicate": 70})
    again.send_signal(signal.SIGTERM)
    assert again.wait(timeout=45) == 0, env.log_tail("orph")
