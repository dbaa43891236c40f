"""Failover with and without standby replicas, at 1M and 10M keys in a partition.

    .venv/bin/python bench/failover.py --bootstrap 127.0.0.1:19092
    .venv/bin/python bench/failover.py --keys 1000000 --standbys 1 --runs 1    # one row, a few minutes

For each key count, a one-partition changelog is preloaded once with that many
entries (real ``Entry.encode()`` values, alive for a week, in transactions of
50,000 as a worker writes them). Then each run, for ``--standbys`` 0 and 1 in
turn, on fresh input, command and audit topics, a fresh consumer group and fresh
state directories:

1. worker A (``pipeline worker``, default settings, ``--standby-replicas S``)
   starts, restores the changelog and serves the partition;
2. worker B starts; with one standby it follows the changelog into its own store
   until it is level (its ``/healthz`` says so); with none it idles;
3. a producer sends ``--rate`` events/s (1,000; unique keys, each record stamped
   with the time it is sent) and a read_committed reader notes when each
   command arrives; after ``--steady`` seconds (15) A is SIGKILLed.

Reported per run:

- ``failover s``: from the SIGKILL to the arrival of the first command the new
  owner handled (one for an input offset at or past the group's committed offset
  at the kill, the first the new owner can handle);
- end-to-end latency (p50, p99, max) of the events sent from the kill to
  ``--after`` seconds (30) after it: from the record's timestamp to its command's
  arrival;
- what B replayed before it served (its log: a promotion's tail, or a whole restore);
- exactly once: every event sent has exactly one command (a read_committed reader
  that is not the worker).

The session timeout is the worker's default (10 s): the group notices the SIGKILL
only after it. Topics and state directories are deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from confluent_kafka import Producer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.lib.broker import produce_when_room  # noqa: E402
from bench.lib.procs import free_port  # noqa: E402
from bench.lib.topology_file import write_topology  # noqa: E402
from pipeline import topology  # noqa: E402
from pipeline.kafka import admin  # noqa: E402
from pipeline.state.decision import Entry  # noqa: E402

DAY_MS = 86_400_000
SESSION_S = 10.0  # the worker's default --session-timeout-ms


def preload(bootstrap: str, changelog: str, keys: int) -> None:
    """``keys`` live entries on partition 0 of ``changelog``, in transactions of 50,000."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"bench-failover-{uuid.uuid4().hex[:8]}",
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
        }
    )
    producer.init_transactions()
    producer.begin_transaction()
    start = int(time.time() * 1000) - DAY_MS
    for i in range(keys):
        stamp = start + i * DAY_MS // keys
        entry = Entry(stamp, stamp + 7 * DAY_MS, 0, i, 0, stamp, f"cmd-{i}", "events", f"{i:016x}", 0)
        produce_when_room(
            producer, changelog, entry.encode(), f"stripe:pre_{i}".encode(), partition=0, timestamp=stamp
        )
        if (i + 1) % 50_000 == 0:
            producer.commit_transaction()
            producer.begin_transaction()
            if (i + 1) % 1_000_000 == 0:
                print(f"  preloaded {i + 1:,} keys", flush=True)
    producer.commit_transaction()


def health(port: int) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
            return response.status, orjson.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, orjson.loads(exc.read() or b"{}")
    except (OSError, ValueError):
        return 0, {}


async def until(check: Any, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.2)


@dataclass
class Run:
    keys: int
    standbys: int
    number: int
    failover: float = float("nan")
    latencies: list[float] = field(default_factory=list)
    replayed: str = ""
    exactly_once: str = ""
    sent: int = 0


class Worker:
    def __init__(self, name: str, root: Path, args: list[str]) -> None:
        self.name = name
        self.port = free_port()
        self.log_path = root / f"{name}.log"
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pipeline",
                "worker",
                "--state-dir",
                str(root / name),
                "--metrics-port",
                str(self.port),
                *args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=dict(os.environ, PIPELINE_LOG_LEVEL="INFO"),
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def serves(self, partition: str) -> bool:
        status, detail = health(self.port)
        return status == 200 and detail.get("partitions", {}).get(partition) in ("ready", "committing")

    def standby_level(self, partition: str) -> bool:
        status, detail = health(self.port)
        standby = detail.get("standby", {}).get(partition, {})
        return status == 200 and standby.get("lag_records") == 0

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


