"""``pipeline rescale`` raises 4 -> 8 partitions mid-stream and no duplicate straddling the change slips through."""

from __future__ import annotations

import random
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipeline.kafka.admin import partition_count
from pipeline.kafka.partitioner import owner_partition
from pipeline.state.decision import Entry
from tests.integration.harness import (
    ROOT,
    Env,
    command_counts,
    read_committed,
    set_max_message_bytes,
    wait_for_audit,
)

pytestmark = [pytest.mark.broker, pytest.mark.slow]

MakeEnv = Callable[..., Any]


def _rescale(env: Env, partitions: int, state_file: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "rescale",
            "--partitions",
            str(partitions),
            "--bootstrap",
            env.bootstrap,
            "--topology",
            str(env.topology_path),
            "--group",
            env.group,
            "--state-file",
            str(state_file),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )


async def test_rescale_keeps_exactly_once_for_duplicates_straddling_the_change(
    pipeline_env: MakeEnv, tmp_path: Path
) -> None:
    """Duplicates produced after 4 -> 8 (to new owners and to stale old owners) produce no second command."""
    env: Env = await pipeline_env(partitions=4)
    rng = random.Random(3)
    ids = [f"evt_{i}" for i in range(3000)]
    before = ids[:2000] + rng.sample(ids[:2000], 600)
    await env.produce_stripe(before)
    worker = env.start_worker("w1")
    await wait_for_audit(env, len(before))

    refused = _rescale(env, 8, tmp_path / "rescale.json")
    assert refused.returncode == 1
    assert "still has 1 live worker" in refused.stderr

    env.stop_all()
    assert worker.returncode == 0
    done = _rescale(env, 8, tmp_path / "rescale.json")
    assert done.returncode == 0, done.stderr
    assert "moved" in done.stdout
    for topic in (env.topo.topics.input, env.topo.topics.changelog, env.topo.topics.audit):
        assert await partition_count(env.bootstrap, topic) == 8

    env.start_worker("w1")
    after = rng.sample(ids[:2000], 800) + ids[2000:]  # duplicates of old keys, and new keys
    await env.produce_stripe(after)  # the producer's partitioner sees 8 partitions: new owners
    stale = rng.sample(ids[:2000], 200)  # an ingress that still thinks there are 4 partitions
    await env.produce(
        (
            f"stripe:{e}".encode(),
            env.stripe_body(e),
            [("source", b"stripe")],
            owner_partition(f"stripe:{e}".encode(), 4),
            None,
        )
        for e in stale
    )
    rerouted = sum(
        1
        for e in stale
        if owner_partition(f"stripe:{e}".encode(), 4) != owner_partition(f"stripe:{e}".encode(), 8)
    )
    audit = await wait_for_audit(env, len(before) + len(after) + len(stale) + rerouted, timeout=120)
    commands = await read_committed(env.bootstrap, env.topo.topics.commands)

    assert command_counts(commands) == Counter({f"stripe:{e}": 1 for e in ids})
    outcomes = Counter(a["outcome"] for a in audit)
    assert outcomes["first"] == len(ids)
    assert outcomes["rerouted"] == rerouted


async def test_rescale_moves_a_small_changelogs_entries_without_their_time_and_raises_the_input_last(
    pipeline_env: MakeEnv, tmp_path: Path
) -> None:
    """A changelog taking 4 KiB: 2 -> 3 moves every entry (its last_seen cleared), the input last, one command a key."""
    env: Env = await pipeline_env(partitions=2)
    ids = [f"evt_{i}" for i in range(400)]
    await env.produce_stripe(ids)
    env.start_worker("w1")
    await wait_for_audit(env, len(ids))
    env.stop_all()
    await set_max_message_bytes(env, env.topo.topics.changelog, 4096)

    done = _rescale(env, 3, tmp_path / "rescale.json")
    assert done.returncode == 0, done.stderr
    lines = [line.strip() for line in done.stdout.splitlines()]
    last_raise = max(i for i, line in enumerate(lines) if line.endswith("-> 3 partitions"))
    assert lines[last_raise] == f"{env.topo.topics.input}: 2 -> 3 partitions", done.stdout
    keys = {f"stripe:{e}".encode() for e in ids}
    changed = {key for key in keys if owner_partition(key, 3) != owner_partition(key, 2)}
    changelog = await read_committed(env.bootstrap, env.topo.topics.changelog)
    moved = [r for r in changelog if r.key in changed and r.partition == owner_partition(r.key, 3)]
    assert {r.key for r in moved} == changed
    assert all(Entry.decode(r.value).last_seen == 0 for r in moved)

    env.start_worker("w1")
    await env.produce_stripe(ids)  # every key again, to its new owner
    await wait_for_audit(env, 2 * len(ids))
    commands = await read_committed(env.bootstrap, env.topo.topics.commands)
    assert command_counts(commands) == Counter({f"stripe:{e}": 1 for e in ids})
