"""Worker benchmark: the exactly-once dedupe worker against a plain aiokafka passthrough.

    .venv/bin/python bench/worker_bench.py --bootstrap 127.0.0.1:19092 --events 200000 --partitions 4
    .venv/bin/python bench/worker_bench.py --bootstrap 127.0.0.1:19092 --quick   # under ~2 minutes

In one run, on one broker and the same data, for each contender:

1. fresh uniquely named topics (and consumer group, and state directory);
2. the same N Stripe-like webhook records (1-2 KB JSON bodies with nested
   objects, 30% duplicates: the same key and body re-sent later in the
   stream, keyed ``stripe:evt_...``, header ``source: stripe``) produced in
   the same order into its input topic *before* it starts (a backlog), by an
   idempotent producer that fills one batch per partition;
3. the contender as a subprocess: ``passthrough`` (``bench/passthrough.py``,
   aiokafka consume -> ``producer.send`` -> periodic commit, at least once, no
   state), ``worker`` (``python -m pipeline worker``, exactly once) and
   ``worker-preloaded`` (the worker whose store already holds ``--preload``
   keys from an earlier run over as many unique small events);
4. throughput: events/s to drain the backlog, measured from the first handled
   record to the last (startup - interpreter, group join, store open - is
   reported apart), where "handled" is what a read_committed reader can see:
   the passthrough's output end offsets (LSO), the worker's consumer-group
   offsets, which it commits inside the same transaction as its outputs;
   peak RSS (VmHWM) and CPU seconds per 100k events (utime+stime over the
   drain) from /proc/<pid>;
5. latency: with the contender caught up, records are produced at a fixed rate
   and a read_committed consumer matches each output record's key to its
   first copy's send time (the record timestamp): p50 and p99 of that delay;
   the reader has fetched every partition once before the first send, so its
   own start is not counted as the contender's latency;
6. a check of the outputs (counts of first/duplicate outcomes, one command per
   key, every record passed through), then the contender is stopped.

It prints one table and the machine, deletes its topics at the end (also on
Ctrl-C) and keeps the contenders' logs in ``--work-dir``. "ratio" is events/s
over the passthrough's; "CPU ratio" is the passthrough's CPU per event over
the contender's, which is what "ratio" would be if each process had a CPU of
its own (both are single-threaded and CPU-bound), so it survives other load on
a shared machine. Also printed per contender: the broker's CPU and the whole
machine's over the drain, and the worker's own transaction metrics (records
per transaction, mean commit time) scraped from its ``--metrics-port``.

``--profile-worker`` runs the workers under pyinstrument (profile only: not
for the table).
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import hashlib
import json
import os
import platform
import random
import re
import shutil
import signal
import socket
import statistics
import string
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import CoordinatorLoadInProgressError, CoordinatorNotAvailableError, KafkaError

from pipeline import kafka, topology
from pipeline.kafka import TopicSpec, owner_partition

ROOT = Path(__file__).resolve().parents[1]
PASSTHROUGH = Path(__file__).resolve().parent / "passthrough.py"
CLK_TCK = os.sysconf("SC_CLK_TCK")
ALNUM = string.ascii_letters + string.digits
STARTED = time.monotonic()
CONTENDERS = ("passthrough", "worker", "worker-preloaded")
DEFAULT_CONTENDERS = CONTENDERS[:3]


class BenchError(Exception):
    """A phase failed (a contender died, a phase timed out)."""


def say(message: str) -> None:
    """A progress line, with the time since the start."""
    print(f"[{time.monotonic() - STARTED:7.1f}s] {message}", flush=True)


# -- the machine --------------------------------------------------------------------------------------------


def machine_info() -> dict[str, str]:
    """What the numbers were measured on."""
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    ram = "unknown"
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    kafka_version = "unknown"
    with contextlib.suppress(OSError):
        found = re.search(
            r"<kafka\.version>([^<]+)</kafka\.version>", (ROOT / "deploy/kafka/pom.xml").read_text()
        )
        if found:
            kafka_version = found.group(1)
    versions = {}
    for name in ("aiokafka", "rocksdict", "orjson"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "?"
    digest = hashlib.sha256()
    for path in sorted((ROOT / "pipeline").rglob("*.py")):
        digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    return {
        "nproc": str(os.cpu_count()),
        "cpu": cpu,
        "ram": ram,
        "python": platform.python_version(),
        "kafka": kafka_version,
        "libraries": ", ".join(f"{k} {v}" for k, v in versions.items()),
        "kernel": platform.release(),
        "pipeline sources": f"sha256 {digest.hexdigest()[:12]} (pipeline/**/*.py)",
    }


def machine_busy_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    total = sum(fields)
    return total - fields[3] - fields[4], total


def find_broker_pid(bootstrap: str) -> int | None:
    """The local Kafka broker serving ``bootstrap``'s port, if it runs on this machine."""
    port = bootstrap.split(",", maxsplit=1)[0].rsplit(":", 1)[-1]
    candidates = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if "kafka.Kafka" in cmdline:
                candidates.append((f"/{port}/" in cmdline, int(entry.name)))
    candidates.sort(reverse=True)
    return candidates[0][1] if candidates and (candidates[0][0] or len(candidates) == 1) else None


def pid_cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (all its threads)."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def loadavg() -> str:
    with contextlib.suppress(OSError):
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return "?"


# -- the data -----------------------------------------------------------------------------------------------

EVENT_TYPES = (
    "invoice.paid",
    "invoice.payment_failed",
    "payment_intent.succeeded",
    "payment_intent.created",
    "charge.succeeded",
    "checkout.session.completed",
    "customer.subscription.updated",
    "customer.created",
)
WORDS = [
    "premium",
    "plan",
    "annual",
    "monthly",
    "seat",
    "usage",
    "metered",
    "addon",
    "support",
    "priority",
    "storage",
    "bandwidth",
    "api",
    "calls",
    "overage",
    "credit",
    "refund",
    "proration",
    "discount",
    "coupon",
    "trial",
    "renewal",
    "upgrade",
    "downgrade",
    "team",
    "enterprise",
]


def stripe_id(rng: random.Random, prefix: str) -> str:
    return prefix + "".join(rng.choices(ALNUM, k=24))


