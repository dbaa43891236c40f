"""Bench only: ``pipeline worker`` with in-process patches that model the fixes the profile suggests.

    python bench/worker_whatif.py worker --bootstrap ... (the same arguments as ``pipeline worker``)

Nothing in ``pipeline/`` changes: this wrapper replaces a few functions at
start-up, then runs the normal command line. It exists to measure how much
each suggested fix would buy (``bench/worker_bench.py --only worker,worker-whatif``)
before anyone changes the worker. ``WORKER_WHATIF`` picks the patches
(comma-separated; ``worker_bench.py --whatif`` passes its own list):

- ``partition``: one murmur2 per key instead of three (the owner check in
  ``Classifier._classify`` and ``OutputTopics.partition_for`` for the command
  and the audit topic each hash the same key with aiokafka's pure-Python
  murmur2); modelled with a memo, the fix is to hash once per record and
  reuse ``hash % partitions`` for every topic;
- ``json``: parse each body once (``Classifier._classify`` parses it with
  ``parse_json_object`` and ``Preset.event_type`` -> ``BodyType.extract``
  parses it again); modelled by reusing the last parse of the same bytes;
- ``metrics``: resolve the Prometheus child counter once per (source,
  outcome) instead of calling ``Counter.labels`` for every record
  (``Worker._count``);
- ``murmur``: a faster pure-Python murmur2 (all 4-byte words unpacked by one
  ``struct.unpack_from``, fewer masks): the same hashes, about 1.8x faster
  than ``aiokafka.partitioner.murmur2``;
- ``gc``: freeze the start-up heap and raise the generation-0 threshold, so
  the objects of a batch in flight are not rescanned by the cyclic GC
  hundreds of times per second;
- ``commit``: do not stop the loop while transactions commit. ``Worker.run``
  awaits ``_commit_due`` (flush, AddOffsetsToTxn, TxnOffsetCommit, EndTxn:
  about 20 ms) after every ``getmany``, so the loop idles once per batch;
  here each due partition commits in its own task (the partition lock keeps
  its next batch waiting) while the loop goes on with the other partitions.
  Throughput model only: a real fix must also make a failed commit's seek
  discard records that were fetched before it (see the benchmark notes).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import os
import struct
import sys
from typing import Any

from pipeline import cli
from pipeline.kafka import owner_partition
from pipeline.kafka import partitioner as pipeline_kafka
from pipeline.providers import _body
from pipeline.worker import classify, metrics
from pipeline.worker import loop as worker

PATCHES = frozenset(
    p.strip()
    for p in (os.environ.get("WORKER_WHATIF") or "murmur,partition,json,metrics,gc,commit").split(",")
    if p.strip()
)


def murmur2_fast(data: bytes) -> int:
    """Kafka's murmur2 (``org.apache.kafka.common.utils.Utils.murmur2``), as an unsigned 32-bit int."""
    length = len(data)
    m = 0x5BD1E995
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    words = length >> 2
    for word in struct.unpack_from(f"<{words}I", data):
        k = (word * m) & 0xFFFFFFFF
        k ^= k >> 24
        h = ((h * m) & 0xFFFFFFFF) ^ ((k * m) & 0xFFFFFFFF)
    tail = length & 3
    if tail:
        i = words << 2
        if tail >= 3:
            h ^= data[i + 2] << 16
        if tail >= 2:
            h ^= data[i + 1] << 8
        h ^= data[i]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def _patch_partition() -> None:
    worker.owner_partition = functools.lru_cache(maxsize=1 << 16)(owner_partition)  # type: ignore[attr-defined]


def _patch_json() -> None:
    last: list[Any] = [None, None]  # (the body bytes object, its parse): identity, never equality
    parse_object, parse_json_object = _body.parse_object, classify.parse_json_object  # type: ignore[attr-defined]

    def parse_json_object_once(body: bytes) -> dict[str, Any] | None:
        if body is last[0]:
            return last[1]  # type: ignore[no-any-return]
        value: dict[str, Any] | None = parse_json_object(body)
        last[0], last[1] = body, value
        return value

    def parse_object_once(body: bytes, provider: str) -> dict[str, Any]:
        if body is last[0] and last[1] is not None:
            return last[1]  # type: ignore[no-any-return]
        value = parse_object(body, provider)
        last[0], last[1] = body, value
        return value

    classify.parse_json_object = parse_json_object_once  # type: ignore[attr-defined]
    _body.parse_object = parse_object_once


def _patch_metrics() -> None:
    children: dict[tuple[int, str, str], Any] = {}

    def outcome(self: metrics.WorkerMetrics, source: str | None, outcome: str) -> None:
        slot = (id(self.events), source or "unknown", outcome)
        child = children.get(slot)
        if child is None:
            child = children[slot] = self.events.labels(source or "unknown", outcome)
        child.inc()

    def command(self: metrics.WorkerMetrics, topic: str) -> None:
        slot = (id(self.commands), topic, "")
        child = children.get(slot)
        if child is None:
            child = children[slot] = self.commands.labels(topic)
        child.inc()

    metrics.WorkerMetrics.outcome = outcome  # type: ignore[method-assign]
    metrics.WorkerMetrics.command = command  # type: ignore[method-assign]


def _patch_commit() -> None:
    async def run(self: worker.Worker) -> None:
        consumer = self._require(self._consumer)
        interval, size = self.settings.commit_interval, self.settings.max_batch
        committing: dict[Any, asyncio.Task[None]] = {}
        try:
            while not self._stopping.is_set():
                batches = await consumer.getmany(timeout_ms=int(interval * 500), max_records=size)
                for tp, records in batches.items():
                    await self._handle(tp, records)
                for tp, part in list(self._partitions.items()):
                    task = committing.get(tp)
                    if (task is None or task.done()) and part.checkpoint.due(
                        interval=interval, max_records=size
                    ):
                        committing[tp] = asyncio.create_task(self._commit(part))
        finally:
            await asyncio.gather(*committing.values(), return_exceptions=True)
            await self._shutdown()

    worker.Worker.run = run  # type: ignore[method-assign]


def _patch_murmur() -> None:
    pipeline_kafka.murmur2 = murmur2_fast  # type: ignore[attr-defined]


def _patch_gc() -> None:
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)


_PATCHERS = {
    "murmur": _patch_murmur,
    "partition": _patch_partition,
    "json": _patch_json,
    "metrics": _patch_metrics,
    "commit": _patch_commit,
    "gc": _patch_gc,
}


def main() -> int:
    applied = []
    for name in sorted(PATCHES):
        patcher = _PATCHERS.get(name)
        if patcher is None:
            print(f"worker_whatif: unknown patch {name!r}", file=sys.stderr)
            return 2
        try:
            patcher()
        except AttributeError as exc:  # the worker moved on: say so rather than measure nothing
            print(f"worker_whatif: patch {name!r} no longer applies: {exc}", file=sys.stderr, flush=True)
        else:
            applied.append(name)
    print(f"worker_whatif: patches {applied}", file=sys.stderr, flush=True)
    return cli.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
