"""Restore speed: every partition of a changelog replayed into fresh stores, concurrently.

    KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:19092 .venv/bin/python bench/restore.py
    .venv/bin/python bench/restore.py --records 1200000 --partitions 6 --bootstrap 127.0.0.1:19092
    .venv/bin/python bench/restore.py --records 1000000 --partitions 1 --no-old   # one partition (a failover)
    .venv/bin/python bench/restore.py --quick              # 120,000 records, a smoke run
    .venv/bin/python bench/restore.py --profile 25         # cProfile of the concurrent restore

It creates a fresh changelog topic (the topology's configs: compacted and
deleted), fills it with real encoded entries (``Entry.encode``) through a
transactional confluent-kafka producer (so the log has commit markers, as the
worker's does), then restores all partitions into fresh stores in a temporary
directory, ``--repeat`` times each way (default 3, alternating, each into fresh
stores), because a shared 2-core machine makes single runs noisy:

- ``worker``: as the worker restores: every partition at once with
  ``asyncio.gather``, under the worker's default restore budget
  (``--budget-bytes``, 64 MiB, with 32 MiB fetches: two at a time), each store
  opened to follow its changelog (vector memtables), fetches pipelined, then
  reopened to be served; timed from the first restore's start to the last
  reopen's end;
- ``before``: the same, as it was before issue 26: stores with skip-list
  memtables, one fetch at a time (``Replay(prefetch=False)``);
- ``old serial``: the restore as it was before the fast path (decode every
  entry, a ``get_many`` per batch, ``write`` with ``Change``), one partition
  after the other (``--no-old`` leaves it out).

Each store is checked afterwards: every key produced is there with its newest
entry. The table gives records, seconds, records/s, the event loop's own CPU
time (``time.thread_time``: what the restore costs this process's one thread,
RocksDB's background flushes left out) and the ratio against ``before``. The
topic is deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import platform
import pstats
import random
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from confluent_kafka import Producer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib.broker import produce_when_room
from pipeline.cli import tune_gc
from pipeline.kafka.admin import TopicSpec, ensure_topics
from pipeline.kafka.changelog import ChangelogReader
from pipeline.state import directory
from pipeline.state.decision import Entry
from pipeline.state.replay import Replay
from pipeline.state.restore import RestoreBudget, Restorer
from pipeline.state.store import Change, PartitionStore, bucket_width
from pipeline.state.store_meta import StoreIdentity

DAY_MS = 86_400_000
TTL_MS = 7 * DAY_MS  # the default topology's largest TTL
BUCKET_MS = bucket_width(TTL_MS)
REPEATS = 0.1  # the share of records that update a key already produced (a duplicate's new count)


def fill(bootstrap: str, topic: str, count: int, partitions: int) -> list[dict[bytes, bytes]]:
    """Produce ``count`` records over ``partitions`` in transactions of 50,000; return the newest value per key."""
    rng = random.Random(7)
    now = int(time.time() * 1000)
    start = now - 2 * DAY_MS
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"bench-restore-{uuid.uuid4().hex[:8]}",
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
        }
    )
    producer.init_transactions()
    newest: list[dict[bytes, bytes]] = [{} for _ in range(partitions)]
    recent: list[list[bytes]] = [[] for _ in range(partitions)]
    producer.begin_transaction()
    for i in range(count):
        partition = i % partitions
        timestamp = start + i * (2 * DAY_MS) // count
        keys = recent[partition]
        if keys and rng.random() < REPEATS:
            key = rng.choice(keys)
            old = Entry.decode(newest[partition][key])
            entry = old._replace(duplicates=old.duplicates + 1, last_seen=timestamp)
        else:
            key = f"stripe:evt_{rng.getrandbits(64):016x}".encode()
            entry = Entry(
                first_seen=timestamp,
                expires_at=timestamp + TTL_MS,
                partition=partition,
                offset=i,
                last_seen=timestamp,
                command=f"cmd-{uuid.UUID(int=rng.getrandbits(128))}",
                topic="webhooks.events",
                body_hash=f"{rng.getrandbits(64):016x}",
            )
            keys.append(key)
            if len(keys) > 1000:
                del keys[0]
        value = entry.encode()
        newest[partition][key] = value
        produce_when_room(producer, topic, value, key, partition=partition, timestamp=timestamp)
        if (i + 1) % 50_000 == 0:
            producer.commit_transaction()
            producer.begin_transaction()
    producer.commit_transaction()
    return newest


async def old_restore(store: PartitionStore, changelog: TopicPartition, *, bootstrap: str) -> int:
    """The restore before the fast path (git: pipeline/worker/restore.py before it moved to pipeline/state/), logging left out."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=8 * 1024 * 1024,
        fetch_max_bytes=32 * 1024 * 1024,
    )
    await consumer.start()
    try:
        consumer.assign([changelog])
        end = (await consumer.end_offsets([changelog]))[changelog]
        start = store.changelog_offset + 1
        if start >= end:
            return 0
        consumer.seek(changelog, start)
        applied = 0
        position = start
        while position < end:
            batch = await consumer.getmany(changelog, timeout_ms=100, max_records=5000)
            records = batch.get(changelog, [])
            position = await consumer.position(changelog)
            if not records:
                continue
            latest: dict[bytes, tuple[Entry, bytes]] = {}
            stream_time = store.stream_time
            for record in records:
                if record.key is None or record.value is None:
                    continue
                latest[record.key] = (Entry.decode(record.value), record.value)
                stream_time = max(stream_time, record.timestamp)
            previous = store.get_many(list(latest))
            changes = {key: Change(entry, previous.get(key), value) for key, (entry, value) in latest.items()}
            store.write(changes, changelog_offset=records[-1].offset, stream_time=stream_time)
            applied += len(records)
        store.expire()
        return applied
    finally:
        await consumer.stop()


