"""Helpers for the failure-path reproductions: workers with a chosen state dir, raw produce, bounded waits."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from tests.integration.harness import ROOT, read_committed

T = TypeVar("T")
WAIT = 60.0  # the longest any single wait of these tests lasts
OPEN_TIMEOUT = "5"  # seconds an assigned partition may fail to open before the worker exits

Record = tuple[bytes | None, bytes, Sequence[tuple[str, bytes]]]


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def worker_flags() -> str:
    """``pipeline worker --help``: tells which optional flags this version has."""
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "worker", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=True,
    ).stdout


def open_timeout_args(seconds: str = OPEN_TIMEOUT) -> list[str]:
    """``--open-timeout <seconds>`` when the worker has that flag (the env variable is always set too)."""
    return ["--open-timeout", seconds] if "--open-timeout" in worker_flags() else []


@dataclass
class Workers:
    """Worker subprocesses of one test, each with its own state dir and log files; all stopped at the end."""

    bootstrap: str
    logs: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(
        self,
        name: str,
        *,
        topology: Path,
        group: str,
        state_dir: Path,
        extra: Sequence[str] = (),
        environ: Mapping[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start ``pipeline worker``; stdout goes to ``<name>.out``, stderr (the log) to ``<name>.err``."""
        self.logs.mkdir(parents=True, exist_ok=True)
        with self.out(name).open("ab") as out, self.err(name).open("ab") as err:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "pipeline",
                    "worker",
                    "--bootstrap",
                    self.bootstrap,
                    "--topology",
                    str(topology),
                    "--state-dir",
                    str(state_dir),
                    "--group",
                    group,
                    *extra,
                ],
                stdout=out,
                stderr=err,
                cwd=ROOT,
                env=dict(os.environ, PIPELINE_LOG_LEVEL="INFO", **(environ or {})),
            )
        self.processes[name] = process
        return process

    def out(self, name: str) -> Path:
        return self.logs / f"{name}.out"

    def err(self, name: str) -> Path:
        return self.logs / f"{name}.err"

    def log(self, name: str) -> str:
        """Everything worker ``name`` wrote to stderr so far."""
        path = self.err(name)
        return path.read_text(errors="replace") if path.exists() else ""

    def tail(self, name: str, lines: int = 30) -> str:
        return "\n".join(self.log(name).splitlines()[-lines:])

    def stop(self, name: str, timeout: float = 20.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout``; returns the exit status."""
        process = self.processes[name]
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            return process.wait(timeout=timeout)

    def stop_all(self) -> None:
        for name in self.processes:
            self.stop(name)


async def wait_until(
    check: Callable[[], Awaitable[T | None]],
    what: str,
    *,
    timeout: float = WAIT,
    every: float = 0.5,
    alive: subprocess.Popen[bytes] | None = None,
    log: Callable[[], str] | None = None,
) -> T:
    """Poll ``check`` until it returns something truthy; fail after ``timeout`` or when ``alive`` exits."""
    deadline = time.monotonic() + timeout
    while True:
        found = await check()
        if found:
            return found
        if alive is not None and alive.poll() is not None:
            tail = log() if log else ""
            raise AssertionError(f"the worker exited ({alive.returncode}) while waiting for {what}\n{tail}")
        if time.monotonic() > deadline:
            tail = log() if log else ""
            raise AssertionError(f"no {what} within {timeout:g}s\n{tail}")
        await asyncio.sleep(every)


async def produce(
    bootstrap: str,
    topic: str,
    records: Iterable[Record],
    *,
    partition: int | None = 0,
    max_request_size: int = 16 * 1024 * 1024,
) -> list[Any]:
    """Produce ``(key, value, headers)`` records to one partition in order, allowing large records."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        linger_ms=20,
        max_request_size=max_request_size,
        max_batch_size=max_request_size,
    )
    await producer.start()
    try:
        futures = [
            await producer.send(topic, value, key=key, headers=list(headers), partition=partition)
            for key, value, headers in records
        ]
        return list(await asyncio.gather(*futures))
    finally:
        await producer.stop()


async def committed(bootstrap: str, group: str) -> dict[tuple[str, int], int]:
    """The group's committed offsets."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return {(tp.topic, tp.partition): meta.offset for tp, meta in offsets.items()}


async def records(bootstrap: str, topic: str) -> list[Any]:
    """Every committed record of ``topic`` (short idle: the caller polls)."""
    return await read_committed(bootstrap, topic, idle=0.5, timeout=30)


async def values(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    """Every committed record of ``topic``, parsed as JSON."""
    return [orjson.loads(r.value) for r in await records(bootstrap, topic)]


async def keys(bootstrap: str, topic: str) -> list[str]:
    """The keys of every committed record of ``topic`` (``""`` for none)."""
    return [r.key.decode() if r.key else "" for r in await records(bootstrap, topic)]


async def http_status(url: str) -> int | None:
    """The HTTP status of a GET, or ``None`` when nothing answers."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
            session.get(url) as response,
        ):
            return response.status
    except (aiohttp.ClientError, TimeoutError):
        return None


def stripe_record(event_id: str, *, received_at: bytes | None = None, body: bytes | None = None) -> Record:
    """A Stripe webhook record as the ingress writes it (``received-at`` now unless given)."""
    received = received_at if received_at is not None else str(int(time.time() * 1000)).encode()
    value = body if body is not None else stripe_body(event_id)
    return (f"stripe:{event_id}".encode(), value, [("source", b"stripe"), ("received-at", received)])


def stripe_body(event_id: str, *, pad: int = 0) -> bytes:
    """A Stripe event body; ``pad`` adds that many bytes of description."""
    body: dict[str, Any] = {
        "id": event_id,
        "object": "event",
        "type": "invoice.paid",
        "created": 1_700_000_000,
        "data": {"object": {"id": f"in_{event_id}", "object": "invoice", "description": "x" * pad}},
    }
    return orjson.dumps(body)


def fulfilment_topology(path: Path, app: str, *, partitions: int = 1) -> Path:
    """topologies/stripe-fulfilment.toml with unique topic names, no signature checks and few partitions."""
    text = (ROOT / "topologies" / "stripe-fulfilment.toml").read_text()
    text = text.replace('name = "shop"', f'name = "{app}"').replace('"shop.', f'"{app}.')
    text = text.replace('ttl = "7d"', 'ttl = "7d"\nverify = "none"')
    text = text.replace("partitions = 6", f"partitions = {partitions}")
    path.write_text(text)
    return path