def _line_item(rng: random.Random, currency: str) -> dict[str, Any]:
    amount = rng.randrange(100, 500_000)
    return {
        "id": stripe_id(rng, "il_"),
        "object": "line_item",
        "amount": amount,
        "currency": currency,
        "description": " ".join(rng.choices(WORDS, k=rng.randrange(2, 6))),
        "period": {
            "start": 1_700_000_000 + rng.randrange(10**6),
            "end": 1_702_592_000 + rng.randrange(10**6),
        },
        "price": {
            "id": stripe_id(rng, "price_"),
            "object": "price",
            "unit_amount": amount,
            "recurring": {"interval": rng.choice(("month", "year")), "interval_count": 1},
            "product": stripe_id(rng, "prod_"),
        },
        "quantity": rng.randrange(1, 20),
        "metadata": {},
    }


def stripe_body(rng: random.Random, event_id: str, target: int) -> bytes:
    """A Stripe-like event of about ``target`` bytes: nested objects, line items, metadata."""
    currency = rng.choice(("usd", "eur", "gbp"))
    customer = stripe_id(rng, "cus_")
    event: dict[str, Any] = {
        "id": event_id,
        "object": "event",
        "api_version": "2024-06-20",
        "created": 1_700_000_000 + rng.randrange(10**7),
        "livemode": False,
        "pending_webhooks": rng.randrange(1, 4),
        "request": {"id": stripe_id(rng, "req_"), "idempotency_key": stripe_id(rng, "")},
        "type": rng.choice(EVENT_TYPES),
        "data": {
            "object": {
                "id": stripe_id(rng, "in_"),
                "object": "invoice",
                "amount_due": rng.randrange(100, 10**6),
                "amount_paid": rng.randrange(100, 10**6),
                "currency": currency,
                "customer": customer,
                "customer_details": {
                    "email": f"{stripe_id(rng, '')[:10].lower()}@example.com",
                    "address": {
                        "city": rng.choice(("Berlin", "Austin", "Lyon", "Leeds", "Osaka")),
                        "country": rng.choice(("DE", "US", "FR", "GB", "JP")),
                        "line1": f"{rng.randrange(1, 999)} {rng.choice(WORDS).title()} Street",
                        "postal_code": f"{rng.randrange(10000, 99999)}",
                    },
                    "tax_exempt": "none",
                },
                "lines": {"object": "list", "data": [], "has_more": False},
                "status": "paid",
                "metadata": {"order_id": str(rng.randrange(10**9)), "note": ""},
            },
            "previous_attributes": {"status": "open"},
        },
    }
    obj = event["data"]["object"]
    body = orjson.dumps(event)
    while len(body) + 460 < target:
        obj["lines"]["data"].append(_line_item(rng, currency))
        body = orjson.dumps(event)
    if len(body) < target:
        obj["metadata"]["note"] = "".join(rng.choices(ALNUM, k=target - len(body)))
        body = orjson.dumps(event)
    return body


def small_body(rng: random.Random, event_id: str) -> bytes:
    """A small (about 250 bytes) Stripe-like event, for pre-loading the store."""
    return orjson.dumps(
        {
            "id": event_id,
            "object": "event",
            "type": rng.choice(EVENT_TYPES),
            "created": 1_700_000_000 + rng.randrange(10**7),
            "data": {"object": {"id": stripe_id(rng, "in_"), "amount_paid": rng.randrange(100, 10**6)}},
        }
    )


@dataclass
class Stream:
    """Unique events and the order they are sent in (duplicates re-send an earlier event)."""

    keys: list[bytes]
    bodies: list[bytes]
    order: list[int]

    @property
    def unique(self) -> int:
        return len(self.keys)

    @property
    def duplicates(self) -> int:
        return len(self.order) - len(self.keys)

    def __len__(self) -> int:
        return len(self.order)

    def records(self) -> Iterator[tuple[bytes, bytes]]:
        for index in self.order:
            yield self.keys[index], self.bodies[index]

    def body_bytes(self) -> int:
        return sum(len(self.bodies[i]) for i in self.order)


def make_stream(rng: random.Random, total: int, dup_ratio: float, *, min_size: int, max_size: int) -> Stream:
    """``total`` records: ``total * (1 - dup_ratio)`` unique events and re-sends spread after their original."""
    unique = max(1, round(total * (1 - dup_ratio)))
    keys: list[bytes] = []
    bodies: list[bytes] = []
    seen: set[str] = set()
    while len(keys) < unique:
        event_id = stripe_id(rng, "evt_")
        if event_id in seen:
            continue
        seen.add(event_id)
        keys.append(f"stripe:{event_id}".encode())
        bodies.append(stripe_body(rng, event_id, rng.randrange(min_size, max_size + 1)))
    # A re-send lands an exponentially distributed distance after its original (mean a tenth of the stream).
    placed = [(float(i), i) for i in range(unique)]
    mean_gap = max(1.0, unique / 10)
    for _ in range(total - unique):
        original = rng.randrange(unique)
        placed.append((original + 0.5 + rng.expovariate(1 / mean_gap), original))
    placed.sort()
    return Stream(keys, bodies, [index for _, index in placed])


def preload_records(seed: int, count: int) -> Iterator[tuple[bytes, bytes]]:
    """``count`` unique small events (keys cannot collide with the main stream's: another prefix)."""
    rng = random.Random(seed)
    for n in range(count):
        event_id = f"evt_1P{n:010d}{stripe_id(rng, '')[:12]}"
        yield f"stripe:{event_id}".encode(), small_body(rng, event_id)


# -- Kafka helpers ------------------------------------------------------------------------------------------


def source_headers(now_ms: int) -> list[tuple[str, bytes]]:
    return [("source", b"stripe"), ("received-at", str(now_ms).encode())]