def _identity(topic: str, partition: int) -> StoreIdentity:
    return StoreIdentity("bench", "bench-group", "bench.raw", partition, topic)


def open_stores(root: Path, topic: str, partitions: int, *, follow: bool = False) -> list[PartitionStore]:
    """Fresh stores, one per partition."""
    return [
        PartitionStore.open(root / f"p{p}", bucket_ms=BUCKET_MS, identity=_identity(topic, p), follow=follow)
        for p in range(partitions)
    ]


def check(stores: list[PartitionStore], newest: list[dict[bytes, bytes]]) -> None:
    """Every produced key holds its newest entry."""
    for store, expected in zip(stores, newest, strict=True):
        keys = list(expected)
        for i in range(0, len(keys), 10_000):
            chunk = keys[i : i + 10_000]
            found = store.get_many(chunk)
            for key in chunk:
                if key not in found or found[key] != Entry.decode(expected[key]):
                    raise SystemExit(f"{store.path}: key {key!r} restored wrong: {found.get(key)}")


async def run_worker(
    stores: list[PartitionStore], topic: str, bootstrap: str, fetch_bytes: int, budget_bytes: int
) -> int:
    """Every partition at once under the budget, as the worker restores them: each store opened to follow
    its changelog, then reopened to be served (``stores`` is updated in place)."""
    reader = ChangelogReader(bootstrap, fetch_bytes=max(fetch_bytes // 2, 1))
    restorer = Restorer(lambda: reader, RestoreBudget(budget_bytes), fetch_bytes=fetch_bytes)

    async def one(p: int) -> int:
        applied = await restorer.restore(stores[p], TopicPartition(topic, p))
        stores[p] = directory.reopen(stores[p], identity=_identity(topic, p), follow=False)
        return applied

    try:
        return sum(await asyncio.gather(*(one(p) for p in range(len(stores)))))
    finally:
        await restorer.close()


async def run_before(
    stores: list[PartitionStore], topic: str, bootstrap: str, fetch_bytes: int, budget_bytes: int
) -> int:
    """As before issue 26: served (skip-list) stores, one fetch at a time, under the same budget."""
    budget = RestoreBudget(budget_bytes)

    async def one(p: int) -> int:
        tp = TopicPartition(topic, p)
        async with budget.hold(fetch_bytes), ChangelogReader(bootstrap, fetch_bytes=fetch_bytes) as reader:
            end = await reader.end(tp)
            applied = await Replay(stores[p], reader, tp, prefetch=False).run(end)
        stores[p].expire()
        return applied

    return sum(await asyncio.gather(*(one(p) for p in range(len(stores)))))


async def run_serial(stores: list[PartitionStore], topic: str, bootstrap: str) -> int:
    """One partition after the other through the old path."""
    total = 0
    for p, store in enumerate(stores):
        total += await old_restore(store, TopicPartition(topic, p), bootstrap=bootstrap)
    return total


def timed(
    name: str,
    root: Path,
    topic: str,
    partitions: int,
    newest: list[dict[bytes, bytes]],
    body: Callable[[list[PartitionStore]], Coroutine[Any, Any, int]],
    profile: int,
    *,
    follow: bool = False,
) -> tuple[str, int, float, float]:
    """Run ``body`` on fresh stores, check them, and return (name, records, seconds, event loop CPU seconds)."""
    stores = open_stores(root / name.replace(" ", "-"), topic, partitions, follow=follow)
    try:
        profiler = cProfile.Profile() if profile else None
        started, cpu = time.perf_counter(), time.thread_time()
        if profiler:
            profiler.enable()
        records = asyncio.run(body(stores))
        if profiler:
            profiler.disable()
        seconds, cpu = time.perf_counter() - started, time.thread_time() - cpu
        check(stores, newest)
        if profiler:
            pstats.Stats(profiler).sort_stats("tottime").print_stats(profile)
        return name, records, seconds, cpu
    finally:
        for store in stores:
            store.close()


async def delete_topic(bootstrap: str, topic: str) -> None:
    """Remove the bench's topic."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_topics([topic])
    finally:
        await admin.close()


def main() -> None:
    """Fill a changelog, restore it both ways, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092"))
    parser.add_argument("--records", type=int, default=1_200_000)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--fetch-bytes", type=int, default=32 * 1024 * 1024)
    parser.add_argument("--budget-bytes", type=int, default=64 * 1024 * 1024)
    parser.add_argument("--repeat", type=int, default=3, help="restores each way, each into fresh stores")
    parser.add_argument("--no-old", action="store_true", help="leave the old serial path out")
    parser.add_argument("--quick", action="store_true", help="120,000 records")
    parser.add_argument(
        "--profile", type=int, default=0, help="print the top N functions of the concurrent run"
    )
    args = parser.parse_args()
    records = 120_000 if args.quick else args.records
    topic = f"bench-restore-{uuid.uuid4().hex[:8]}"
    print(f"{platform.node()}: {os.cpu_count()} cpus, python {platform.python_version()}; topic {topic}")
    asyncio.run(
        ensure_topics(
            args.bootstrap,
            [
                TopicSpec(
                    topic,
                    args.partitions,
                    1,
                    {"cleanup.policy": "compact,delete", "retention.ms": str(8 * DAY_MS)},
                )
            ],
        )
    )
    try:
        started = time.perf_counter()
        newest = fill(args.bootstrap, topic, records, args.partitions)
        print(
            f"filled {records:,} records in {time.perf_counter() - started:.1f}s "
            f"({sum(len(n) for n in newest):,} keys)"
        )
        tune_gc()  # as the worker does at start-up: the fill's million keys stay out of the collector's way
        with tempfile.TemporaryDirectory(prefix="bench-restore.") as tmp:
            root = Path(tmp)
            rows = []
            for run in range(args.repeat):
                rows.append(
                    timed(
                        f"worker {run + 1}",
                        root,
                        topic,
                        args.partitions,
                        newest,
                        lambda stores: run_worker(
                            stores, topic, args.bootstrap, args.fetch_bytes, args.budget_bytes
                        ),
                        args.profile if run == 0 else 0,
                        follow=True,
                    )
                )
                rows.append(
                    timed(
                        f"before {run + 1}",
                        root,
                        topic,
                        args.partitions,
                        newest,
                        lambda stores: run_before(
                            stores, topic, args.bootstrap, args.fetch_bytes, args.budget_bytes
                        ),
                        0,
                    )
                )
            if not args.no_old:
                rows.append(
                    timed(
                        "old serial",
                        root,
                        topic,
                        args.partitions,
                        newest,
                        lambda stores: run_serial(stores, topic, args.bootstrap),
                        0,
                    )
                )
    finally:
        asyncio.run(delete_topic(args.bootstrap, topic))
    before = sorted(n / s for name, n, s, _ in rows if name.startswith("before"))
    base = before[len(before) // 2] if before else None
    print(
        f"\n{'path':<14} {'records':>10} {'seconds':>8} {'records/s':>10} {'loop CPU s':>10} {'vs before':>9}"
    )
    for name, count, seconds, cpu in rows:
        rate = count / seconds
        ratio = f"{rate / base:.2f}x" if base else "-"
        print(f"{name:<14} {count:>10,} {seconds:>8.2f} {rate:>10,.0f} {cpu:>10.2f} {ratio:>9}")
    print("(vs before: against the median of the before rows)")
    print(f"load average after the runs: {' '.join(f'{load:.2f}' for load in os.getloadavg())}")


if __name__ == "__main__":
    main()
