"""The worker's per-record CPU without a broker: classify, decide, encode, stage, write the store.

    .venv/bin/python bench/hotpath.py                  # 60,000 records, prints µs per record
    .venv/bin/python bench/hotpath.py --profile 30     # plus the top 30 functions (cProfile)

It feeds ``bench/worker_bench.py``'s workload (1-2 KB Stripe-like bodies, 30%
duplicates) as aiokafka ``ConsumerRecord`` objects through the real
``EventStage`` and ``PartitionTransaction`` of one partition, into
aiokafka's real ``BatchBuilder`` (the records are encoded exactly as they
would be sent) and a real RocksDB store in a temporary directory. Only the
network is missing: aiokafka's producer is a stand-in (under the real ``TransactionalProducer``) whose ``send_batch`` resolves at
once. This is the part of the worker's CPU that is ours (the rest is aiokafka's
fetch and send), measured in seconds per run instead of minutes, so a change to
the hot path can be judged before the full benchmark. Not a test: it asserts
only that every record was handled and each unique key got one command.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from aiokafka import TopicPartition
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.structs import ConsumerRecord

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: bench.lib
from bench.lib.topology_file import write_topology
from bench.lib.workload import make_stream, source_headers
from pipeline.cli import tune_gc
from pipeline.kafka.partitioner import KeyPartitioner
from pipeline.kafka.requests import GroupMetadata
from pipeline.kafka.transactional import TransactionalProducer
from pipeline.state.partition_transaction import PartitionTransaction
from pipeline.state.store import PartitionStore, bucket_width
from pipeline.state.transaction import Transaction
from pipeline.topology import load
from pipeline.worker.classify import Classifier
from pipeline.worker.emitter import OutputTopics
from pipeline.worker.event_stage import EventStage

PARTITIONS = 4
BATCH = 2000


class _Sent:
    def __init__(self, offset: int) -> None:
        self.offset = offset


async def _offsets(producer: Any, offsets: Any, group: GroupMetadata) -> None:
    await producer.send_offsets_to_transaction(offsets, group.group_id)


class StandInProducer:
    """aiokafka's transaction calls, with sends that succeed at once (under the real ``TransactionalProducer``)."""

    def __init__(self) -> None:
        self.records = 0
        self.offsets: dict[tuple[str, int], int] = {}

    async def begin_transaction(self) -> None:
        return None

    async def send_batch(self, batch: BatchBuilder, topic: str, *, partition: int) -> asyncio.Future[Any]:
        count = batch.record_count()
        batch.close()
        batch._builder.build()
        self.records += count
        base = self.offsets.get((topic, partition), 0)
        self.offsets[(topic, partition)] = base + count
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.set_result(_Sent(base))
        return future

    async def send_offsets_to_transaction(self, offsets: Any, group: str) -> None:  # noqa: ARG002
        return None

    async def commit_transaction(self) -> None:
        return None


def build_records(topic: str, events: int, seed: int) -> list[ConsumerRecord[bytes, bytes]]:
    """The workload's records that land on partition 0 of ``topic`` (as the worker would fetch them)."""
    rng = random.Random(seed)
    stream = make_stream(rng, events * PARTITIONS, 0.3, min_size=1000, max_size=2000)
    partitioner = KeyPartitioner()
    now = int(time.time() * 1000)
    headers = tuple(source_headers(now))
    records: list[ConsumerRecord[bytes, bytes]] = []
    for key, body in stream.records():
        if partitioner(key, PARTITIONS) != 0:
            continue
        offset = len(records)
        records.append(
            ConsumerRecord(topic, 0, offset, now + offset, 0, key, body, None, len(key), len(body), headers)
        )
        if len(records) == events:
            break
    return records


async def run(records: list[ConsumerRecord[bytes, bytes]], topology_path: Path, state: Path) -> float:
    topology = load(topology_path)
    topics = topology.topics
    counts = dict.fromkeys(
        (topics.input, topics.audit, topics.dlq, topics.changelog, topics.commands), PARTITIONS
    )
    partitioner = KeyPartitioner()
    outputs = OutputTopics(counts, partitioner, {})
    classifier = Classifier(topology, partitioner, input_partitions=PARTITIONS)
    tp = TopicPartition(topics.input, 0)
    store = PartitionStore.open(state, bucket_ms=bucket_width(7 * 86_400_000))
    producer = StandInProducer()
    txn = Transaction(
        TransactionalProducer(producer, "hotpath", send_offsets=_offsets),
        group=lambda: GroupMetadata("hotpath", 1, "member", None),
    )
    checkpoint = PartitionTransaction(
        tp=tp, txn=txn, store=store, changelog=TopicPartition(topics.changelog, 0)
    )
    processor = EventStage(tp=tp, topology=topology, classifier=classifier, txn=checkpoint, outputs=outputs)
    started = time.process_time()
    for start in range(0, len(records), BATCH):
        await processor.handle(records[start : start + BATCH], {})
        await txn.commit()
    elapsed = time.process_time() - started
    store.close()
    unique = len({r.key for r in records})
    commands = sum(n for (topic, _), n in producer.offsets.items() if topic == topics.commands)
    if commands != unique:
        raise SystemExit(f"expected {unique} commands, got {commands}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=60_000)
    parser.add_argument("--seed", type=int, default=20241130)
    parser.add_argument("--repeat", type=int, default=3, help="runs; the best is reported")
    parser.add_argument("--profile", type=int, default=0, help="print this many functions by own time")
    parser.add_argument("--default-gc", action="store_true", help="leave the GC as Python sets it")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hotpath-") as work:
        topology_path = write_topology(Path(work) / "topology.toml", "hotpath", PARTITIONS)
        records = build_records("hotpath.raw", args.events, args.seed)
        if not args.default_gc:
            tune_gc()  # as `pipeline worker` does once it has started
        best = float("inf")
        for n in range(args.repeat):
            state = Path(work) / f"state-{n}"
            if args.profile and n == args.repeat - 1:
                profiler = cProfile.Profile()
                profiler.enable()
                asyncio.run(run(records, topology_path, state))
                profiler.disable()
                pstats.Stats(profiler).sort_stats("tottime").print_stats(args.profile)
            else:
                best = min(best, asyncio.run(run(records, topology_path, state)))
        print(
            f"{len(records):,} records, best of {args.repeat}: {best / len(records) * 1e6:.1f} µs CPU per record"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
