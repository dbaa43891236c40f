"""Opening a partition: where its store lives, opening it, and retrying what may pass.

Every step of opening (the store, the fencing producer, the restore) is
retried with backoff while its error is retriable, until the partition's
deadline; a store another process holds is waited for ``store_lock_wait`` at
most. Only a corrupt store is wiped (it is restored from the changelog).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiokafka import TopicPartition
from aiokafka.errors import IllegalOperation, KafkaError

from pipeline.config import WorkerSettings
from pipeline.errors import PipelineError, StoreCorruptError, StoreError, StoreLockedError
from pipeline.state.store import PartitionStore, bucket_width
from pipeline.state.store_meta import StoreIdentity
from pipeline.topology import Topology

log = logging.getLogger(__name__)

BACKOFF_FIRST, BACKOFF_MAX = 0.5, 10.0  # seconds between attempts to open a partition
OPEN_ERRORS = (StoreError, KafkaError, IllegalOperation, OSError, PipelineError)


def store_path(state_dir: Path, topology: Topology, group: str, tp: TopicPartition) -> Path:
    """Where a partition's store lives: namespaced by app and group, so pipelines never share one."""
    return Path(state_dir) / topology.app / group / f"{tp.topic}-{tp.partition}"


def open_store(
    settings: WorkerSettings, topology: Topology, tp: TopicPartition, changelog: TopicPartition
) -> PartitionStore:
    """Open ``tp``'s store, checking it is this partition's; a corrupt one is wiped and created again."""
    path = store_path(settings.state_dir, topology, settings.group, tp)
    bucket_ms = bucket_width(int(topology.max_ttl.total_seconds() * 1000))
    identity = StoreIdentity(
        app=topology.app,
        group=settings.group,
        topic=tp.topic,
        partition=tp.partition,
        changelog=changelog.topic,
    )
    try:
        return PartitionStore.open(path, bucket_ms=bucket_ms, identity=identity)
    except StoreCorruptError as exc:
        log.warning("%s; wiping it and restoring from the changelog", exc)
        PartitionStore.wipe(path)  # StoreUnusableError when even that fails
        return PartitionStore.open(path, bucket_ms=bucket_ms, identity=identity)


def _retriable(exc: BaseException) -> bool:
    """Whether opening may succeed if tried again: a pipeline error says so itself; the broker and
    the file system may come back (aiokafka's own flag is not used: it calls a timeout final)."""
    if isinstance(exc, PipelineError):
        return exc.retriable
    return isinstance(exc, OSError | KafkaError | IllegalOperation)


async def retry(step: Callable[[], Awaitable[None]], deadline: float, what: str, lock_wait: float) -> None:
    """Run ``step`` until it succeeds, raises a non-retriable error, or ``deadline`` passes.

    A store held by another process is waited for ``lock_wait`` seconds at most.
    """
    backoff = BACKOFF_FIRST
    locked_until: float | None = None
    while True:
        try:
            await step()
        except OPEN_ERRORS as exc:
            now = time.monotonic()
            if isinstance(exc, StoreLockedError):
                locked_until = locked_until or now + lock_wait
                if now + backoff > locked_until:
                    raise
            if not _retriable(exc) or now + backoff > deadline:
                raise
            log.warning("%s failed (%s); retrying in %.1fs", what, exc, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)
        else:
            return