async def one_run(args: argparse.Namespace, run: Run, changelog: str, root: Path) -> None:
    app = f"fo{uuid.uuid4().hex[:8]}"
    path = root / f"{app}.toml"
    write_topology(path, app, 1, changelog=changelog)
    topo = topology.load(path)
    await admin.ensure_topics(args.bootstrap, admin.topic_specs(topo))
    group = f"{app}-group"
    common = [
        "--bootstrap",
        args.bootstrap,
        "--topology",
        str(path),
        "--group",
        group,
        "--standby-replicas",
        str(run.standbys),
    ]
    partition = f"{topo.topics.input}-0"
    (root / app).mkdir()
    a = Worker("a", root / app, common)
    b: Worker | None = None
    try:
        await until(lambda: a.serves(partition), "worker A serves the partition", 1800)
        b = Worker("b", root / app, common)
        await until(lambda: b is not None and health(b.port)[0] == 200, "worker B is up", 600)
        await asyncio.sleep(2 * SESSION_S / 5 + 3)  # B's join: a rebalance, after which A serves again
        await until(lambda: a.serves(partition), "worker A serves the partition after B joined", 1800)
        if run.standbys:
            await until(lambda: b is not None and b.standby_level(partition), "B's standby is level", 1800)
        await traffic(args, run, topo, group, a, b)
    finally:
        for worker in (a, b):
            if worker is not None:
                worker.stop()
        if b is not None:
            run.replayed = replayed(b.log())
        shutil.rmtree(root / app, ignore_errors=True)
        await delete_topics(
            args.bootstrap, [topo.topics.input, topo.topics.commands, topo.topics.audit, topo.topics.dlq]
        )


