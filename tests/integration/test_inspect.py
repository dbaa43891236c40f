"""``pipeline inspect`` reports first sight, duplicates, command and expiry, from the owning worker or the audit."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import aiohttp
import orjson
import pytest

from pipeline.kafka.partitioner import owner_partition
from tests.integration.harness import ROOT, Env, wait_for_audit

pytestmark = [pytest.mark.broker, pytest.mark.slow]

MakeEnv = Callable[..., Any]
DAY_MS = 86_400_000


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _inspect(env: Env, key: str, workers: str) -> dict[str, Any]:
    return dict(orjson.loads(_inspect_text(env, key, workers, "--json")))


def _inspect_text(env: Env, key: str, workers: str, *extra: str) -> str:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "inspect",
            key,
            *extra,
            "--bootstrap",
            env.bootstrap,
            "--topology",
            str(env.topology_path),
            "--workers",
            workers,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode in (0, 3), result.stderr
    return result.stdout


async def _owned(port: int) -> dict[str, list[int]]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/partitions") as response,
    ):
        return dict((await response.json())["partitions"])


async def test_inspect_asks_the_worker_that_owns_the_key_and_falls_back_to_the_audit(
    pipeline_env: MakeEnv,
) -> None:
    """With two workers, each key is answered by its owner; without workers the audit gives the same story."""
    env: Env = await pipeline_env(partitions=4)
    ports = [_free_port(), _free_port()]
    env.start_worker("a", "--metrics-port", str(ports[0]))
    env.start_worker("b", "--metrics-port", str(ports[1]))
    ids = [f"evt_{i}" for i in range(40)]
    now = int(time.time() * 1000)
    await env.produce_stripe(ids, timestamp_ms=now)
    await env.produce_stripe(ids[:10], timestamp_ms=now + 1000)
    await env.produce_stripe(ids[:5], timestamp_ms=now + 2000)
    await wait_for_audit(env, 55)
    deadline = time.monotonic() + 30
    owned = [await _owned(p) for p in ports]
    while time.monotonic() < deadline and not all(o.get(env.topo.topics.input) for o in owned):
        await asyncio.sleep(0.5)  # wait for the group to settle with both workers owning partitions
        owned = [await _owned(p) for p in ports]
    workers = ",".join(f"127.0.0.1:{p}" for p in ports)

    for index, port in enumerate(ports):
        mine = set(owned[index][env.topo.topics.input])
        key = next(f"stripe:{e}" for e in ids[:5] if owner_partition(f"stripe:{e}".encode(), 4) in mine)
        report = _inspect(env, key, workers)
        assert report["known"]
        assert report["where"] == f"worker 127.0.0.1:{port}"
        assert report["partition"] == owner_partition(key.encode(), 4)
        assert report["duplicates"] == 2
        assert report["first_seen"] == now
        assert report["last_seen"] == now + 2000
        assert report["command"] == "handle"
        assert report["command_topic"] == env.topo.topics.commands
        assert report["expires_at"] == now + 7 * DAY_MS

        from_audit = _inspect(env, key, "")
        assert from_audit["where"].startswith("audit topic")
        assert from_audit["duplicates"] == 2
        assert from_audit["first_seen"] == now
        assert from_audit["expires_at"] == now + 7 * DAY_MS

    unknown = _inspect(env, "stripe:evt_never", workers)
    assert unknown["known"] is False


async def test_inspect_quotes_keys_with_slashes_and_question_marks_and_prints_iso_times(
    pipeline_env: MakeEnv,
) -> None:
    """A key holding '/', '?', '#' and '%2F' is answered by its worker; the text shows ISO times and the command topic."""
    env: Env = await pipeline_env(partitions=2)
    port = _free_port()
    env.start_worker("a", "--metrics-port", str(port))
    odd = "evt_odd/a?b#c%2Fd e"
    now = int(time.time() * 1000)
    await env.produce_stripe([odd], timestamp_ms=now)
    await env.produce_stripe([odd], timestamp_ms=now + 1500)
    await wait_for_audit(env, 2)
    key = f"stripe:{odd}"
    workers = f"127.0.0.1:{port}"

    report = _inspect(env, key, workers)
    assert report["where"] == f"worker {workers}", report
    assert (report["duplicates"], report["first_seen"], report["last_seen"]) == (1, now, now + 1500)

    for answered_by in (workers, ""):  # the worker, then the audit fallback
        text = _inspect_text(env, key, answered_by)
        assert "None" not in text, text
        assert f"command       handle -> {env.topo.topics.commands}" in text, text
        first_iso = datetime.fromtimestamp(now / 1000, tz=UTC).isoformat(timespec="milliseconds")
        assert f"first seen    {first_iso.replace('+00:00', 'Z')}" in text, text
        assert "duplicates    1, last at " in text, text


async def _get(port: int, path: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}{path}") as response:
        if path == "/metrics":
            return response.status, await response.text()
        return response.status, await response.json()


async def test_inspect_healthz_and_metrics_show_the_standbys_a_worker_keeps(pipeline_env: MakeEnv) -> None:
    """With one standby, each worker's /healthz and /partitions list the partitions it keeps a copy of with their lag,
    /metrics has their lag in records and seconds, and inspect names the worker keeping the key's standby."""
    env: Env = await pipeline_env(partitions=2)
    ports = [_free_port(), _free_port()]
    for name, port in zip("ab", ports, strict=True):
        env.start_worker(
            name, "--metrics-port", str(port), "--standby-replicas", "1", "--session-timeout-ms", "3000"
        )
    ids = [f"evt_{i}" for i in range(30)]
    await env.produce_stripe(ids)
    await wait_for_audit(env, 30)
    deadline = time.monotonic() + 60
    while True:
        answers = [(await _get(p, "/partitions"))[1] for p in ports]
        health = [(await _get(p, "/healthz"))[1] for p in ports]
        copies = [h.get("standby", {}) for h in health]
        if all(a["partitions"].get(env.topo.topics.input) for a in answers) and all(
            c and all(s["lag_records"] == 0 for s in c.values()) for c in copies
        ):
            break
        assert time.monotonic() < deadline, (answers, health)
        await asyncio.sleep(0.5)
    raw = env.topo.topics.input
    for index, port in enumerate(ports):
        served = set(answers[index]["partitions"][raw])
        kept = set(answers[index]["standby"][raw])
        assert served
        assert kept
        assert not served & kept  # never a standby of what it serves
        assert set(copies[index]) == {f"{raw}-{p}" for p in kept}
        assert all(s["state"] == "following" and s["lag_seconds"] == 0 for s in copies[index].values())
        expected = [
            *(
                f'pipeline_standby_lag_{unit}{{partition="{p}",topic="{raw}"}} 0.0'
                for p in kept
                for unit in ("records", "seconds")
            ),
            "pipeline_standby_partitions 1.0",
        ]
        settle = time.monotonic() + 10  # the loop sets the gauges once a second at most
        while True:
            _status, metrics = await _get(port, "/metrics")
            missing = [line for line in expected if line not in metrics]
            if not missing:
                break
            assert time.monotonic() < settle, (missing, metrics[-3000:])
            await asyncio.sleep(0.5)
    workers = ",".join(f"127.0.0.1:{p}" for p in ports)
    key = "stripe:evt_3"
    partition = owner_partition(key.encode(), 2)
    keeper = next(i for i, a in enumerate(answers) if partition in a["standby"][raw])
    report = _inspect(env, key, workers)
    assert report["standbys"] == [f"127.0.0.1:{ports[keeper]} ({raw}-{partition}, 0 records, 0.0 s behind)"]
    assert f"standby       127.0.0.1:{ports[keeper]}" in _inspect_text(env, key, workers)
