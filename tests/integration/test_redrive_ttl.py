"""Redriving records older than their key's TTL, against the real broker: still one command per key."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from pipeline.kafka.partitioner import owner_partition
from pipeline.providers.signing import sign
from tests.integration.harness import ROOT, Env, command_counts, read_committed, wait_for_audit

pytestmark = pytest.mark.broker

MakeEnv = Callable[..., Any]
SECRET = "gh-redrive-ttl-secret"
DAY_MS = 86_400_000


def _github(delivery_id: str, *, at: int) -> tuple[bytes, bytes, list[tuple[str, bytes]], None, int]:
    """A signed GitHub push as the ingress wrote it at ``at`` (ms): that is its record timestamp."""
    body = orjson.dumps({"ref": "refs/heads/main", "after": delivery_id})
    signed = sign("github", body, SECRET, timestamp=at / 1000, msg_id=delivery_id, event_type="push")
    headers = [("source", b"github"), ("received-at", str(at).encode())]
    headers += [(f"http-{name.lower()}", value.encode()) for name, value in signed.items()]
    return (f"github:{delivery_id}".encode(), body, headers, None, at)


def _replay(env: Env) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "dlq",
            "replay",
            "--reason",
            "bad-signature",
            "--bootstrap",
            env.bootstrap,
            "--topology",
            str(env.topology_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )


async def test_a_record_three_days_older_than_a_one_day_ttl_redriven_twice_and_copied_gives_one_command(
    pipeline_env: MakeEnv,
) -> None:
    """Redriven twice, three days after its time with a one-day TTL, and sent once more by its provider
    with its original timestamp: one command, because the claim lives a TTL from stream time."""
    variable = f"REDRIVE_TTL_GH_{os.getpid()}_{time.monotonic_ns()}"
    env: Env = await pipeline_env(secrets={"github": variable}, verify="worker", ttl="1d")
    partitions = env.topo.topics.partitions
    fresh = next(  # a key on the old one's partition: stream time is a partition's
        f"fresh-{i}"
        for i in range(1000)
        if owner_partition(f"github:fresh-{i}".encode(), partitions)
        == owner_partition(b"github:old", partitions)
    )
    now = int(time.time() * 1000)
    old = now - 3 * DAY_MS
    os.environ[variable] = "a-stale-secret"
    try:
        env.start_worker("stale")
        await env.produce([_github("old", at=old)])
        assert [a.get("reason") for a in await wait_for_audit(env, 1)] == ["bad-signature"]
    finally:
        env.stop_all()
    os.environ[variable] = SECRET
    try:
        env.start_worker("fixed")
        await env.produce([_github(fresh, at=now)])  # stream time of the old key's partition moves to now
        await wait_for_audit(env, 2)
        for expected in (3, 4):
            replayed = _replay(env)
            assert replayed.returncode == 0, replayed.stderr
            await wait_for_audit(env, expected)
        await env.produce([_github("old", at=old)])  # the provider's own copy, as old as the first
        audit = await wait_for_audit(env, 5)
    finally:
        env.stop_all()
        del os.environ[variable]
    commands = await read_committed(env.bootstrap, env.topo.topics.commands, idle=1.0)
    assert command_counts(commands) == Counter({f"github:{fresh}": 1, "github:old": 1}), env.log_tail("fixed")
    outcomes = [a["outcome"] for a in audit if a["key"] == "github:old"]  # one partition: in order
    assert outcomes == ["invalid", "first", "duplicate", "duplicate"]
    claimed = next(a for a in audit if a["key"] == "github:old" and a["outcome"] == "first")
    assert claimed["expires_at"] >= now + DAY_MS  # a whole TTL from stream time, not from its own time
