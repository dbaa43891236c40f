"""``pipeline dlq list`` and ``pipeline dlq replay``: what the DLQ holds, and redriving it once the cause is fixed.

Both read the DLQ ``read_committed``, every partition, from the beginning (or
from ``--since``) up to the end it had when they started, so records that a
replay sends back to the DLQ are never read again in the same run. A replay
rebuilds each original record (key, body from ``value_base64``, headers from
``headers_base64``, else from ``headers``), adds ``replayed-from:
<dlq topic>:<partition>:<offset>`` and produces it, with an idempotent
producer (``acks=all``), to the input topic on the partition murmur2 gives its
key. The worker dedupes a replayed record like any other, so replaying twice
still makes one command.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import IO, Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from pipeline.errors import PipelineError
from pipeline.kafka.admin import partition_count
from pipeline.kafka.clients import started_producer, started_reader
from pipeline.kafka.partitioner import owner_partition
from pipeline.ops.dlq_records import (
    KEY_SHOWN,
    DlqEntry,
    DlqFilter,
    NotReplayableError,
    entry_json,
    entry_line,
    one_line,
    parse_entry,
    rebuild,
)
from pipeline.topology import Topology

Progress = Callable[[int, int, int], None]  # (offsets scanned, offsets to scan, records replayed)


# -- reading the DLQ --------------------------------------------------------------------------


@dataclass
class Scan:
    """What a pass over the DLQ saw: how many offsets it had to read and has read."""

    total: int = 0
    scanned: int = 0


async def scan(
    bootstrap: str,
    topic: str,
    flt: DlqFilter,
    state: Scan,
    *,
    on_batch: Callable[[Scan], None] | None = None,
    idle: float = 5.0,
) -> AsyncIterator[DlqEntry]:
    """The committed records of ``topic`` that ``flt`` takes, every partition, up to the end it had
    at the start; ``on_batch`` is called after each fetch (progress)."""
    count = await partition_count(bootstrap, topic)
    if count is None:
        raise PipelineError(f"topic {topic} does not exist")
    consumer = await started_reader(bootstrap)
    try:
        tps = [TopicPartition(topic, p) for p in range(count)]
        consumer.assign(tps)
        starts = await _starts(consumer, tps, flt.since_ms)
        ends = await consumer.end_offsets(tps)
        left = {tp for tp in tps if starts[tp] < ends[tp]}
        state.total = sum(max(ends[tp] - starts[tp], 0) for tp in tps)
        last = time.monotonic()
        while left and time.monotonic() - last < idle:
            batch = await consumer.getmany(*left, timeout_ms=500)
            for tp, records in batch.items():
                for record in records:
                    if record.offset >= ends[tp]:
                        break
                    state.scanned += 1
                    entry = parse_entry(
                        tp.partition, record.offset, record.timestamp, record.key, record.value
                    )
                    if flt.matches(entry):
                        yield entry
                last = time.monotonic()
            if on_batch is not None:
                on_batch(state)
            for tp in list(left):
                if await consumer.position(tp) >= ends[tp]:
                    left.discard(tp)
    finally:
        await consumer.stop()


async def _starts(
    consumer: AIOKafkaConsumer, tps: list[TopicPartition], since_ms: int | None
) -> dict[Any, int]:
    """Each partition's first offset to read: the beginning, or the first record at or after ``since_ms``."""
    await consumer.seek_to_beginning(*tps)
    if since_ms is None:
        return {tp: await consumer.position(tp) for tp in tps}
    found = await consumer.offsets_for_times(dict.fromkeys(tps, since_ms))
    ends = await consumer.end_offsets(tps)
    starts = {}
    for tp in tps:
        at = found.get(tp)
        starts[tp] = at.offset if at is not None else ends[tp]
        consumer.seek(tp, starts[tp])
    return starts


# -- the two commands -------------------------------------------------------------------------


async def list_dlq(
    bootstrap: str, topic: str, flt: DlqFilter, *, out: IO[str], as_json: bool
) -> Counter[str]:
    """Print the DLQ records ``flt`` takes, one line each; returns the count per reason."""
    counts: Counter[str] = Counter()
    async for entry in scan(bootstrap, topic, flt, Scan()):
        counts[entry.reason] += 1
        out.write((entry_json(entry).decode() if as_json else entry_line(entry)) + "\n")
    out.flush()
    return counts