async def produce_backlog(
    bootstrap: str,
    topic: str,
    partitions: int,
    records: Iterable[tuple[bytes, bytes]],
    total: int,
    label: str,
) -> float:
    """Produce ``records`` to their owning partitions with an idempotent producer; return records/s."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        enable_idempotence=True,
        acks="all",
        linger_ms=5,
        max_batch_size=512 * 1024,
        client_id="worker-bench-producer",
    )
    await producer.start()
    began = last = time.monotonic()
    count = 0
    try:
        batches: dict[int, Any] = {}
        futures: list[asyncio.Future[Any]] = []
        for key, value in records:
            partition = owner_partition(key, partitions)
            batch = batches.get(partition)
            if batch is None:
                batch = batches[partition] = producer.create_batch()
            now = int(time.time() * 1000)
            headers = source_headers(now)
            if batch.append(key=key, value=value, timestamp=now, headers=headers) is None:
                futures.append(await producer.send_batch(batch, topic, partition=partition))
                batch = batches[partition] = producer.create_batch()
                batch.append(key=key, value=value, timestamp=now, headers=headers)
            count += 1
            if count % 2000 == 0:
                if len(futures) > 64:
                    await asyncio.gather(*futures)
                    futures.clear()
                if time.monotonic() - last >= 5:
                    last = time.monotonic()
                    rate = count / (last - began)
                    say(f"  {label}: produced {count:,}/{total:,} ({rate:,.0f} records/s)")
        for partition, batch in batches.items():
            if batch.record_count():
                futures.append(await producer.send_batch(batch, topic, partition=partition))
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    rate = count / max(time.monotonic() - began, 1e-9)
    say(f"  {label}: produced {count:,} records to {topic} ({rate:,.0f} records/s)")
    return rate


class Broker:
    """One admin client and one read_committed consumer for offset queries."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.created: list[str] = []
        self._partitions: dict[str, list[TopicPartition]] = {}
        self._coordinators: dict[str, int] = {}
        self.admin: AIOKafkaAdminClient | None = None
        self.consumer: AIOKafkaConsumer | None = None

    async def start(self) -> None:
        self.admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=15000)
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, isolation_level="read_committed", enable_auto_commit=False
        )
        await asyncio.wait_for(self.admin.start(), 20)
        await asyncio.wait_for(self.consumer.start(), 20)

    def _consumer(self) -> AIOKafkaConsumer:
        if self.consumer is None:
            raise BenchError("the broker client is not started")
        return self.consumer

    def _admin(self) -> AIOKafkaAdminClient:
        if self.admin is None:
            raise BenchError("the broker client is not started")
        return self.admin

    async def stop(self) -> None:
        if self.consumer is not None:
            await self.consumer.stop()
        if self.admin is not None:
            await self.admin.close()

    async def create(self, specs: list[TopicSpec]) -> None:
        self.created += [s.name for s in specs if s.name not in self.created]
        await kafka.ensure_topics(self.bootstrap, specs, timeout=20)

    async def partitions(self, topic: str) -> list[TopicPartition]:
        if topic not in self._partitions:
            for _ in range(100):
                parts = self._consumer().partitions_for_topic(topic)
                if parts:
                    break
                await self._consumer()._client.force_metadata_update()  # no public refresh in aiokafka
                await asyncio.sleep(0.1)
            else:
                raise BenchError(f"topic {topic} has no partitions in the metadata")
            self._partitions[topic] = [TopicPartition(topic, p) for p in sorted(parts)]
        return self._partitions[topic]

    async def end_offsets(self, topic: str) -> dict[int, int]:
        """The last stable offsets (what a read_committed reader can reach) of ``topic``."""
        tps = await self.partitions(topic)
        ends = await self._consumer().end_offsets(tps)
        return {tp.partition: ends[tp] for tp in tps}

    async def _coordinator(self, group: str) -> int:
        """The group's coordinator; on a fresh broker the first ask creates the offsets topic, so retry."""
        if group not in self._coordinators:
            deadline = time.monotonic() + 30
            while True:
                try:
                    self._coordinators[group] = await self._admin().find_coordinator(group)
                    break
                except (CoordinatorNotAvailableError, CoordinatorLoadInProgressError):
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.2)
        return self._coordinators[group]

    async def committed(self, group: str, topic: str) -> dict[int, int]:
        """The group's committed offsets on ``topic`` (-1 where none)."""
        tps = await self.partitions(topic)
        offsets = await self._admin().list_consumer_group_offsets(
            group, group_coordinator_id=await self._coordinator(group), partitions=tps
        )
        return {tp.partition: (offsets[tp].offset if tp in offsets else -1) for tp in tps}

    async def group_members(self, group: str) -> set[str]:
        """The member ids of ``group`` once it is Stable (assignments handed out); empty before."""
        responses = await self._admin().describe_consumer_groups(
            [group], group_coordinator_id=await self._coordinator(group)
        )
        for response in responses:
            for described in response.to_object()["groups"]:
                if described["group"] == group and described["state"] == "Stable":
                    return {member["member_id"] for member in described["members"]}
        return set()

    async def delete_created(self) -> None:
        if not self.created:
            return
        names, self.created = self.created, []
        try:
            await asyncio.wait_for(self._admin().delete_topics(names, timeout_ms=15000), 30)
            say(f"deleted {len(names)} topics")
        except Exception as exc:
            say(f"could not delete topics {names}: {exc!r}")


