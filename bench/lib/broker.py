"""The broker a bench runs against: its topics (created and deleted), the backlog produced into them, committed records read back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import CoordinatorLoadInProgressError, CoordinatorNotAvailableError

from bench.lib.report import BenchError, say
from bench.lib.workload import source_headers
from pipeline.kafka.admin import TopicSpec, ensure_topics
from pipeline.kafka.partitioner import owner_partition

ROOT = Path(__file__).resolve().parents[2]


class Broker:
    """One admin client and one read_committed consumer for offset queries."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.created: list[str] = []
        self._partitions: dict[str, list[TopicPartition]] = {}
        self._coordinators: dict[str, int] = {}
        self.admin: AIOKafkaAdminClient | None = None
        self.consumer: AIOKafkaConsumer | None = None

    async def start(self) -> None:
        self.admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=15000)
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, isolation_level="read_committed", enable_auto_commit=False
        )
        await asyncio.wait_for(self.admin.start(), 20)
        await asyncio.wait_for(self.consumer.start(), 20)

    def _consumer(self) -> AIOKafkaConsumer:
        if self.consumer is None:
            raise BenchError("the broker client is not started")
        return self.consumer

    def _admin(self) -> AIOKafkaAdminClient:
        if self.admin is None:
            raise BenchError("the broker client is not started")
        return self.admin

    async def stop(self) -> None:
        if self.consumer is not None:
            await self.consumer.stop()
        if self.admin is not None:
            await self.admin.close()

    async def create(self, specs: list[TopicSpec]) -> None:
        self.created += [s.name for s in specs if s.name not in self.created]
        await ensure_topics(self.bootstrap, specs, timeout=20)

    async def partitions(self, topic: str) -> list[TopicPartition]:
        if topic not in self._partitions:
            for _ in range(100):
                parts = self._consumer().partitions_for_topic(topic)
                if parts:
                    break
                await self._consumer()._client.force_metadata_update()  # no public refresh in aiokafka
                await asyncio.sleep(0.1)
            else:
                raise BenchError(f"topic {topic} has no partitions in the metadata")
            self._partitions[topic] = [TopicPartition(topic, p) for p in sorted(parts)]
        return self._partitions[topic]

    async def end_offsets(self, topic: str) -> dict[int, int]:
        """The last stable offsets (what a read_committed reader can reach) of ``topic``."""
        tps = await self.partitions(topic)
        ends = await self._consumer().end_offsets(tps)
        return {tp.partition: ends[tp] for tp in tps}

    async def _coordinator(self, group: str) -> int:
        """The group's coordinator; on a fresh broker the first ask creates the offsets topic, so retry."""
        if group not in self._coordinators:
            deadline = time.monotonic() + 30
            while True:
                try:
                    self._coordinators[group] = await self._admin().find_coordinator(group)
                    break
                except (CoordinatorNotAvailableError, CoordinatorLoadInProgressError):
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.2)
        return self._coordinators[group]

    async def committed(self, group: str, topic: str) -> dict[int, int]:
        """The group's committed offsets on ``topic`` (-1 where none)."""
        tps = await self.partitions(topic)
        offsets = await self._admin().list_consumer_group_offsets(
            group, group_coordinator_id=await self._coordinator(group), partitions=tps
        )
        return {tp.partition: (offsets[tp].offset if tp in offsets else -1) for tp in tps}

    async def group_members(self, group: str) -> set[str]:
        """The member ids of ``group`` once it is Stable (assignments handed out); empty before."""
        responses = await self._admin().describe_consumer_groups(
            [group], group_coordinator_id=await self._coordinator(group)
        )
        for response in responses:
            for described in response.to_object()["groups"]:
                if described["group"] == group and described["state"] == "Stable":
                    return {member["member_id"] for member in described["members"]}
        return set()

    async def delete_created(self) -> None:
        if not self.created:
            return
        names, self.created = self.created, []
        try:
            await asyncio.wait_for(self._admin().delete_topics(names, timeout_ms=15000), 30)
            say(f"deleted {len(names)} topics")
        except Exception as exc:
            say(f"could not delete topics {names}: {exc!r}")


