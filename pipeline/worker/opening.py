"""Opening a partition: retrying each step while it may pass.

Every step of opening (the store, the committed offset, the restore) is
retried with backoff while its error is retriable, until the partition's
deadline; a store another process holds is waited for ``store_lock_wait`` at
most. Where the store lives and when it is rebuilt is :mod:`pipeline.state.directory`'s.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import IllegalOperation, KafkaError

from pipeline.errors import PipelineError, StoreError, StoreLockedError, StoreStaleError
from pipeline.state import directory
from pipeline.state.restore import WRITE_RECORDS, Restorer
from pipeline.state.store import PartitionStore
from pipeline.state.store_meta import StoreIdentity

log = logging.getLogger(__name__)

BACKOFF_FIRST, BACKOFF_MAX = 0.5, 10.0  # seconds between attempts to open a partition
OPEN_ERRORS = (StoreError, KafkaError, IllegalOperation, OSError, PipelineError)
#: A restore longer than this (records) is written into the store opened to follow its changelog; a
#: shorter one into the store as it is served (one write batch of the replay: ``WRITE_RECORDS``).
FOLLOW_AFTER = WRITE_RECORDS


def _retriable(exc: BaseException) -> bool:
    """Whether opening may succeed if tried again: a pipeline error says so itself; the broker and
    the file system may come back (aiokafka's own flag is not used: it calls a timeout final)."""
    if isinstance(exc, PipelineError):
        return exc.retriable
    return isinstance(exc, OSError | KafkaError | IllegalOperation)


async def retry(step: Callable[[], Awaitable[None]], deadline: float, what: str, lock_wait: float) -> None:
    """Run ``step`` until it succeeds, raises a non-retriable error, or ``deadline`` passes.

    A store held by another process is waited for ``lock_wait`` seconds at most. Nothing
    keeps the failure while the backoff is waited (it is waited outside the ``except`` block,
    and logged as text): its traceback holds the frames that raised, and with them RocksDB
    column family handles, which keep a database locked after its store is closed; a store
    closed during the backoff (the partition revoked) must release its lock at once.
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
            log.warning("%s failed (%s); retrying in %.1fs", what, str(exc), backoff)
        else:
            return
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, BACKOFF_MAX)


async def restore_to_serve(
    store: PartitionStore,
    changelog: TopicPartition,
    *,
    identity: StoreIdentity,
    opener: directory.StoreOpener,
    keep: Callable[[PartitionStore], object],
    restorer: Restorer,
    **options: Any,
) -> int:
    """Replay ``changelog`` into ``store`` until it is level with the log end, and leave it open to be
    served; returns the records applied. A store ahead of its changelog (a cache of another log) is
    rebuilt and restored from the start. ``keep`` is given each store that replaces the last, so that
    the caller always holds the open one, and releases it when a later step raises.

    A tail longer than :data:`FOLLOW_AFTER` records is replayed into the store opened to follow its
    changelog (vector memtables: a third of a served write's cost), then reopened to be served; a
    shorter one (a clean handover, a restart after a crash) is written into the store as it is, since
    each RocksDB open holds the event loop (tens of ms) and a rebalance of 48 partitions paid 96.
    """
    try:
        end = await restorer.end_of(store, changelog)
    except StoreStaleError as exc:
        store = directory.rebuild(store, identity=identity, why=str(exc), opener=opener)
        keep(store)
        end = await restorer.end_of(store, changelog)
    if end - store.changelog_offset - 1 > FOLLOW_AFTER and not store.follow:
        store = directory.reopen(store, identity=identity, follow=True, opener=opener)
        keep(store)
    applied = await restorer.restore(store, changelog, end=end, **options)
    if store.follow:
        keep(directory.reopen(store, identity=identity, follow=False, opener=opener))
    return applied
