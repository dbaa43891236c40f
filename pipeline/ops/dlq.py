"""``pipeline dlq list`` and ``pipeline dlq replay``: what the DLQ holds, and redriving it once the cause is fixed.

Both read the DLQ ``read_committed``, every partition, from the beginning (or
from ``--since``) up to the end it had when they started, so records that a
replay sends back to the DLQ are never read again in the same run; through
broker outages, or failing with how far each partition got
(:func:`pipeline.kafka.bounded_read.read_to_end`), never stopping short at a silence. A replay
rebuilds each original record (key, body from ``value_base64``, headers from
``headers_base64``, else from ``headers``), adds ``replayed-from:
<dlq topic>:<partition>:<offset>`` and produces it, with an idempotent
producer (``acks=all``), to the input topic on the partition murmur2 gives its
key; a record the effect stage dead-lettered goes back to the effects topic,
keyed by its effect key with its headers. The worker dedupes a replayed record
like any other (by event key, or by effect key), so replaying twice still makes
one command.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import IO, Any

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from pipeline.errors import PipelineError
from pipeline.kafka.admin import partition_count
from pipeline.kafka.bounded_read import Bounds, ReadIncompleteError, read_to_end
from pipeline.kafka.clients import started_producer, started_reader
from pipeline.kafka.partitioner import owner_partition
from pipeline.kafka.settings import READ_TIMEOUT_S
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
    timeout: float = READ_TIMEOUT_S,
) -> AsyncGenerator[DlqEntry, None]:
    """The committed records of ``topic`` that ``flt`` takes, every partition, up to the end it had
    at the start (:func:`~pipeline.kafka.bounded_read.read_to_end`: raises
    :class:`~pipeline.kafka.bounded_read.ReadIncompleteError` when it cannot get there);
    ``on_batch`` is called after each fetch (progress)."""
    count = await partition_count(bootstrap, topic)
    if count is None:
        raise PipelineError(f"topic {topic} does not exist")
    bounds = Bounds()
    tps = [TopicPartition(topic, p) for p in range(count)]
    reading = read_to_end(
        lambda: started_reader(bootstrap), tps, bounds, since_ms=flt.since_ms, timeout=timeout
    )
    async with aclosing(reading):
        async for records in reading:
            state.total, state.scanned = bounds.total, bounds.read
            for record in records:
                entry = parse_entry(
                    record.partition, record.offset, record.timestamp, record.key, record.value
                )
                if flt.matches(entry):
                    yield entry
            if on_batch is not None:
                on_batch(state)
    state.total, state.scanned = bounds.total, bounds.read


# -- the two commands -------------------------------------------------------------------------


async def list_dlq(
    bootstrap: str,
    topic: str,
    flt: DlqFilter,
    *,
    out: IO[str],
    as_json: bool,
    timeout: float = READ_TIMEOUT_S,
) -> Counter[str]:
    """Print the DLQ records ``flt`` takes, one line each; returns the count per reason.

    Raises :class:`PipelineError` (one line) when the DLQ cannot be read to its end.
    """
    counts: Counter[str] = Counter()
    entries = scan(bootstrap, topic, flt, Scan(), timeout=timeout)
    try:
        async with aclosing(entries):
            async for entry in entries:
                counts[entry.reason] += 1
                out.write((entry_json(entry).decode() if as_json else entry_line(entry)) + "\n")
    except ReadIncompleteError as exc:
        out.flush()
        raise PipelineError(
            f"dlq list stopped: {exc}; the {counts.total()} records listed are not all"
        ) from None
    out.flush()
    return counts


@dataclass(frozen=True, slots=True)
class Replayed:
    """One DLQ record a replay sent back: where it was in the DLQ, its key, and where it went."""

    where: str  # <dlq topic>:<partition>:<offset>, as the replayed-from header and the audit say
    reason: str
    key: str | None
    partition: int  # the partition it was produced to
    topic: (
        str  # the topic it was produced to: the input topic, or the effects topic for an effect-stage record
    )


@dataclass
class ReplayReport:
    """What a replay did: records replayed per reason (and each of them), and records skipped with why."""

    replayed: Counter[str] = field(default_factory=Counter)
    skipped: list[str] = field(default_factory=list)
    records: list[Replayed] = field(default_factory=list)
    topics: Counter[str] = field(default_factory=Counter)  # records replayed per topic they went to

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
    timeout: float = READ_TIMEOUT_S,
) -> ReplayReport:
    """Produce the original of each DLQ record ``flt`` takes back where it came from: the input topic, or the
    effects topic (see the module docstring).

    Each DLQ offset is replayed at most once per run; ``dry_run`` prints the same lines and produces nothing.
    Returns only once every DLQ partition was read to its end and every record sent was acknowledged;
    otherwise raises :class:`PipelineError` (one line) saying how far it got and how many records it
    replayed (``timeout``: the longest the read waits without moving, as ``read_to_end``).
    """
    dlq, effects = topology.topics.dlq, topology.topics.effects
    counts = _PartitionCounts(bootstrap)
    await counts.of(topology.topics.input, required=True)
    producer = None if dry_run else await started_producer(bootstrap)
    report, state = ReplayReport(), Scan()
    done: set[tuple[int, int]] = set()
    pending: list[tuple[str, asyncio.Future[Any]]] = []
    verb = "would replay" if dry_run else "replay"
    try:
        tick = None if progress is None else lambda st: progress(st.scanned, st.total, report.count)
        entries = scan(bootstrap, dlq, flt, state, on_batch=tick, timeout=timeout)
        async with aclosing(entries):
            async for entry in entries:
                where = f"{dlq}:{entry.partition}:{entry.offset}"
                if (entry.partition, entry.offset) in done:
                    continue
                done.add((entry.partition, entry.offset))
                try:
                    original = rebuild(
                        entry, dlq_topic=dlq, input_topic=topology.topics.input, effects_topic=effects
                    )
                    partitions = await counts.of(original.topic)
                except NotReplayableError as exc:
                    report.skipped.append(f"{where}: {exc}")
                    out.write(f"skip {where} {entry.reason}: {exc}\n")
                    continue
                key, target = original.key, original.topic
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
                report.topics[target] += 1
                report.records.append(Replayed(where, entry.reason, entry.key, partition, target))
        await _acked(pending)
    except ReadIncompleteError as exc:
        raise _stopped(str(exc), await _settled(pending)) from None
    except KafkaError as exc:
        raise _stopped(f"Kafka at {bootstrap}: {exc}", await _settled(pending)) from None
    finally:
        if producer is not None:
            await producer.stop()
    out.flush()
    return report


class _PartitionCounts:
    """The partition count of each topic a replay produces to, asked once each."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self._counts: dict[str, int | None] = {}

    async def of(self, topic: str, *, required: bool = False) -> int:
        """``topic``'s partition count; a missing topic is a PipelineError when ``required``, else
        NotReplayableError (its records are skipped)."""
        if topic not in self._counts:
            self._counts[topic] = await partition_count(self.bootstrap, topic)
        count = self._counts[topic]
        if count is None:
            if required:
                raise PipelineError(f"topic {topic} does not exist")
            raise NotReplayableError(f"it goes back to {topic}, which does not exist")
        return count


async def _acked(pending: list[tuple[str, asyncio.Future[Any]]]) -> None:
    """Wait for every send; the first refused names its DLQ record, and the error how many were acknowledged."""
    sent = await _settled(pending)
    for where, future in pending:
        exc = future.exception()
        if exc is not None:
            raise _stopped(f"Kafka refused the record of {where}: {exc}", sent) from None


def _stopped(why: str, sent: int) -> PipelineError:
    """The one line of a replay that stopped before its end: why, and how many records it replayed."""
    return PipelineError(
        f"replay stopped: {why}; {sent} records replayed so far "
        "(running it again is safe: the worker dedupes replays)"
    )


async def _settled(pending: list[tuple[str, asyncio.Future[Any]]]) -> int:
    """Wait for every send to end, acknowledged or not; the number acknowledged."""
    results = await asyncio.gather(*(future for _, future in pending), return_exceptions=True)
    return sum(not isinstance(result, BaseException) for result in results)


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
