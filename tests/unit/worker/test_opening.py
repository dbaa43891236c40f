"""Retrying the steps of opening a partition: what a failed attempt leaves held while it waits."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from aiokafka import TopicPartition

from pipeline.errors import StoreError
from pipeline.state.store import PartitionStore
from pipeline.state.store_meta import StoreIdentity
from pipeline.worker import opening

from .fakes import FailingWrites

HOUR = 3_600_000
IDENTITY = StoreIdentity("app", "group", "raw", 0, "changelog", "cluster-a", "topic-1")
CHANGELOG = TopicPartition("changelog", 0)


async def test_a_store_closed_while_its_failed_restore_waits_to_retry_can_be_opened_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write failing mid-restore, then the store closed during the backoff (the partition revoked): the
    database is released at once, so the same process opens it again (simulation seed 3024: the failure's
    traceback held a column family handle, which kept RocksDB's lock after the store was closed)."""
    monkeypatch.setattr(opening, "BACKOFF_FIRST", 0.2)
    path = tmp_path / "p0"
    store = PartitionStore.open(path, bucket_ms=HOUR)
    store._db = FailingWrites(store._db)  # type: ignore[assignment]
    now = int(time.time() * 1000)

    async def restore_step() -> None:
        store.write_raw([(b"k", b"v", now + HOUR)], changelog_offset=0, stream_time=now)

    attempt = asyncio.create_task(opening.retry(restore_step, time.monotonic() + 30, "p0: restore", 30.0))
    await asyncio.sleep(0.05)  # the first attempt has failed; the retry waits
    assert not attempt.done()
    store.close()
    reopened = PartitionStore.open(path, bucket_ms=HOUR)  # StoreLockedError while the handle was held
    reopened.close()
    with pytest.raises(StoreError):
        await attempt  # the next attempt writes to a closed store


class _Restorer:
    """A restore service whose changelog ends ``records`` past the store, and which writes nothing."""

    def __init__(self, records: int) -> None:
        self.records = records
        self.restored: list[tuple[bool, int | None]] = []  # (store follows, end given)

    async def end_of(self, store: PartitionStore, _changelog: TopicPartition) -> int:
        return store.changelog_offset + 1 + self.records

    async def restore(
        self, store: PartitionStore, _changelog: TopicPartition, *, end: int | None = None
    ) -> int:
        self.restored.append((store.follow, end))
        return 0


async def _restore_to_serve(tmp_path: Path, records: int) -> tuple[list[bool], _Restorer, PartitionStore]:
    """Restore a served store ``records`` behind its changelog; the modes each open asked for, the restorer, and
    the store left open."""
    opened: list[bool] = []

    def opener(
        path: Path, *, bucket_ms: int, identity: StoreIdentity | None = None, follow: bool = False
    ) -> PartitionStore:
        opened.append(follow)
        return PartitionStore.open(path, bucket_ms=bucket_ms, identity=identity, follow=follow)

    kept: list[PartitionStore] = []
    store = PartitionStore.open(tmp_path / "p0", bucket_ms=HOUR, identity=IDENTITY)
    restorer = _Restorer(records)
    await opening.restore_to_serve(
        store,
        CHANGELOG,
        identity=IDENTITY,
        opener=opener,
        keep=kept.append,
        restorer=restorer,  # type: ignore[arg-type]
    )
    return opened, restorer, kept[-1] if kept else store


async def test_a_short_restore_is_written_into_the_store_as_served_without_reopening_it(
    tmp_path: Path,
) -> None:
    """A tail of one write batch or less (a clean handover, a restart after a crash) is replayed into the store
    opened to be served: no RocksDB open holds the loop again (48 partitions at a rebalance paid two each)."""
    opened, restorer, store = await _restore_to_serve(tmp_path, opening.FOLLOW_AFTER)
    try:
        assert opened == []
        assert restorer.restored == [(False, opening.FOLLOW_AFTER)]
        assert not store.follow
    finally:
        store.close()


async def test_a_long_restore_follows_the_changelog_then_is_reopened_to_be_served(tmp_path: Path) -> None:
    """A tail longer than one write batch is replayed into the store opened to follow (vector memtables), which
    is then reopened to be served."""
    opened, restorer, store = await _restore_to_serve(tmp_path, opening.FOLLOW_AFTER + 1)
    try:
        assert opened == [True, False]
        assert restorer.restored == [(True, opening.FOLLOW_AFTER + 1)]
        assert not store.follow
    finally:
        store.close()
