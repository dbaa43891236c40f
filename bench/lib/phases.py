"""The measured phases of a contender: draining a backlog (events/s, CPU) and latency at a fixed rate, and a contender's result."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from bench.lib.broker import Broker, warm_up
from bench.lib.procs import Proc
from bench.lib.report import BenchError, machine_busy_jiffies, percentile, pid_cpu_seconds, say
from bench.lib.workload import Stream, source_headers
from pipeline.kafka.partitioner import owner_partition

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Drain:
    events: int  # handled between the first and the last observation
    seconds: float  # from the first observation of progress to all handled
    startup_seconds: float  # from the process start to the first observed progress
    wall_seconds: float  # from the process start to all handled
    cpu_seconds: float  # CPU of the process between the two observations
    broker_cpu_seconds: float = float("nan")  # CPU of the local broker over the same span
    machine_busy: float = float("nan")  # share of all CPUs busy over the same span (anything running)
    jit_cpu_seconds: float = 0.0  # of cpu_seconds, what a JVM's JIT compiler threads used

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else float("nan")

    @property
    def cpu_per_100k(self) -> float:
        return self.cpu_seconds / self.events * 100_000 if self.events else float("nan")

    @property
    def broker_cpu_per_100k(self) -> float:
        return self.broker_cpu_seconds / self.events * 100_000 if self.events else float("nan")


def _sample(proc: Proc, broker_pid: int | None) -> tuple[float, float, tuple[int, int], float]:
    broker = float("nan")
    if broker_pid is not None:
        with contextlib.suppress(OSError):
            broker = pid_cpu_seconds(broker_pid)
    return proc.cpu_seconds(), broker, machine_busy_jiffies(), proc.jit_cpu_seconds()


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
    first: tuple[float, int, tuple[float, float, tuple[int, int], float]] | None = None
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
    (cpu0, broker0, (busy0, total0), jit0), (cpu1, broker1, (busy1, total1), jit1) = first[2], sample
    return Drain(
        events=target - first[1],
        seconds=now - first[0],
        startup_seconds=first[0] - began,
        wall_seconds=now - began,
        cpu_seconds=cpu1 - cpu0,
        broker_cpu_seconds=broker1 - broker0,
        machine_busy=(busy1 - busy0) / max(total1 - total0, 1),
        jit_cpu_seconds=jit1 - jit0,
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
    sockets: int = 0  # the contender's open sockets, the most seen in a sample each half second
    jit_cpu_share: float = 0.0  # of that CPU, the share a JVM's JIT compiler threads used


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
        cpu_before, jit_before = proc.cpu_seconds(), proc.jit_cpu_seconds()
        began = time.monotonic()
        index = 0
        sockets, sampled = proc.sockets(), began
        while index < len(records):
            if time.monotonic() - sampled >= 0.5:
                sockets, sampled = max(sockets, proc.sockets()), time.monotonic()
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
        jit_used = proc.jit_cpu_seconds() - jit_before
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
        sockets=sockets,
        jit_cpu_share=jit_used / cpu_used if cpu_used > 0 else 0.0,
    )


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