async def scan(
    bootstrap: str, topic: str, start: dict[int, int], *, on_record: Callable[[Any], None], timeout: float
) -> int:
    """Read ``topic`` read_committed from ``start`` to its current end; return the records read."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        enable_auto_commit=False,
        max_partition_fetch_bytes=8 * 1024 * 1024,
        fetch_max_bytes=32 * 1024 * 1024,
    )
    await consumer.start()
    count = 0
    try:
        tps = [TopicPartition(topic, p) for p in sorted(start)]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        for tp in tps:
            consumer.seek(tp, start[tp.partition])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            positions = [await consumer.position(tp) for tp in tps]
            if all(pos >= ends[tp] for pos, tp in zip(positions, tps, strict=True)):
                break
            batch = await consumer.getmany(timeout_ms=500, max_records=20000)
            for records in batch.values():
                for record in records:
                    on_record(record)
                count += len(records)
        else:
            raise BenchError(f"reading {topic} timed out after {timeout:.0f}s ({count:,} records)")
    finally:
        await consumer.stop()
    return count


# -- processes ----------------------------------------------------------------------------------------------

_LIVE: list[subprocess.Popen[bytes]] = []


@atexit.register
def _kill_leftovers() -> None:
    for process in _LIVE:
        if process.poll() is None:
            process.kill()


class Proc:
    """A contender's process, with /proc readings."""

    def __init__(self, name: str, argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.started = time.monotonic()
        self.popen = subprocess.Popen(
            argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=dict(os.environ, PIPELINE_LOG_LEVEL="INFO", PYTHONUNBUFFERED="1", **(env or {})),
            start_new_session=True,  # Ctrl-C reaches the bench only, which stops this in order
        )
        _LIVE.append(self.popen)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def cpu_seconds(self) -> float:
        """utime + stime of the process (all its threads)."""
        return pid_cpu_seconds(self.pid)

    def status_kib(self, field_name: str) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
        return 0

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def check(self) -> None:
        if not self.alive():
            raise BenchError(f"{self.name} exited with {self.popen.returncode}; log tail:\n{self.log_tail()}")

    async def stop(self, timeout: float = 30.0) -> int | None:
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while self.alive() and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            if self.alive():
                say(f"  {self.name} did not stop within {timeout:.0f}s of SIGTERM; killing it")
                self.popen.kill()
                self.popen.wait()
        self._log.close()
        return self.popen.returncode


def log_findings(path: Path, limit: int = 8) -> list[str]:
    """WARNING/ERROR lines and tracebacks of a contender's log."""
    if not path.exists():
        return []
    lines = path.read_text(errors="replace").splitlines()
    return [line for line in lines if re.search(r" (WARNING|ERROR|CRITICAL) |Traceback", line)][:limit]


# -- phases -------------------------------------------------------------------------------------------------


@dataclass
class Drain:
    events: int  # handled between the first and the last observation
    seconds: float  # from the first observation of progress to all handled
    startup_seconds: float  # from the process start to the first observed progress
    wall_seconds: float  # from the process start to all handled
    cpu_seconds: float  # CPU of the process between the two observations
    broker_cpu_seconds: float = float("nan")  # CPU of the local broker over the same span
    machine_busy: float = float("nan")  # share of all CPUs busy over the same span (anything running)

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else float("nan")

    @property
    def cpu_per_100k(self) -> float:
        return self.cpu_seconds / self.events * 100_000 if self.events else float("nan")

    @property
    def broker_cpu_per_100k(self) -> float:
        return self.broker_cpu_seconds / self.events * 100_000 if self.events else float("nan")


def _sample(proc: Proc, broker_pid: int | None) -> tuple[float, float, tuple[int, int]]:
    broker = float("nan")
    if broker_pid is not None:
        with contextlib.suppress(OSError):
            broker = pid_cpu_seconds(broker_pid)
    return proc.cpu_seconds(), broker, machine_busy_jiffies()


async def drain(
    proc: Proc,
    handled: Callable[[], Awaitable[int]],
    target: int,
    *,
    timeout: float,
    label: str,
    broker_pid: int | None = None,
) -> Drain:
    """Poll ``handled()`` until it reaches ``target``; time the part after the first progress."""
    first: tuple[float, int, tuple[float, float, tuple[int, int]]] | None = None
    start_sample = _sample(proc, broker_pid)
    began = proc.started
    last_report = time.monotonic()
    deadline = time.monotonic() + timeout
    while True:
        proc.check()
        count = await handled()
        now = time.monotonic()
        sample = _sample(proc, broker_pid)
        if first is None and count > 0:
            first = (now, count, sample)
        if count >= target:
            break
        if now > deadline:
            raise BenchError(f"{label}: {count:,}/{target:,} handled after {timeout:.0f}s; giving up")
        if now - last_report >= 5:
            last_report = now
            if first is not None and now > first[0]:
                rate = (count - first[1]) / (now - first[0])
                eta = (target - count) / rate if rate > 0 else float("inf")
                say(f"  {label}: {count:,}/{target:,} handled ({rate:,.0f} events/s, ETA {eta:.0f}s)")
            else:
                say(f"  {label}: starting ({now - began:.0f}s)")
        await asyncio.sleep(0.1)
    if first is None or first[1] >= target:  # everything within one poll: time it from the start instead
        first = (began, 0, start_sample)
    (cpu0, broker0, (busy0, total0)), (cpu1, broker1, (busy1, total1)) = first[2], sample
    return Drain(
        events=target - first[1],
        seconds=now - first[0],
        startup_seconds=first[0] - began,
        wall_seconds=now - began,
        cpu_seconds=cpu1 - cpu0,
        broker_cpu_seconds=broker1 - broker0,
        machine_busy=(busy1 - busy0) / max(total1 - total0, 1),
    )


@dataclass
class Latency:
    sent: int
    firsts: int
    seen: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    achieved_rate: float
    cpu_us_per_event: float = float("nan")  # the contender's CPU from the first send to the last record seen


async def latency_phase(
    bootstrap: str,
    broker: Broker,
    proc: Proc,
    *,
    input_topic: str,
    partitions: int,
    watch_topic: str,
    stream: Stream,
    rate: float,
    label: str,
) -> Latency:
    """Produce ``stream`` at ``rate``/s; the delay from send to a read_committed reader seeing the output."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        enable_auto_commit=False,
        fetch_max_wait_ms=20,
    )
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, acks="all", linger_ms=0)
    await consumer.start()
    await producer.start()
    sent_at: dict[bytes, float] = {}
    delays: dict[bytes, float] = {}
    stop_reading = asyncio.Event()

    async def read() -> None:
        while not stop_reading.is_set():
            batch = await consumer.getmany(timeout_ms=50)
            now = time.time()
            for records in batch.values():
                for record in records:
                    key = record.key
                    if key in sent_at and key not in delays:
                        delays[key] = now - sent_at[key]

    try:
        tps = await broker.partitions(watch_topic)
        consumer.assign(tps)
        ends = await broker.end_offsets(watch_topic)
        for tp in tps:
            consumer.seek(tp, ends[tp.partition])
        await warm_up(consumer, tps, producer, input_topic)
        reader = asyncio.create_task(read())
        futures: list[asyncio.Future[Any]] = []
        records = list(stream.records())
        cpu_before = proc.cpu_seconds()
        began = time.monotonic()
        index = 0
        while index < len(records):
            due = min(len(records), int((time.monotonic() - began) * rate) + 1)
            while index < due:
                key, value = records[index]
                now = time.time()
                sent_at.setdefault(key, now)
                now_ms = int(now * 1000)
                futures.append(
                    await producer.send(
                        input_topic,
                        value,
                        key=key,
                        partition=owner_partition(key, partitions),
                        timestamp_ms=now_ms,
                        headers=source_headers(now_ms),
                    )
                )
                index += 1
            await asyncio.sleep(0.002)
        produced_in = time.monotonic() - began
        await asyncio.gather(*futures)
        deadline = time.monotonic() + 60
        while len(delays) < len(sent_at) and time.monotonic() < deadline and not reader.done():
            proc.check()
            await asyncio.sleep(0.1)
        cpu_used = proc.cpu_seconds() - cpu_before
        stop_reading.set()
        await reader
    finally:
        stop_reading.set()
        await producer.stop()
        await consumer.stop()
    if len(delays) < len(sent_at):
        say(f"  {label}: {len(sent_at) - len(delays)} of {len(sent_at)} first copies never seen")
    values = sorted(d * 1000 for d in delays.values())
    return Latency(
        sent=len(records),
        firsts=len(sent_at),
        seen=len(values),
        p50_ms=percentile(values, 50),
        p99_ms=percentile(values, 99),
        max_ms=values[-1] if values else float("nan"),
        achieved_rate=len(records) / produced_in if produced_in > 0 else float("nan"),
        cpu_us_per_event=cpu_used / len(records) * 1e6 if records else float("nan"),
    )


async def warm_up(
    consumer: AIOKafkaConsumer, tps: list[TopicPartition], producer: AIOKafkaProducer, input_topic: str
) -> None:
    """Have the reader fetch every partition once, and the producer know the input topic, before timing.

    A reader's first fetches (metadata, fetch sessions) took about 200 ms; counted in, they made the
    first fifth of a second's records look 100-200 ms late, which was the p99 of a 10 s phase.
    """
    await producer.partitions_for(input_topic)
    deadline = time.monotonic() + 30
    while any(consumer.highwater(tp) is None for tp in tps):
        if time.monotonic() > deadline:
            raise RuntimeError("the latency reader fetched nothing for 30 s")
        await consumer.getmany(*tps, timeout_ms=50)


def percentile(sorted_values: list[float], pct: float) -> float:
    if not sorted_values:
        return float("nan")
    if len(sorted_values) == 1:
        return sorted_values[0]
    return statistics.quantiles(sorted_values, n=100, method="inclusive")[int(pct) - 1]


# -- the contenders -----------------------------------------------------------------------------------------


def write_topology(path: Path, app: str, partitions: int) -> Path:
    """A topology with unique topic names and one Stripe source (no signature check: trusted producer)."""
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
[sources.stripe]
provider = "stripe"
verify = "none"
ttl = "7d"
""",
        encoding="utf-8",
    )
    return path


