"""Restore a partition's store from its changelog (read_committed), with progress."""

from __future__ import annotations

import logging
import time

from aiokafka import AIOKafkaConsumer, TopicPartition
from prometheus_client import Gauge

from pipeline.state.decision import Entry
from pipeline.state.store import Change, PartitionStore

log = logging.getLogger(__name__)


async def restore(
    store: PartitionStore,
    changelog: TopicPartition,
    *,
    bootstrap: str,
    progress_every: float = 5.0,
    remaining: Gauge | None = None,  # set to the records left to replay
) -> int:
    """Replay ``changelog`` from the store's offset to its end; return the records applied.

    Every batch of records is written with the offset it reaches in one
    ``WriteBatch``, so an interrupted restore resumes where it stopped. Progress
    goes to the log every ``progress_every`` seconds with the rate and an ETA.
    """
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=8 * 1024 * 1024,
        fetch_max_bytes=32 * 1024 * 1024,
    )
    await consumer.start()
    try:
        consumer.assign([changelog])
        end = (await consumer.end_offsets([changelog]))[changelog]
        start = store.changelog_offset + 1
        if start >= end:
            return 0
        consumer.seek(changelog, start)
        total = end - start
        applied = 0
        started = last_report = time.monotonic()
        log.info("restore %s: replaying offsets %s..%s (%s records)", changelog, start, end - 1, total)
        position = start
        while position < end:
            batch = await consumer.getmany(changelog, timeout_ms=100, max_records=5000)
            records = batch.get(changelog, [])
            position = await consumer.position(changelog)
            if not records:
                continue
            latest: dict[bytes, tuple[Entry, bytes]] = {}
            stream_time = store.stream_time
            for record in records:
                if record.key is None or record.value is None:
                    continue
                latest[record.key] = (Entry.decode(record.value), record.value)
                stream_time = max(stream_time, record.timestamp)
            previous = store.get_many(list(latest))
            changes = {key: Change(entry, previous.get(key), value) for key, (entry, value) in latest.items()}
            store.write(changes, changelog_offset=records[-1].offset, stream_time=stream_time)
            applied += len(records)
            if remaining is not None:
                remaining.set(max(end - position, 0))
            now = time.monotonic()
            if now - last_report >= progress_every:
                last_report = now
                rate = applied / max(now - started, 1e-6)
                left = max(end - position, 0)
                log.info(
                    "restore %s: %s/%s records, %.0f records/s, ETA %.0fs",
                    changelog,
                    position - start,
                    total,
                    rate,
                    left / max(rate, 1e-6),
                )
        elapsed = time.monotonic() - started
        log.info("restore %s: done, %s records in %.1fs", changelog, applied, elapsed)
        store.expire()
        if remaining is not None:
            remaining.set(0)
        return applied
    finally:
        await consumer.stop()
