"""Requests of our own over a consumer's connections: a raw fetch, a partition's high watermark."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import NotLeaderForPartitionError, for_code
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.protocol.offset import OffsetRequest
from aiokafka.record.memory_records import MemoryRecords

READ_COMMITTED = 1
READ_UNCOMMITTED = 0
LATEST = -1
FETCH_WAIT_MS = 200
METADATA_TRIES = 3


@dataclass(frozen=True, slots=True)
class RawFetch:
    """One partition's answer to a raw fetch."""

    records: MemoryRecords | None  # None: nothing at this position
    aborted: list[tuple[int, int]]  # (producer id, first offset) of aborted transactions, oldest first
    error: type[Exception] | None  # the partition's error class, if any


async def fetch_raw(
    consumer: AIOKafkaConsumer, tp: TopicPartition, position: int, *, fetch_bytes: int, partition_bytes: int
) -> RawFetch:
    """Fetch ``tp`` from ``position`` (read_committed) through ``consumer``'s own connections.

    The consumer is never assigned ``tp``: its fetcher stays idle, and the record
    batches come back as bytes for aiokafka's C reader, not as ``ConsumerRecord`` objects.
    """
    client: Any = consumer._client
    leader = await _leader(client, tp)
    request = FetchRequest(
        FETCH_WAIT_MS,
        1,
        fetch_bytes,
        READ_COMMITTED,
        [(tp.topic, [(tp.partition, position, partition_bytes)])],
    )
    response = await client.send(leader, request)
    for _topic, partitions in response.topics:
        for partition, error_code, _highwater, *data in partitions:
            if partition != tp.partition:
                continue
            if error_code != 0:
                return RawFetch(None, [], for_code(error_code))
            # v4-v10: [lso, (log_start,) aborted, records]; v11: [lso, log_start, aborted, replica, records]
            aborted = data[2] if response.API_VERSION >= 11 else data[-2]
            return RawFetch(MemoryRecords(data[-1]), sorted(aborted or [], key=lambda pair: pair[1]), None)
    return RawFetch(None, [], None)


async def _leader(client: Any, tp: TopicPartition) -> int:
    """``tp``'s leader in ``client``'s metadata, asked for when unknown: the topic is tracked from now on, and
    a metadata update already under way (begun without it) is followed by one more."""
    for _ in range(METADATA_TRIES):
        leader = client.cluster.leader_for_partition(tp)
        if leader is not None and leader != -1:
            return int(leader)
        if tp.topic in client._topics:
            await client.force_metadata_update()
        else:
            await client.add_topic(tp.topic)
    raise NotLeaderForPartitionError(f"no leader for {tp}")


async def log_end(consumer: AIOKafkaConsumer, tp: TopicPartition) -> int:
    """``tp``'s high watermark (ListOffsets, latest, read_uncommitted) through ``consumer``'s connections:
    records of transactions still open count, unlike in the consumer's own ``end_offsets``."""
    client: Any = consumer._client
    leader = await _leader(client, tp)
    response = await client.send(
        leader, OffsetRequest(-1, READ_UNCOMMITTED, [(tp.topic, [(tp.partition, LATEST)])])
    )
    for _topic, partitions in response.topics:
        for partition, error_code, _timestamp, offset, *_ in partitions:
            if partition == tp.partition:
                if error_code != 0:
                    raise for_code(error_code)(f"list offsets of {tp}")
                return int(offset)
    raise NotLeaderForPartitionError(f"no offset for {tp} in the answer")


async def force_metadata_update(consumer: AIOKafkaConsumer) -> None:
    """Refresh the consumer's cluster metadata (after a fetch failed: the leader may have moved)."""
    client: Any = consumer._client
    await client.force_metadata_update()
