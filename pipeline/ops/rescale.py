"""``pipeline rescale --partitions N``: raise the partition count without losing a key.

Raising the input topic's partition count changes which partition owns a key
(murmur2 of the key modulo the count), so a duplicate of an event seen before
the change would land on a partition whose store never saw it. The rescale:

1. checks that the worker group has no live member (stop the workers first:
   SIGTERM commits their open transactions, so they are drained);
2. raises the changelog topics to N partitions (a worker started from here on
   refuses to run: its changelog and input counts differ);
3. waits for any open transaction on an old changelog partition to end, reads
   every old changelog partition from the start (``read_committed``) and
   re-publishes each live entry whose owner changed to its new owner's
   changelog partition, so the new owner's store restores it (with its
   ``last_seen`` cleared: a partition's stream time stays its own);
4. checks that nothing wrote to the old changelog partitions meanwhile and that
   the group is still empty (else it forgets the moves and fails: run it again);
5. raises the other topics to N, the input topic last;
6. records its progress in a local file, so an interrupted run resumes.

The input topic grows only once every entry has moved, so a worker never
serves a new partition whose changelog still lacks its entries. Then start
the workers again. Records still produced to the old owners (by an ingress
that did not restart yet) are re-routed to the new owners by the worker, and
deduped there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import NewPartitions
from aiokafka.errors import KafkaError

from pipeline.errors import BrokerUnavailableError, ConfigError, PipelineError
from pipeline.kafka.admin import (
    admin_client,
    describe_topic_configs,
    partition_count,
    topic_specs,
    until_served,
)
from pipeline.kafka.internals import stop_consumer
from pipeline.kafka.partitioner import owner_partition
from pipeline.kafka.settings import MAX_MESSAGE_BYTES
from pipeline.state.decision import Entry
from pipeline.topology import Topology

log = logging.getLogger(__name__)

Progress = Callable[[str], None]
ACTIVE_STATES = {"Stable", "PreparingRebalance", "CompletingRebalance"}
SERVED_TIMEOUT_S = 30.0  # for partitions just added to be served by the broker
OPEN_TRANSACTION_TIMEOUT_S = 60.0  # for a transaction left on a changelog partition to end
OPEN_TRANSACTION_POLL_S = 1.0


class RescaleError(PipelineError):
    """The rescale cannot proceed (workers still running, fewer partitions asked, a step failed)."""

    reason = "rescale"


async def group_members(bootstrap: str, group: str) -> int:
    """How many live members the consumer group has."""
    async with admin_client(bootstrap) as admin:
        [response] = await admin.describe_consumer_groups([group])
    for _error, group_id, state, _protocol_type, _protocol, members, *_ in response.groups:
        if group_id == group and state in ACTIVE_STATES:
            return len(members)
    return 0


async def _require_no_members(bootstrap: str, group: str, when: str) -> None:
    members = await group_members(bootstrap, group)
    if members:
        raise RescaleError(f"group {group} {when} {members} live worker(s): stop them first (SIGTERM drains)")


async def rescale(
    bootstrap: str,
    topology: Topology,
    *,
    partitions: int,
    group: str,
    state_file: Path,
    progress: Progress = print,
    open_transaction_timeout: float = OPEN_TRANSACTION_TIMEOUT_S,
) -> int:
    """Raise every topic to ``partitions`` and move changelog entries to their new owners.

    Returns the number of entries re-published. Safe to run again after an
    interruption: finished changelog partitions are skipped. A Kafka error on
    the way, or the broker lost, is a :class:`RescaleError` (run it again), and so is a transaction
    still open on a changelog partition after ``open_transaction_timeout`` seconds.
    """
    try:
        return await _rescale(
            bootstrap, topology, partitions, group, state_file, progress, open_transaction_timeout
        )
    except KafkaError as exc:
        raise RescaleError(
            f"the rescale stopped on a Kafka error ({exc!r}): run it again, it resumes"
        ) from exc
    except BrokerUnavailableError as exc:  # the broker went away partway: some topics may be raised already
        raise RescaleError(f"the rescale stopped: {exc}: run it again, it resumes") from exc


async def _rescale(
    bootstrap: str,
    topology: Topology,
    partitions: int,
    group: str,
    state_file: Path,
    progress: Progress,
    open_transaction_timeout: float,
) -> int:
    await _require_no_members(bootstrap, group, "still has")
    current = await partition_count(bootstrap, topology.topics.input)
    if current is None:
        raise ConfigError(f"topic {topology.topics.input} does not exist: run 'pipeline topics create' first")
    done = _load(state_file, current)
    old = done.started
    if partitions < old:
        raise RescaleError(
            f"Kafka cannot remove partitions: {topology.topics.input} has {old}, asked {partitions}"
        )
    _save(state_file, done)

    changelogs = [topology.topics.changelog] + (
        [topology.topics.effects_changelog] if topology.has_effects else []
    )
    moved = 0
    if current > old:  # an earlier run raised the input: its moves had passed their check
        if not done.all_read(changelogs):
            raise RescaleError(
                f"{topology.topics.input} has {current} partitions, but the entries of its {old} were not all "
                "moved: was it raised by another tool? Delete the state file to move them again"
            )
        progress(f"  {topology.topics.input} has {current} partitions: the entries moved in an earlier run")
    else:
        moved = await _move_entries(
            bootstrap, changelogs, partitions, group, state_file, done, progress, open_transaction_timeout
        )
    rest = [spec.name for spec in topic_specs(topology, partitions) if spec.name not in changelogs]
    rest.remove(topology.topics.input)
    await _raise_partitions(bootstrap, rest, partitions, progress)
    await _raise_partitions(bootstrap, [topology.topics.input], partitions, progress)
    _clear(state_file)
    progress(f"rescaled {topology.topics.input} from {old} to {partitions} partitions; {moved} keys moved")
    return moved


async def _move_entries(
    bootstrap: str,
    changelogs: list[str],
    partitions: int,
    group: str,
    state_file: Path,
    done: Done,
    progress: Progress,
    open_transaction_timeout: float,
) -> int:
    """Raise the changelogs, move every entry whose owner changed, and check nothing else wrote meanwhile."""
    await _raise_partitions(bootstrap, changelogs, partitions, progress)
    old = done.started
    moved = 0
    for changelog in changelogs:
        limit = await _record_limit(bootstrap, changelog)
        for partition in range(old):
            if done.was_read(changelog, partition):
                progress(f"  {changelog}[{partition}] already moved")
                continue
            end, targets = await _move_partition(
                bootstrap,
                TopicPartition(changelog, partition),
                partitions,
                progress,
                limit,
                open_transaction_timeout,
            )
            done.read(changelog, partition, end)
            for target, count in targets.items():
                done.wrote(changelog, target, count)
                moved += count
            _save(state_file, done)
    await _check_untouched(bootstrap, group, state_file, done)
    return moved


async def _check_untouched(bootstrap: str, group: str, state_file: Path, done: Done) -> None:
    """Nothing joined the group and nothing but the rescale wrote to an old changelog partition since its
    entries were read: else a claim written after the read would stay on the old owner. Forgets the moves
    then."""
    expected = done.expected_ends()
    ends = await _high_watermarks(bootstrap, list(expected))
    written = sorted(f"{tp.topic}[{tp.partition}]" for tp, end in expected.items() if ends[tp] != end)
    members = await group_members(bootstrap, group)
    if written or members:
        done.forget_moves()
        _save(state_file, done)
        why = f"{', '.join(written)} written" if written else f"{members} worker(s) joined group {group}"
        raise RescaleError(
            f"{why} while the rescale ran: stop every worker and run the rescale again "
            "(it moves the entries again; no topic past the changelogs was raised)"
        )


Offsets = dict[str, dict[str, int]]  # changelog -> partition (as text) -> an offset or a count


@dataclass(slots=True)
class Done:
    """An interrupted rescale's progress, kept in a small local file: where each old changelog partition
    was read to, and how many entries the rescale itself wrote to each partition after it was read."""

    started: int  # the input's partition count before the rescale began
    ends: Offsets = field(default_factory=dict)
    written: Offsets = field(default_factory=dict)

    def all_read(self, changelogs: Sequence[str]) -> bool:
        """Whether every old partition of ``changelogs`` was read (and its entries moved)."""
        return all(self.was_read(name, p) for name in changelogs for p in range(self.started))

    def was_read(self, changelog: str, partition: int) -> bool:
        return str(partition) in self.ends.get(changelog, {})

    def read(self, changelog: str, partition: int, end: int) -> None:
        self.ends.setdefault(changelog, {})[str(partition)] = end

    def wrote(self, changelog: str, partition: int, count: int) -> None:
        """``count`` entries moved to ``partition``: counted against its end if it was read already."""
        if self.was_read(changelog, partition):
            counts = self.written.setdefault(changelog, {})
            counts[str(partition)] = counts.get(str(partition), 0) + count

    def expected_ends(self) -> dict[TopicPartition, int]:
        """Where each partition read must end if only the rescale wrote to it since."""
        return {
            TopicPartition(name, int(p)): end + self.written.get(name, {}).get(p, 0)
            for name, ends in self.ends.items()
            for p, end in ends.items()
        }

    def forget_moves(self) -> None:
        self.ends.clear()
        self.written.clear()


def _load(path: Path, current: int) -> Done:
    """The progress of an interrupted rescale, or a fresh one from ``current`` partitions."""
    if not path.exists():
        return Done(current)
    saved = orjson.loads(path.read_bytes())
    started = saved.get("from", current)
    if isinstance(started, list):  # the earlier format, whose moves were not checked: do them again
        return Done(int(started[0]))
    return Done(int(started), _offsets(saved.get("ends", {})), _offsets(saved.get("written", {})))


def _offsets(saved: dict[str, dict[str, int]]) -> Offsets:
    return {name: {p: int(n) for p, n in by_partition.items()} for name, by_partition in saved.items()}


def _clear(path: Path) -> None:
    path.unlink(missing_ok=True)


def _save(path: Path, done: Done) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(orjson.dumps({"from": done.started, "ends": done.ends, "written": done.written}))
    tmp.replace(path)


async def _raise_partitions(
    bootstrap: str, names: Sequence[str], partitions: int, progress: Progress
) -> None:
    """Raise the topics ``names``, in that order, to ``partitions`` (each served before the next)."""
    async with admin_client(bootstrap) as admin:
        for name in names:
            count = await partition_count(bootstrap, name)
            if count is None:
                raise ConfigError(f"topic {name} does not exist: run 'pipeline topics create' first")
            if count >= partitions:
                progress(f"  {name}: {count} partitions, nothing to do")
                continue
            await admin.create_partitions({name: NewPartitions(total_count=partitions)})
            # before any entry is moved there: a producer that does not know a partition yet refuses it
            await until_served(admin, {name: partitions}, timeout=SERVED_TIMEOUT_S)
            progress(f"  {name}: {count} -> {partitions} partitions")


async def _record_limit(bootstrap: str, topic: str) -> int:
    """The largest record batch ``topic`` takes (its ``max.message.bytes``, at most the producers' own)."""
    raw = (await describe_topic_configs(bootstrap, [topic])).get(topic, {}).get("max.message.bytes", "")
    return min(int(raw), MAX_MESSAGE_BYTES) if raw.isdigit() else MAX_MESSAGE_BYTES


async def _high_watermarks(bootstrap: str, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
    """The end of each partition, open transactions included (``read_uncommitted``)."""
    if not tps:
        return {}
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        return dict(await consumer.end_offsets(tps))
    finally:
        await stop_consumer(consumer)  # aiokafka lets a CancelledError out when the broker is away


async def _settled_end(consumer: AIOKafkaConsumer, bootstrap: str, tp: TopicPartition, timeout: float) -> int:
    """The partition's end once no transaction is open on it (the last stable offset ``consumer``, reading
    committed, gives reached the end), waiting up to ``timeout`` seconds."""
    uncommitted = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await uncommitted.start()
    try:
        waited = 0.0
        while True:
            stable = (await consumer.end_offsets([tp]))[tp]
            if stable == (await uncommitted.end_offsets([tp]))[tp]:
                return int(stable)
            if waited >= timeout:
                raise RescaleError(
                    f"{tp.topic}[{tp.partition}] still holds an open transaction after {waited:.0f}s (a worker "
                    "still running, or one killed whose transaction the broker aborts after the worker's "
                    "--transaction-timeout): run the rescale again later"
                )
            await asyncio.sleep(OPEN_TRANSACTION_POLL_S)
            waited += OPEN_TRANSACTION_POLL_S
    finally:
        await stop_consumer(uncommitted)  # aiokafka lets a CancelledError out when the broker is away


async def _move_partition(
    bootstrap: str, tp: TopicPartition, partitions: int, progress: Progress, limit: int, timeout: float
) -> tuple[int, dict[int, int]]:
    """Re-publish the entries of one old changelog partition whose owner changed, in batches of at most
    ``limit`` bytes (the topic's own limit); the offset read up to, and how many went to each partition."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level="read_committed"
    )
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=20, max_batch_size=limit
    )
    await consumer.start()
    await producer.start()
    latest: dict[bytes, tuple[bytes, int]] = {}
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = await _settled_end(consumer, bootstrap, tp, timeout)
        started = time.monotonic()
        while await consumer.position(tp) < end:
            batch = await consumer.getmany(tp, timeout_ms=200, max_records=5000)
            for record in batch.get(tp, []):
                if record.key is not None and record.value is not None:
                    latest[record.key] = (record.value, record.timestamp)
        targets: dict[int, int] = {}
        futures = []
        for key, (value, timestamp) in latest.items():
            target = owner_partition(key, partitions)
            if target == tp.partition:
                continue
            # never move something that is not an entry; and not its time: a restore takes a partition's
            # stream time from its entries' last_seen, and this one's is another partition's stream time
            moved = Entry.decode(value)._replace(last_seen=0).encode()
            futures.append(
                await producer.send(tp.topic, moved, key=key, partition=target, timestamp_ms=timestamp)
            )
            targets[target] = targets.get(target, 0) + 1
        for future in futures:
            await future
        progress(
            f"  {tp.topic}[{tp.partition}]: {len(latest)} keys read, {sum(targets.values())} moved "
            f"({time.monotonic() - started:.1f}s)"
        )
        return end, targets
    finally:
        await producer.stop()
        await stop_consumer(consumer)  # aiokafka lets a CancelledError out when the broker is away
