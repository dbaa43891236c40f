"""Retrying the steps of opening a partition: what a failed attempt leaves held while it waits."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from pipeline.errors import StoreError
from pipeline.state.store import PartitionStore
from pipeline.worker import opening

from .fakes import FailingWrites

HOUR = 3_600_000


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
