"""Test harness for the worker: unique topologies, producing webhooks, worker processes, a checker."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from pipeline import topology
from pipeline.kafka.admin import (
    admin_client,
    describe_topic_configs,
    ensure_topics,
    partition_count,
    topic_specs,
)
from pipeline.kafka.alter_configs import set_topic_configs
from pipeline.kafka.partitioner import owner_partition

ROOT = Path(__file__).resolve().parents[2]


def write_topology(
    path: Path,
    app: str,
    *,
    partitions: int = 4,
    ttl: str = "7d",
    expiry: str = "fixed",
    secrets: Mapping[str, str] | None = None,
    verify: str = "ingress",
    extra: str = "",
) -> Path:
    """A topology with unique topic names (prefixed by ``app``) and a stripe and a github source.

    A source named in ``secrets`` reads its secret from that environment variable and is
    verified where ``verify`` says; the others are trusted (``verify = "none"``).
    """
    signed = secrets or {}

    def source(name: str, more: str = "") -> str:
        check = f'secrets = ["{signed[name]}"]\nverify = "{verify}"' if name in signed else 'verify = "none"'
        return f'[sources.{name}]\nprovider = "{name}"\n{check}\nttl = "{ttl}"\n{more}'

    path.write_text(
        f"""
[app]
name = "{app}"
[topics]
input = "{app}.raw"
commands = "{app}.events"
audit = "{app}.deliveries"
dlq = "{app}.dlq"
changelog = "{app}-seen-changelog"
partitions = {partitions}
{source("stripe", f'expiry = "{expiry}"')}
{source("github")}
{extra}
""",
        encoding="utf-8",
    )
    return path


@dataclass
class Env:
    """One test's pipeline: its topology and broker."""

    bootstrap: str
    topology_path: Path
    state_root: Path
    group: str
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def topo(self) -> topology.Topology:
        return topology.load(self.topology_path)

    async def create_topics(self) -> None:
        await ensure_topics(self.bootstrap, topic_specs(self.topo))

    def stripe_body(self, event_id: str, *, size: int = 0) -> bytes:
        """A realistic Stripe event body (``size`` pads it)."""
        body: dict[str, Any] = {
            "id": event_id,
            "object": "event",
            "type": "invoice.paid",
            "created": 1_700_000_000,
            "data": {"object": {"id": f"in_{event_id[4:]}", "object": "invoice", "amount_paid": 4200}},
        }
        if size:
            body["data"]["object"]["description"] = "x" * size
        return orjson.dumps(body)

    async def produce(
        self,
        items: Iterable[tuple[bytes | None, bytes, Sequence[tuple[str, bytes]], int | None, int | None]],
    ) -> int:
        """Produce ``(key, value, headers, partition, timestamp_ms)`` records to the input topic."""
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, linger_ms=5, acks="all")
        await producer.start()
        count = 0
        try:
            futures = []
            for key, value, headers, partition, ts in items:
                futures.append(
                    await producer.send(
                        self.topo.topics.input,
                        value,
                        key=key,
                        headers=list(headers),
                        partition=partition,
                        timestamp_ms=ts,
                    )
                )
                count += 1
            await asyncio.gather(*futures)
        finally:
            await producer.stop()
        return count

    async def produce_stripe(self, event_ids: Iterable[str], *, timestamp_ms: int | None = None) -> int:
        """Produce Stripe events keyed ``stripe:<id>`` with the contract's headers."""
        return await self.produce(
            (
                f"stripe:{e}".encode(),
                self.stripe_body(e),
                [("source", b"stripe")],
                None,
                timestamp_ms,
            )
            for e in event_ids
        )

    def start_worker(self, name: str, *extra: str) -> subprocess.Popen[bytes]:
        """Start ``pipeline worker`` as a real subprocess with its own state dir and log file."""
        log = (self.state_root / f"{name}.log").open("ab")
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pipeline",
                "worker",
                "--bootstrap",
                self.bootstrap,
                "--topology",
                str(self.topology_path),
                "--state-dir",
                str(self.state_root / name),
                "--group",
                self.group,
                *extra,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=dict(os.environ, PIPELINE_LOG_LEVEL="INFO"),
        )
        self.processes.append(process)
        return process

    def assignments(self, name: str) -> int:
        """How many times worker ``name`` has been given partitions so far."""
        path = self.state_root / f"{name}.log"
        return path.read_text(errors="replace").count("partitions assigned") if path.exists() else 0

    async def wait_assigned(self, name: str, before: int, timeout: float = 30.0) -> None:
        """Wait until worker ``name`` logs a new assignment after ``before`` of them."""
        deadline = time.monotonic() + timeout
        while self.assignments(name) <= before:
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker {name} got no partitions:\n{self.log_tail(name)}")
            await asyncio.sleep(0.1)

    def stop_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def log_tail(self, name: str, lines: int = 40) -> str:
        path = self.state_root / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


async def read_committed(
    bootstrap: str, topic: str, *, idle: float = 2.0, timeout: float = 60.0
) -> list[Any]:
    """Every committed record of ``topic`` (an independent read_committed consumer, no group)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(await partition_count(bootstrap, topic) or 0)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        records: list[Any] = []
        deadline = time.monotonic() + timeout
        last_data = time.monotonic()
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            for rs in batch.values():
                records += rs
            if batch:
                last_data = time.monotonic()
            positions = [await consumer.position(tp) for tp in tps]
            if (
                all(pos >= ends[tp] for pos, tp in zip(positions, tps, strict=True))
                and time.monotonic() - last_data > 0.3
            ):
                break
            if time.monotonic() - last_data > idle and not batch:
                break
        return records
    finally:
        await consumer.stop()


async def set_max_message_bytes(env: Env, topic: str, value: int) -> None:
    """Set ``topic``'s limit and wait until a client starting now would read it."""
    async with admin_client(env.bootstrap) as admin:
        await set_topic_configs(admin, {topic: {"max.message.bytes": str(value)}})
    deadline = time.monotonic() + 30
    while (await describe_topic_configs(env.bootstrap, [topic]))[topic].get("max.message.bytes") != str(
        value
    ):
        assert time.monotonic() < deadline, f"{topic}'s max.message.bytes is not {value} after 30s"
        await asyncio.sleep(0.2)


async def wait_for_audit(env: Env, expected: int, *, timeout: float = 90.0) -> list[dict[str, Any]]:
    """Wait until the audit topic holds ``expected`` records; return them parsed."""
    deadline = time.monotonic() + timeout
    audit: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        audit = [
            orjson.loads(r.value)
            for r in await read_committed(env.bootstrap, env.topo.topics.audit, idle=1.0)
        ]
        if len(audit) >= expected:
            return audit
        await asyncio.sleep(1.0)
    return audit


def command_counts(records: Iterable[Any]) -> Counter[str]:
    """How many commands each key produced."""
    return Counter(r.key.decode() for r in records)


def wrong_partition(key: bytes, partitions: int) -> int:
    """A partition that does not own ``key``."""
    return (owner_partition(key, partitions) + 1) % partitions


def workload(unique_count: int, duplicate_ratio: float, seed: int) -> tuple[list[str], list[list[str]]]:
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


async def check_exactly_once(env: Env, ids: list[str], total: int) -> None:
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


async def produce_steadily(env: Env, waves: list[list[str]], chunk: int = 200, pause: float = 0.1) -> None:
    """Produce the waves in small chunks so the worker always has a transaction open."""
    for wave in waves:
        for start in range(0, len(wave), chunk):
            await env.produce_stripe(wave[start : start + chunk])
            await asyncio.sleep(pause)