async def traffic(args: argparse.Namespace, run: Run, topo: Any, group: str, a: Worker, b: Worker) -> None:
    """Send events at the rate, SIGKILL A after the steady part, keep sending, then check every command."""
    producer = AIOKafkaProducer(bootstrap_servers=args.bootstrap, linger_ms=2, acks="all")
    reader = AIOKafkaConsumer(
        bootstrap_servers=args.bootstrap,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await producer.start()
    await reader.start()
    commands_tp = TopicPartition(topo.topics.commands, 0)
    reader.assign([commands_tp])
    arrivals: dict[str, list[float]] = {}
    sent: dict[str, tuple[float, Any]] = {}  # key -> (time sent, future of its metadata)
    stop_reading = asyncio.Event()

    async def read() -> None:
        while not stop_reading.is_set():
            batch = await reader.getmany(timeout_ms=100)
            now = time.time()
            for records in batch.values():
                for record in records:
                    arrivals.setdefault(record.key.decode(), []).append(now)

    reading = asyncio.create_task(read())
    killed_at = 0.0
    committed_at_kill = -1
    started = time.time()
    end = started + args.steady + args.after
    i = 0
    tick = 0.01
    per_tick = max(1, int(args.rate * tick))
    next_tick = time.monotonic()
    while time.time() < end:
        now = time.time()
        if not killed_at and now - started >= args.steady:
            a.process.send_signal(signal.SIGKILL)
            killed_at = time.time()
            a.process.wait()
            committed_at_kill = await committed(args.bootstrap, group, topo.topics.input)
        for _ in range(per_tick):
            key = f"stripe:evt_{topo.app}_{i}"  # new to the changelog the runs share
            body = orjson.dumps(
                {
                    "id": f"evt_{topo.app}_{i}",
                    "object": "event",
                    "type": "invoice.paid",
                    "data": {"object": {"id": f"in_{i}"}},
                }
            )
            stamp = time.time()
            future = await producer.send(
                topo.topics.input,
                body,
                key=key.encode(),
                headers=[("source", b"stripe")],
                timestamp_ms=int(stamp * 1000),
            )
            sent[key] = (stamp, future)
            i += 1
        next_tick += tick
        await asyncio.sleep(max(0.0, next_tick - time.monotonic()))
    await producer.flush()
    offsets = {key: (stamp, (await future).offset) for key, (stamp, future) in sent.items()}
    run.sent = len(offsets)
    try:
        await until(
            lambda: len(arrivals) >= len(offsets), f"a command for each of {len(offsets)} events", 300
        )
    except TimeoutError:
        print(f"  only {len(arrivals)} of {len(offsets)} events have a command; the new owner's log ends:")
        print("\n".join(b.log().splitlines()[-30:]))
        raise
    await asyncio.sleep(3.0)  # anything doubled would arrive now
    stop_reading.set()
    await reading
    await reader.stop()
    await producer.stop()
    firsts = sorted(
        min(arrivals[key]) for key, (_stamp, offset) in offsets.items() if offset >= committed_at_kill
    )
    run.failover = firsts[0] - killed_at if firsts else float("nan")
    window = [
        (min(arrivals[key]) - stamp) * 1000
        for key, (stamp, _offset) in offsets.items()
        if killed_at <= stamp <= killed_at + args.after
    ]
    run.latencies = sorted(window)
    counts = Counter({key: len(times) for key, times in arrivals.items()})
    doubled = sum(1 for n in counts.values() if n > 1)
    missing = len(set(offsets) - set(counts))
    run.exactly_once = "yes" if not doubled and not missing else f"NO: {doubled} doubled, {missing} missing"


async def committed(bootstrap: str, group: str, topic: str) -> int:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
        meta = offsets.get(TopicPartition(topic, 0))
        return int(meta.offset) if meta is not None else 0
    finally:
        await admin.close()


async def delete_topics(bootstrap: str, topics: list[str]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_topics(topics)
    except Exception as exc:
        print(f"  (could not delete {topics}: {exc!r})")
    finally:
        await admin.close()


def replayed(log: str) -> str:
    """What B replayed before serving: a promotion's tail, or a whole restore (with its rate)."""
    how = "promoted" if "promoted from standby" in log else "restored"
    done = re.findall(r"restore .*?: done in ([\d.]+)s: (\d+) records applied", log)
    if not done:
        return f"{how}, 0 records"
    seconds, count = float(done[-1][0]), int(done[-1][1])
    rate = f" at {count / seconds:,.0f}/s" if seconds >= 1.0 else ""
    return f"{how}, {count:,} records{rate}"


def percentile(values: list[float], share: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(share * len(values)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092"))
    parser.add_argument("--keys", default="1000000,10000000", help="comma-separated key counts")
    parser.add_argument("--standbys", default="0,1", help="comma-separated standby counts")
    parser.add_argument("--runs", type=int, default=2, help="runs of each (keys, standbys)")
    parser.add_argument("--rate", type=int, default=1000, help="events per second")
    parser.add_argument("--steady", type=float, default=15.0, help="seconds of traffic before the SIGKILL")
    parser.add_argument("--after", type=float, default=30.0, help="seconds of traffic after it")
    args = parser.parse_args()
    print(
        f"{platform.node()}: {os.cpu_count()} cpus, python {platform.python_version()}, load {os.getloadavg()}"
    )
    rows: list[Run] = []
    root = Path(tempfile.mkdtemp(prefix="bench-failover."))
    try:
        for keys in (int(k) for k in args.keys.split(",")):
            changelog = f"bench-failover-{keys}-{uuid.uuid4().hex[:6]}-changelog"
            spec = admin.TopicSpec(
                changelog, 1, 1, {"cleanup.policy": "compact,delete", "retention.ms": str(8 * DAY_MS)}
            )
            asyncio.run(admin.ensure_topics(args.bootstrap, [spec]))
            started = time.monotonic()
            print(f"preloading {keys:,} keys into {changelog}", flush=True)
            preload(args.bootstrap, changelog, keys)
            print(f"  done in {time.monotonic() - started:.0f}s", flush=True)
            try:
                for number in range(1, args.runs + 1):
                    for standbys in (int(s) for s in args.standbys.split(",")):
                        run = Run(keys, standbys, number)
                        print(
                            f"run: {keys:,} keys, {standbys} standby, #{number} (load {os.getloadavg()[0]:.1f})",
                            flush=True,
                        )
                        asyncio.run(one_run(args, run, changelog, root))
                        rows.append(run)
                        print(f"  {row(run)}", flush=True)
            finally:
                asyncio.run(delete_topics(args.bootstrap, [changelog]))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(
        f"\n{'keys':>11} {'standbys':>8} {'run':>3} {'failover s':>10} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}  {'replayed by the new owner':<45} exactly once"
    )
    for run in rows:
        print(row(run))
    for keys in sorted({r.keys for r in rows}):
        for standbys in sorted({r.standbys for r in rows}):
            times = [r.failover for r in rows if r.keys == keys and r.standbys == standbys]
            if times:
                print(
                    f"{keys:>11,} {standbys:>8} failover {min(times):.1f}-{max(times):.1f} s (median {statistics.median(times):.1f})"
                )
    print(
        f"session timeout {SESSION_S:.0f} s; load average after the runs: {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )


def row(run: Run) -> str:
    lat = run.latencies
    return (
        f"{run.keys:>11,} {run.standbys:>8} {run.number:>3} {run.failover:>10.1f} {percentile(lat, 0.5):>8.0f} "
        f"{percentile(lat, 0.99):>8.0f} {(lat[-1] if lat else float('nan')):>8.0f}  {run.replayed:<32} {run.exactly_once}"
    )


if __name__ == "__main__":
    main()