@dataclass
class Result:
    name: str
    label: str
    drain: Drain | None = None
    latency: Latency | None = None
    peak_rss_mib: float = float("nan")
    checks: dict[str, Any] = field(default_factory=dict)
    log: str = ""
    warnings: list[str] = field(default_factory=list)
    error: str | None = None
    preload: dict[str, Any] = field(default_factory=dict)
    transactions: dict[str, float] = field(default_factory=dict)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape_transactions(port: int) -> dict[str, float]:
    """The worker's own transaction metrics (commit time and records per transaction) from /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    values: dict[str, float] = {}
    for name in (
        "pipeline_transaction_commit_seconds_sum",
        "pipeline_transaction_commit_seconds_count",
        "pipeline_batch_records_sum",
        "pipeline_batch_records_count",
    ):
        found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
        if found:
            values[name] = float(found.group(1))
    return values


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.run_id = f"wb{time.strftime('%m%d%H%M%S')}{random.randrange(16**3):03x}"
        self.work = Path(args.work_dir or tempfile.mkdtemp(prefix="worker-bench-"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.broker = Broker(args.bootstrap)
        self.procs: list[Proc] = []
        self.results: list[Result] = []
        self.stream: Stream | None = None
        self.latency_stream: Stream | None = None
        self.broker_pid = find_broker_pid(args.bootstrap)

    # -- helpers ------------------------------------------------------------------------------------------
    def app(self, name: str) -> str:
        return f"{self.run_id}-{name.replace('worker-', 'w')}"

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        proc = Proc(name, argv, self.work / f"{name}.log", env)
        self.procs.append(proc)
        say(f"  started {name} (pid {proc.pid}); log {proc.log_path}")
        return proc

    async def stop_all(self) -> None:
        for proc in self.procs:
            if proc.alive():
                await proc.stop()

    def worker_argv(
        self, topo_path: Path, state: Path, group: str, *, profile: Path | None = None
    ) -> list[str]:
        args = self.args
        prefix = [sys.executable]
        if profile is not None:
            prefix += ["-m", "pyinstrument", "--renderer", "pyisession", "--outfile", str(profile)]
        prefix += ["-m", "pipeline"]
        return [
            *prefix,
            "worker",
            "--bootstrap",
            args.bootstrap,
            "--topology",
            str(topo_path),
            "--state-dir",
            str(state),
            "--group",
            group,
            *worker_bounds(args.commit_interval_ms, args.max_batch),
        ]

    async def committed_progress(self, group: str, topic: str, start: dict[int, int]) -> int:
        committed = await self.broker.committed(group, topic)
        return sum(max(committed[p], start[p]) - start[p] for p in start)

    async def finish(self, proc: Proc, result: Result) -> None:
        result.peak_rss_mib = proc.status_kib("VmHWM") / 1024
        code = await proc.stop()
        result.warnings = log_findings(proc.log_path)
        if code not in (0, None):
            result.warnings.append(f"exit status {code}")
        say(f"  {proc.name} stopped (exit {code}); peak RSS {result.peak_rss_mib:.1f} MiB")

    # -- the passthrough ----------------------------------------------------------------------------------
    async def run_passthrough(self, result: Result) -> None:
        args, stream = self.args, self.require(self.stream)
        app = self.app("passthrough")
        source, output, group = f"{app}.raw", f"{app}.out", f"{app}-group"
        await self.broker.create([TopicSpec(source, args.partitions), TopicSpec(output, args.partitions)])
        await produce_backlog(
            args.bootstrap, source, args.partitions, stream.records(), len(stream), "passthrough backlog"
        )
        base = await self.broker.end_offsets(output)
        proc = self.start(
            "passthrough",
            [
                sys.executable,
                str(PASSTHROUGH),
                "--bootstrap",
                args.bootstrap,
                "--input",
                source,
                "--output",
                output,
                "--group",
                group,
                "--commit-interval-ms",
                str(args.passthrough_commit_ms),
            ],
        )
        result.log = str(proc.log_path)

        async def handled() -> int:
            ends = await self.broker.end_offsets(output)
            return sum(ends[p] - base[p] for p in ends)

        result.drain = await drain(
            proc,
            handled,
            len(stream),
            timeout=args.drain_timeout,
            label="passthrough",
            broker_pid=self.broker_pid,
        )
        self.report_drain(result)
        if self.latency_stream is not None:
            result.latency = await latency_phase(
                args.bootstrap,
                self.broker,
                proc,
                input_topic=source,
                partitions=args.partitions,
                watch_topic=output,
                stream=self.latency_stream,
                rate=args.latency_rate,
                label="passthrough",
            )
            self.report_latency(result)
        total = len(stream) + (len(self.latency_stream) if self.latency_stream else 0)
        await drain(proc, handled, total, timeout=120, label="passthrough (catching up)")
        await self.finish(proc, result)
        keys: Counter[bytes] = Counter()
        count = await scan(
            args.bootstrap, output, base, on_record=lambda r: keys.update((r.key,)), timeout=300
        )
        result.checks = {"output records": count, "expected": total, "ok": count >= total}

    # -- the worker ---------------------------------------------------------------------------------------
    async def run_worker(self, result: Result, *, preload: int = 0) -> None:
        args, stream = self.args, self.require(self.stream)
        name = result.name
        app = self.app(name)
        topo_path = write_topology(self.work / f"{app}.toml", app, args.partitions)
        topo = topology.load(topo_path)
        topics = topo.topics
        group = f"{app}-group"
        state = self.work / f"{name}-state"
        await self.broker.create(kafka.topic_specs(topo, args.partitions))
        input_start = dict.fromkeys(range(args.partitions), 0)
        if preload:
            await self.preload(result, topo_path, topics.input, group, state, preload)
            input_start = await self.broker.end_offsets(topics.input)
        commands_start = await self.broker.end_offsets(topics.commands)
        audit_start = await self.broker.end_offsets(topics.audit)
        await produce_backlog(
            args.bootstrap, topics.input, args.partitions, stream.records(), len(stream), f"{name} backlog"
        )
        profile = self.work / f"{name}.pyisession" if args.profile_worker else None
        port = free_port()
        proc = self.start(
            name,
            [
                *self.worker_argv(topo_path, state, group, profile=profile),
                "--metrics-port",
                str(port),
            ],
        )
        result.log = str(proc.log_path)

        async def handled() -> int:
            return await self.committed_progress(group, topics.input, input_start)

        result.drain = await drain(
            proc, handled, len(stream), timeout=args.drain_timeout, label=name, broker_pid=self.broker_pid
        )
        self.report_drain(result)
        try:
            result.transactions = self.transaction_stats(await asyncio.to_thread(scrape_transactions, port))
            say(f"  {name}: transactions during the backlog: {result.transactions}")
        except OSError as exc:
            say(f"  {name}: could not read the worker's metrics: {exc!r}")
        if self.latency_stream is not None:
            result.latency = await latency_phase(
                args.bootstrap,
                self.broker,
                proc,
                input_topic=topics.input,
                partitions=args.partitions,
                watch_topic=topics.commands,
                stream=self.latency_stream,
                rate=args.latency_rate,
                label=name,
            )
            self.report_latency(result)
        total = len(stream) + (len(self.latency_stream) if self.latency_stream else 0)
        await drain(proc, handled, total, timeout=120, label=f"{name} (catching up)")
        await self.finish(proc, result)
        if profile is not None:
            say(
                f"  profile: {profile} (render: {sys.executable} -m pyinstrument --load {profile} "
                "-r text | -r pstats -o FILE | -r html -o FILE)"
            )
        await self.check_worker(result, topics.commands, commands_start, topics.audit, audit_start)

    async def preload(
        self, result: Result, topo_path: Path, input_topic: str, group: str, state: Path, count: int
    ) -> None:
        """Run the worker over ``count`` unique small events so that its store holds ``count`` keys."""
        args = self.args
        say(f"  preloading the store with {count:,} keys")
        began = time.monotonic()
        await produce_backlog(
            args.bootstrap,
            input_topic,
            args.partitions,
            preload_records(args.seed + 1, count),
            count,
            "preload",
        )
        proc = self.start(f"{result.name}-preload", self.worker_argv(topo_path, state, group))
        start = dict.fromkeys(range(args.partitions), 0)

        async def handled() -> int:
            return await self.committed_progress(group, input_topic, start)

        timeout = max(args.drain_timeout, count / 300)
        done = await drain(proc, handled, count, timeout=timeout, label="preload")
        rss = proc.status_kib("VmHWM") / 1024
        await proc.stop()
        result.preload = {
            "keys": count,
            "events_per_s": round(done.rate),
            "peak_rss_mib": round(rss, 1),
            "seconds": round(time.monotonic() - began, 1),
            "store_disk_mib": round(dir_bytes(state) / 2**20, 1),
            "warnings": log_findings(proc.log_path),
        }
        say(
            f"  preload done: {count:,} keys in {time.monotonic() - began:.0f}s "
            f"(worker {done.rate:,.0f} events/s, peak RSS {rss:.0f} MiB, "
            f"store {result.preload['store_disk_mib']} MiB on disk)"
        )

    async def check_worker(
        self,
        result: Result,
        commands: str,
        commands_start: dict[int, int],
        audit: str,
        audit_start: dict[int, int],
    ) -> None:
        stream, extra = self.require(self.stream), self.latency_stream
        firsts = stream.unique + (extra.unique if extra else 0)
        duplicates = stream.duplicates + (extra.duplicates if extra else 0)
        command_keys: Counter[bytes] = Counter()
        outcomes: Counter[str] = Counter()
        args = self.args
        await scan(
            args.bootstrap,
            commands,
            commands_start,
            on_record=lambda r: command_keys.update((r.key,)),
            timeout=300,
        )
        await scan(
            args.bootstrap,
            audit,
            audit_start,
            on_record=lambda r: outcomes.update((orjson.loads(r.value)["outcome"],)),
            timeout=300,
        )
        repeated = sum(1 for c in command_keys.values() if c > 1)
        result.checks = {
            "commands": sum(command_keys.values()),
            "distinct command keys": len(command_keys),
            "keys with >1 command": repeated,
            "audit outcomes": dict(outcomes),
            "expected firsts": firsts,
            "expected duplicates": duplicates,
            "ok": (
                sum(command_keys.values()) == firsts
                and repeated == 0
                and outcomes.get("first", 0) == firsts
                and outcomes.get("duplicate", 0) == duplicates
                and sum(outcomes.values()) == firsts + duplicates
            ),
        }

    def transaction_stats(self, raw: dict[str, float]) -> dict[str, float]:
        count = raw.get("pipeline_transaction_commit_seconds_count", 0.0)
        seconds = raw.get("pipeline_transaction_commit_seconds_sum", 0.0)
        records = raw.get("pipeline_batch_records_sum", 0.0)
        return {
            "transactions": count,
            "records per transaction": round(records / count, 1) if count else float("nan"),
            "mean commit ms": round(seconds / count * 1000, 1) if count else float("nan"),
            "commit seconds (summed over partitions)": round(seconds, 2),
        }

    # -- reporting ----------------------------------------------------------------------------------------
    @staticmethod
    def report_drain(result: Result) -> None:
        d = result.drain
        if d is None:
            return
        say(
            f"  {result.name}: {d.events:,} events in {d.seconds:.1f}s = {d.rate:,.0f} events/s "
            f"(startup {d.startup_seconds:.1f}s, wall {d.wall_seconds:.1f}s), "
            f"CPU {d.cpu_per_100k:.1f} s/100k; broker CPU {d.broker_cpu_per_100k:.1f} s/100k; "
            f"all CPUs {d.machine_busy:.0%} busy"
        )

    @staticmethod
    def report_latency(result: Result) -> None:
        lat = result.latency
        if lat is None:
            return
        say(
            f"  {result.name}: latency p50 {lat.p50_ms:.0f} ms, p99 {lat.p99_ms:.0f} ms, max {lat.max_ms:.0f} ms "
            f"({lat.seen:,}/{lat.firsts:,} first copies seen, {lat.sent:,} sent at {lat.achieved_rate:,.0f}/s); "
            f"CPU {lat.cpu_us_per_event:.0f} µs per event meanwhile"
        )

    @staticmethod
    def require(value: Stream | None) -> Stream:
        if value is None:
            raise BenchError("no data generated")
        return value

    # -- the run ------------------------------------------------------------------------------------------
    async def run(self) -> list[Result]:
        args = self.args
        task = asyncio.current_task()
        if task is not None:  # SIGTERM cleans up like Ctrl-C does
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        info = machine_info()
        say(
            f"worker bench {self.run_id}: {args.events:,} events, {args.partitions} partitions, "
            f"{args.dup_ratio:.0%} duplicates, preload {args.preload:,}, latency {args.latency_rate:,.0f}/s "
            f"for {args.latency_seconds:g}s; load average {loadavg()}; work dir {self.work}"
        )
        say("machine: " + "; ".join(f"{k} {v}" for k, v in info.items()))
        rng = random.Random(args.seed)
        began = time.monotonic()
        self.stream = make_stream(rng, args.events, args.dup_ratio, min_size=1024, max_size=2048)
        say(
            f"generated {len(self.stream):,} records ({self.stream.unique:,} unique, "
            f"{self.stream.duplicates:,} re-sent), {self.stream.body_bytes() / 2**20:.0f} MiB of bodies, "
            f"in {time.monotonic() - began:.1f}s"
        )
        latency_total = int(args.latency_rate * args.latency_seconds)
        if latency_total > 0:
            self.latency_stream = make_stream(
                random.Random(args.seed + 2), latency_total, args.dup_ratio, min_size=1024, max_size=2048
            )
        await self.broker.start()
        try:
            for name in args.only:
                label = {
                    "passthrough": "passthrough (aiokafka, at least once)",
                    "worker": "worker (exactly once, empty store)",
                    "worker-preloaded": f"worker, {args.preload:,} keys in store",
                }[name]
                result = Result(name, label)
                self.results.append(result)
                say(f"== {label}")
                try:
                    if name == "passthrough":
                        await self.run_passthrough(result)
                    elif name == "worker":
                        await self.run_worker(result)
                    else:
                        await self.run_worker(result, preload=args.preload)
                except (BenchError, KafkaError, OSError) as exc:
                    result.error = str(exc) or repr(exc)
                    say(f"  {name} FAILED: {result.error}")
                finally:
                    await self.stop_all()
                if result.checks:
                    status = "ok" if result.checks.get("ok") else "MISMATCH"
                    say(f"  output check {status}: {json.dumps(result.checks, default=str)}")
                for line in result.warnings:
                    say(f"  log: {line}")
        finally:
            await self.stop_all()
            await self.broker.delete_created()
            await self.broker.stop()
            for path in self.work.glob("*-state"):
                if not args.keep_state:
                    shutil.rmtree(path, ignore_errors=True)
        self.print_table(info)
        if args.json:
            Path(args.json).write_text(
                json.dumps(
                    {
                        "run": self.run_id,
                        "argv": sys.argv,
                        "machine": info,
                        "summary": self.summary(),
                        "results": [asdict(r) for r in self.results],
                    },
                    indent=2,
                    default=str,
                )
            )
            say(f"results written to {args.json}")
        return self.results

    def summary(self) -> list[dict[str, Any]]:
        """One row per contender: the table's figures, unformatted."""
        base = next((r.drain for r in self.results if r.name == "passthrough" and r.drain), None)
        rows = []
        for r in self.results:
            d, lat = r.drain, r.latency
            rate = d.rate if d else float("nan")
            rows.append(
                {
                    "contender": r.label + (" (FAILED)" if r.error else ""),
                    "events/s": rate,
                    "ratio": rate / base.rate if d and base else float("nan"),
                    "p50 ms": lat.p50_ms if lat else float("nan"),
                    "p99 ms": lat.p99_ms if lat else float("nan"),
                    "peak RSS MiB": r.peak_rss_mib,
                    "CPU s/100k": d.cpu_per_100k if d else float("nan"),
                    # Throughput ratio if each got a whole CPU: robust to other load on a shared machine.
                    "CPU ratio": base.cpu_per_100k / d.cpu_per_100k if d and base else float("nan"),
                }
            )
        return rows

    def print_table(self, info: dict[str, str]) -> None:
        args = self.args
        header = (
            "contender",
            "events/s",
            "ratio",
            "p50 ms",
            "p99 ms",
            "peak RSS MiB",
            "CPU s/100k",
            "CPU ratio",
        )
        rows = [
            (
                row["contender"],
                f"{row['events/s']:,.0f}",
                f"{row['ratio']:.2f}",
                f"{row['p50 ms']:.0f}",
                f"{row['p99 ms']:.0f}",
                f"{row['peak RSS MiB']:.0f}",
                f"{row['CPU s/100k']:.1f}",
                f"{row['CPU ratio']:.2f}",
            )
            for row in self.summary()
        ]
        print()
        print(
            f"Worker benchmark: {args.events:,} events ({args.dup_ratio:.0%} duplicates, 1-2 KB bodies), "
            f"{args.partitions} partitions, latency at {args.latency_rate:,.0f} events/s for {args.latency_seconds:g}s"
        )
        print_markdown(header, rows)
        print(
            "CPU ratio: the passthrough's CPU s/100k over the row's (the ratio if each had a CPU of its own)"
        )
        print()
        print(
            f"machine: {info['nproc']} CPUs ({info['cpu']}), {info['ram']} RAM, Python {info['python']}, "
            f"Kafka {info['kafka']} (one local KRaft broker), {info['libraries']}; load average at end {loadavg()}"
        )
        for r in self.results:
            if r.drain:
                d = r.drain
                print(
                    f"{r.name}: startup {d.startup_seconds:.1f}s, drain {d.seconds:.1f}s, "
                    f"wall {d.wall_seconds:.1f}s; during the drain: process {d.cpu_seconds / d.seconds:.0%} "
                    f"of a CPU, broker {d.broker_cpu_seconds / d.seconds:.0%} of a CPU "
                    f"({d.broker_cpu_per_100k:.1f} s/100k), all {info['nproc']} CPUs {d.machine_busy:.0%} busy"
                    + (f"; preload {r.preload}" if r.preload else "")
                )
            if r.error:
                print(f"{r.name}: FAILED: {r.error.splitlines()[0]}")
        print(f"logs: {self.work}", flush=True)