@dataclass(frozen=True, slots=True)
class Replayed:
    """One DLQ record a replay sent back: where it was in the DLQ, its key, and where it went."""

    where: str  # <dlq topic>:<partition>:<offset>, as the replayed-from header and the audit say
    reason: str
    key: str | None
    partition: int  # the input partition it was produced to


@dataclass
class ReplayReport:
    """What a replay did: records replayed per reason (and each of them), and records skipped with why."""

    replayed: Counter[str] = field(default_factory=Counter)
    skipped: list[str] = field(default_factory=list)
    records: list[Replayed] = field(default_factory=list)

    @property
    def count(self) -> int:
        """Records replayed (or, in a dry run, that would be)."""
        return sum(self.replayed.values())


async def replay(
    bootstrap: str,
    topology: Topology,
    flt: DlqFilter,
    *,
    dry_run: bool,
    out: IO[str],
    progress: Progress | None = None,
) -> ReplayReport:
    """Produce the original of each DLQ record ``flt`` takes back to the input topic (see the module docstring).

    Each DLQ offset is replayed at most once per run; ``dry_run`` prints the same lines and produces nothing.
    """
    dlq, target = topology.topics.dlq, topology.topics.input
    partitions = await partition_count(bootstrap, target)
    if partitions is None:
        raise PipelineError(f"topic {target} does not exist")
    producer = None if dry_run else await started_producer(bootstrap)
    report, state = ReplayReport(), Scan()
    done: set[tuple[int, int]] = set()
    pending: list[tuple[str, asyncio.Future[Any]]] = []
    verb = "would replay" if dry_run else "replay"
    try:
        tick = None if progress is None else lambda st: progress(st.scanned, st.total, report.count)
        async for entry in scan(bootstrap, dlq, flt, state, on_batch=tick):
            where = f"{dlq}:{entry.partition}:{entry.offset}"
            if (entry.partition, entry.offset) in done:
                continue
            done.add((entry.partition, entry.offset))
            try:
                original = rebuild(entry, dlq_topic=dlq, input_topic=target)
            except NotReplayableError as exc:
                report.skipped.append(f"{where}: {exc}")
                out.write(f"skip {where} {entry.reason}: {exc}\n")
                continue
            key = original.key
            partition = owner_partition(key, partitions) if key else original.partition % partitions
            shown = one_line(key.decode("utf-8", "replace"), KEY_SHOWN) if key else "-"
            out.write(f"{verb} {where} {entry.reason} {shown} -> {target}:{partition}\n")
            if producer is not None:
                future = await producer.send(
                    target,
                    original.value,
                    key=key,
                    partition=partition,
                    headers=original.headers,
                    timestamp_ms=original.timestamp,
                )
                pending.append((where, future))
            report.replayed[entry.reason] += 1
            report.records.append(Replayed(where, entry.reason, entry.key, partition))
        await _acked(pending)
    except KafkaError as exc:
        raise PipelineError(
            f"replay stopped, Kafka at {bootstrap}: {exc} (running it again is safe)"
        ) from None
    finally:
        if producer is not None:
            await producer.stop()
    out.flush()
    return report


async def _acked(pending: list[tuple[str, asyncio.Future[Any]]]) -> None:
    """Wait for every send; the first refused names its DLQ record."""
    for where, future in pending:
        try:
            await future
        except KafkaError as exc:
            raise PipelineError(f"replay stopped: Kafka refused the record of {where}: {exc}") from None


class ProgressLine:
    """A progress line on stderr for long replays: at most every ``every`` seconds, none for short ones."""

    def __init__(self, stream: IO[str], *, every: float = 2.0) -> None:
        self.stream = stream
        self.every = every
        self._next = time.monotonic() + every
        self.shown = False

    def __call__(self, scanned: int, total: int, replayed: int) -> None:
        """Show the counts if ``every`` seconds have passed since the last line."""
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.every
        end = "\r" if self.stream.isatty() else "\n"
        percent = scanned * 100 // max(total, 1)
        self.stream.write(f"dlq: read {scanned}/{total} DLQ records ({percent}%), replayed {replayed}{end}")
        self.stream.flush()
        self.shown = True