async def produce_backlog(
    bootstrap: str,
    topic: str,
    partitions: int,
    records: Iterable[tuple[bytes, bytes]],
    total: int,
    label: str,
) -> float:
    """Produce ``records`` to their owning partitions with an idempotent producer; return records/s."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        enable_idempotence=True,
        acks="all",
        linger_ms=5,
        max_batch_size=512 * 1024,
        client_id="worker-bench-producer",
    )
    await producer.start()
    began = last = time.monotonic()
    count = 0
    try:
        batches: dict[int, Any] = {}
        futures: list[asyncio.Future[Any]] = []
        for key, value in records:
            partition = owner_partition(key, partitions)
            batch = batches.get(partition)
            if batch is None:
                batch = batches[partition] = producer.create_batch()
            now = int(time.time() * 1000)
            headers = source_headers(now)
            if batch.append(key=key, value=value, timestamp=now, headers=headers) is None:
                futures.append(await producer.send_batch(batch, topic, partition=partition))
                batch = batches[partition] = producer.create_batch()
                batch.append(key=key, value=value, timestamp=now, headers=headers)
            count += 1
            if count % 2000 == 0:
                if len(futures) > 64:
                    await asyncio.gather(*futures)
                    futures.clear()
                if time.monotonic() - last >= 5:
                    last = time.monotonic()
                    rate = count / (last - began)
                    say(f"  {label}: produced {count:,}/{total:,} ({rate:,.0f} records/s)")
        for partition, batch in batches.items():
            if batch.record_count():
                futures.append(await producer.send_batch(batch, topic, partition=partition))
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    rate = count / max(time.monotonic() - began, 1e-9)
    say(f"  {label}: produced {count:,} records to {topic} ({rate:,.0f} records/s)")
    return rate


async def scan(
    bootstrap: str, topic: str, start: dict[int, int], *, on_record: Callable[[Any], None], timeout: float
) -> int:
    """Read ``topic`` read_committed from ``start`` to its current end; return the records read."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        enable_auto_commit=False,
        max_partition_fetch_bytes=8 * 1024 * 1024,
        fetch_max_bytes=32 * 1024 * 1024,
    )
    await consumer.start()
    count = 0
    try:
        tps = [TopicPartition(topic, p) for p in sorted(start)]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        for tp in tps:
            consumer.seek(tp, start[tp.partition])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            positions = [await consumer.position(tp) for tp in tps]
            if all(pos >= ends[tp] for pos, tp in zip(positions, tps, strict=True)):
                break
            batch = await consumer.getmany(timeout_ms=500, max_records=20000)
            for records in batch.values():
                for record in records:
                    on_record(record)
                count += len(records)
        else:
            raise BenchError(f"reading {topic} timed out after {timeout:.0f}s ({count:,} records)")
    finally:
        await consumer.stop()
    return count


async def warm_up(
    consumer: AIOKafkaConsumer, tps: list[TopicPartition], producer: AIOKafkaProducer, input_topic: str
) -> None:
    """Have the reader fetch every partition once, and the producer know the input topic, before timing.

    A reader's first fetches (metadata, fetch sessions) took about 200 ms; counted in, they made the
    first fifth of a second's records look 100-200 ms late, which was the p99 of a 10 s phase.
    """
    await producer.partitions_for(input_topic)
    deadline = time.monotonic() + 30
    while any(consumer.highwater(tp) is None for tp in tps):
        if time.monotonic() > deadline:
            raise RuntimeError("the latency reader fetched nothing for 30 s")
        await consumer.getmany(*tps, timeout_ms=50)


def produce_when_room(
    producer: Any, topic: str, value: bytes, key: bytes, *, partition: int, timestamp: int
) -> None:
    """``producer.produce`` on a confluent-kafka producer, polling while its local queue is full."""
    while True:
        try:
            producer.produce(topic, value, key, partition=partition, timestamp=timestamp)
            return
        except BufferError:
            producer.poll(0.05)
