"""``pipeline rescale --partitions N``: raise the partition count without losing a key.

Raising the input topic's partition count changes which partition owns a key
(murmur2 of the key modulo the count), so a duplicate of an event seen before
the change would land on a partition whose store never saw it. The rescale:

1. checks that the worker group has no live member (stop the workers first:
   SIGTERM commits their open transactions, so they are drained);
2. raises the partition count of the input, changelog, audit, DLQ and command
   topics (and the effects topics) to N;
3. reads every changelog partition from the start (``read_committed``) and
   re-publishes each live entry whose owner changed to its new owner's
   changelog partition, so the new owner's store restores it;
4. records its progress in a local file, so an interrupted run resumes.

Then start the workers again. Records still produced to the old owners (by an
ingress that did not restart yet) are re-routed to the new owners by the
worker, and deduped there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import NewPartitions

from pipeline.errors import ConfigError, PipelineError
from pipeline.kafka.admin import admin_client, partition_count, topic_specs, until_served
from pipeline.kafka.partitioner import owner_partition
from pipeline.state.decision import Entry
from pipeline.topology import Topology

log = logging.getLogger(__name__)

Progress = Callable[[str], None]
ACTIVE_STATES = {"Stable", "PreparingRebalance", "CompletingRebalance"}
SERVED_TIMEOUT_S = 30.0  # for partitions just added to be served by the broker


class RescaleError(PipelineError):
    """The rescale cannot proceed (workers still running, fewer partitions asked)."""

    reason = "rescale"


async def group_members(bootstrap: str, group: str) -> int:
    """How many live members the consumer group has."""
    async with admin_client(bootstrap) as admin:
        [response] = await admin.describe_consumer_groups([group])
    for _error, group_id, state, _protocol_type, _protocol, members, *_ in response.groups:
        if group_id == group and state in ACTIVE_STATES:
            return len(members)
    return 0


async def rescale(
    bootstrap: str,
    topology: Topology,
    *,
    partitions: int,
    group: str,
    state_file: Path,
    progress: Progress = print,
) -> int:
    """Raise every topic to ``partitions`` and move changelog entries to their new owners.

    Returns the number of entries re-published. Safe to run again after an
    interruption: finished changelog partitions are skipped.
    """
    members = await group_members(bootstrap, group)
    if members:
        raise RescaleError(
            f"group {group} still has {members} live worker(s): stop them first (SIGTERM drains)"
        )
    current = await partition_count(bootstrap, topology.topics.input)
    if current is None:
        raise ConfigError(f"topic {topology.topics.input} does not exist: run 'pipeline topics create' first")
    done = _load(state_file)
    old = int(done.get("from", [current])[0])
    if partitions < old:
        raise RescaleError(
            f"Kafka cannot remove partitions: {topology.topics.input} has {old}, asked {partitions}"
        )
    done["from"] = [old]
    _save(state_file, done)

    await _raise_partitions(bootstrap, topology, partitions, progress)
    changelogs = [topology.topics.changelog] + (
        [topology.topics.effects_changelog] if topology.has_effects else []
    )
    moved = 0
    for changelog in changelogs:
        for partition in range(old):
            if partition in done.get(changelog, []):
                progress(f"  {changelog}[{partition}] already moved")
                continue
            moved += await _move_partition(
                bootstrap, TopicPartition(changelog, partition), partitions, progress
            )
            done.setdefault(changelog, []).append(partition)
            _save(state_file, done)
    _clear(state_file)
    progress(f"rescaled {topology.topics.input} from {old} to {partitions} partitions; {moved} keys moved")
    return moved


def _load(path: Path) -> dict[str, list[int]]:
    """The progress of an interrupted rescale, if any (a small local file)."""
    return dict(orjson.loads(path.read_bytes())) if path.exists() else {}


def _clear(path: Path) -> None:
    path.unlink(missing_ok=True)


def _save(path: Path, done: dict[str, list[int]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(orjson.dumps(done))
    tmp.replace(path)


async def _raise_partitions(bootstrap: str, topology: Topology, partitions: int, progress: Progress) -> None:
    specs = topic_specs(topology, partitions)
    async with admin_client(bootstrap) as admin:
        for spec in specs:
            count = await partition_count(bootstrap, spec.name)
            if count is None:
                raise ConfigError(f"topic {spec.name} does not exist: run 'pipeline topics create' first")
            if count >= partitions:
                progress(f"  {spec.name}: {count} partitions, nothing to do")
                continue
            await admin.create_partitions({spec.name: NewPartitions(total_count=partitions)})
            # before any entry is moved there: a producer that does not know a partition yet refuses it
            await until_served(admin, {spec.name: partitions}, timeout=SERVED_TIMEOUT_S)
            progress(f"  {spec.name}: {count} -> {partitions} partitions")


async def _move_partition(bootstrap: str, tp: TopicPartition, partitions: int, progress: Progress) -> int:
    """Re-publish the entries of one old changelog partition whose owner changed."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level="read_committed"
    )
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=20
    )
    await consumer.start()
    await producer.start()
    latest: dict[bytes, tuple[bytes, int]] = {}
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        started = time.monotonic()
        while await consumer.position(tp) < end:
            batch = await consumer.getmany(tp, timeout_ms=200, max_records=5000)
            for record in batch.get(tp, []):
                if record.key is not None and record.value is not None:
                    latest[record.key] = (record.value, record.timestamp)
        moved = 0
        futures = []
        for key, (value, timestamp) in latest.items():
            target = owner_partition(key, partitions)
            if target == tp.partition:
                continue
            Entry.decode(value)  # never move something that is not an entry
            futures.append(
                await producer.send(tp.topic, value, key=key, partition=target, timestamp_ms=timestamp)
            )
            moved += 1
        for future in futures:
            await future
        progress(
            f"  {tp.topic}[{tp.partition}]: {len(latest)} keys read, {moved} moved "
            f"({time.monotonic() - started:.1f}s)"
        )
        return moved
    finally:
        await producer.stop()
        await consumer.stop()
