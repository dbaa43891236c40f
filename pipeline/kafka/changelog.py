"""Reading changelog partitions for restores and standbys: their bounds, and raw read_committed fetches.

The reader is a group-less read_committed consumer used only for its connections
and its offset lookups; the fetches go through :func:`pipeline.kafka.internals.fetch_raw`.
"""

from __future__ import annotations

from collections.abc import Iterable

from aiokafka import AIOKafkaConsumer, TopicPartition

from pipeline.kafka import internals
from pipeline.kafka.clients import RESTORE_CLIENT_ID, restore_consumer, restore_partition_bytes


class ChangelogReader:
    """Bounds and raw fetches of changelog partitions (``async with``, or start/stop)."""

    def __init__(self, bootstrap: str, *, fetch_bytes: int, client_id: str = RESTORE_CLIENT_ID) -> None:
        self.fetch_bytes = fetch_bytes
        self.partition_bytes = restore_partition_bytes(fetch_bytes)
        self._consumer: AIOKafkaConsumer = restore_consumer(
            bootstrap, fetch_bytes=fetch_bytes, client_id=client_id
        )

    async def start(self) -> None:
        await self._consumer.start()

    async def stop(self) -> None:
        await self._consumer.stop()

    async def __aenter__(self) -> ChangelogReader:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.stop()

    async def end(self, tp: TopicPartition) -> int:
        """The last stable offset: everything before it is committed or aborted."""
        return (await self.ends([tp]))[tp]

    async def ends(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The last stable offset of each of ``tps``, in one request."""
        return {tp: int(offset) for tp, offset in (await self._consumer.end_offsets(list(tps))).items()}

    async def log_end(self, tp: TopicPartition) -> int:
        """The high watermark: the end including records of transactions still open."""
        return await internals.log_end(self._consumer, tp)

    async def beginning(self, tp: TopicPartition) -> int:
        """The first offset retention left."""
        return int((await self._consumer.beginning_offsets([tp]))[tp])

    async def fetch(self, tp: TopicPartition, position: int) -> internals.RawFetch:
        """One raw fetch from ``position``."""
        return await internals.fetch_raw(
            self._consumer, tp, position, fetch_bytes=self.fetch_bytes, partition_bytes=self.partition_bytes
        )

    async def refresh(self) -> None:
        """Refresh the metadata (after a failed fetch: the leader may have moved)."""
        await internals.force_metadata_update(self._consumer)
