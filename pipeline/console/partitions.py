"""The partitions table: per input (and effects) partition its owner, state, lag, last commit, restore.

Kafka gives the group's committed offsets and each partition's end (its last
stable offset, read ``read_committed``); the workers give who owns a
partition, its lifecycle state and its restore progress. The last commit is
the committed offset and the time of the record just before it (the last one
the commit covered), read once per new offset and remembered.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition

from pipeline.console.workers import WorkerView
from pipeline.kafka.admin import admin_client, partition_count
from pipeline.kafka.clients import started_reader
from pipeline.kafka.internals import stop_consumer
from pipeline.topology import Topology


@dataclass(frozen=True, slots=True)
class PartitionRow:
    """One partition as the console shows it."""

    topic: str
    partition: int
    owner: str  # the worker URL that owns it, or "-"
    state: str  # the owner's lifecycle state, or "unowned"
    committed: int | None  # the group's committed offset
    end: int  # the last stable offset
    lag: int  # the end minus the committed offset (the whole partition before any commit)
    last_commit_record_at: int | None  # the time of the last record the commit covered
    restore_remaining: float | None

    @property
    def restoring(self) -> bool:
        """Whether its store is being restored now."""
        return self.state == "restoring"


class Partitions:
    """Builds the table; remembers each committed offset's record time so each is read once."""

    def __init__(self, bootstrap: str, topology: Topology, group: str) -> None:
        self.bootstrap = bootstrap
        self.topology = topology
        self.group = group or topology.app
        self._times: dict[tuple[str, int, int], int | None] = {}

    def topics(self) -> list[str]:
        """The topics the workers consume: the input, and the effects topic when routes use it."""
        return [self.topology.topics.input] + (
            [self.topology.topics.effects] if self.topology.has_effects else []
        )

    async def rows(self, views: Sequence[WorkerView]) -> list[PartitionRow]:
        """Every partition of :meth:`topics`, with what Kafka and the workers say about it."""
        tps = []
        for topic in self.topics():
            tps += [
                TopicPartition(topic, p) for p in range(await partition_count(self.bootstrap, topic) or 0)
            ]
        if not tps:
            return []
        async with admin_client(self.bootstrap) as admin:
            committed = {
                tp: meta.offset
                for tp, meta in (await admin.list_consumer_group_offsets(self.group)).items()
                if meta.offset >= 0
            }
        consumer = await started_reader(self.bootstrap)
        try:
            ends = await consumer.end_offsets(tps)
            times = await self._record_times(consumer, committed, tps)
        finally:
            await stop_consumer(consumer)
        return [self._row(tp, committed.get(tp), ends[tp], times.get(tp), views) for tp in tps]

    def _row(
        self, tp: TopicPartition, committed: int | None, end: int, at: int | None, views: Sequence[WorkerView]
    ) -> PartitionRow:
        owner = next((v for v in views if tp.partition in v.owned.get(tp.topic, [])), None)
        unasked = owner is None and not all(v.sampled for v in views)  # just started: not "unowned" yet
        state = (owner.state_of(tp.topic, tp.partition) if owner else None) or (
            "not asked yet" if unasked else "unowned"
        )
        remaining = (
            owner.gauge("pipeline_restore_remaining_records", tp.topic, tp.partition) if owner else None
        )
        lag = max(end - committed, 0) if committed is not None else end
        return PartitionRow(
            tp.topic, tp.partition, owner.url if owner else "-", state, committed, end, lag, at, remaining
        )

    async def _record_times(
        self, consumer: AIOKafkaConsumer, committed: dict[TopicPartition, int], tps: list[TopicPartition]
    ) -> dict[TopicPartition, int | None]:
        """The time of the record before each committed offset (one read per offset ever seen)."""
        out: dict[TopicPartition, int | None] = {}
        todo = []
        for tp in tps:
            offset = committed.get(tp)
            if not offset:
                continue
            key = (tp.topic, tp.partition, offset)
            if key in self._times:
                out[tp] = self._times[key]
            else:
                todo.append((tp, offset))
        for tp, offset in todo:
            out[tp] = self._times[(tp.topic, tp.partition, offset)] = await _time_at(consumer, tp, offset - 1)
        return out


async def _time_at(consumer: AIOKafkaConsumer, tp: TopicPartition, offset: int) -> int | None:
    """The timestamp of the record at ``offset`` (None when it is gone or not read in time)."""
    consumer.assign([tp])
    consumer.seek(tp, offset)
    try:
        batch = await asyncio.wait_for(consumer.getmany(tp, timeout_ms=500, max_records=1), 2.0)
    except TimeoutError:
        return None
    records = batch.get(tp, [])
    return int(records[0].timestamp) if records and records[0].offset == offset else None