def print_markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """A Markdown table: the first column left-aligned, the figures right-aligned."""
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
        print("| " + " | ".join(cells) + " |")


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    parser.add_argument("--events", type=int, default=200_000, help="backlog records per contender")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--dup-ratio", type=float, default=0.3, help="share of records that are re-sends")
    parser.add_argument(
        "--preload", type=int, default=1_000_000, help="keys in the store for worker-preloaded"
    )
    parser.add_argument("--latency-rate", type=float, default=2000, help="events/s in the latency phase")
    parser.add_argument("--latency-seconds", type=float, default=10, help="0 skips the latency phase")
    parser.add_argument(
        "--commit-interval-ms", type=int, default=None, help="the worker's (default: its own, 1000)"
    )
    parser.add_argument("--max-batch", type=int, default=None, help="the worker's (default: its own, 10000)")
    parser.add_argument("--passthrough-commit-ms", type=int, default=1000)
    parser.add_argument(
        "--drain-timeout", type=float, default=None, help="seconds per backlog (default scales)"
    )
    parser.add_argument(
        "--only",
        default=",".join(DEFAULT_CONTENDERS),
        help=f"comma-separated, of {CONTENDERS} (default: the first three)",
    )
    parser.add_argument("--quick", action="store_true", help="20k events, 50k preload, 3 s of latency")
    parser.add_argument("--seed", type=int, default=20241130)
    parser.add_argument("--work-dir", default=None, help="logs and stores (default: a new temp dir)")
    parser.add_argument("--keep-state", action="store_true", help="keep the RocksDB stores")
    parser.add_argument(
        "--profile-worker",
        action="store_true",
        help="run the workers under pyinstrument (pip install pyinstrument; profile only, not for the table)",
    )
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.events, args.preload, args.latency_seconds = 20_000, 50_000, 3
    args.only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = set(args.only) - set(CONTENDERS)
    if unknown:
        parser.error(f"unknown contenders {sorted(unknown)}; choose from {CONTENDERS}")
    if args.drain_timeout is None:
        args.drain_timeout = max(120.0, args.events / 200)
    return args


def worker_bounds(commit_interval_ms: int | None, max_batch: int | None) -> list[str]:
    """The worker's ``--commit-interval-ms``/``--max-batch`` when given; else it runs with its own defaults."""
    bounds: list[str] = []
    if commit_interval_ms is not None:
        bounds += ["--commit-interval-ms", str(commit_interval_ms)]
    if max_batch is not None:
        bounds += ["--max-batch", str(max_batch)]
    return bounds


def main() -> int:
    args = parse_args()
    bench = Bench(args)
    try:
        results = asyncio.run(bench.run())
    except KeyboardInterrupt:
        print("interrupted: processes stopped, topics deleted", file=sys.stderr)
        return 130
    return 0 if all(r.error is None and r.checks.get("ok", True) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
