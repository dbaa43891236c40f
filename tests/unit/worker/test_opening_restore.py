"""restore_to_serve: a store ahead of its changelog rebuilt, each store handed on, each open with its identity."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition

from pipeline.errors import StoreStaleError
from pipeline.state.store import PartitionStore
from pipeline.state.store_meta import StoreIdentity
from pipeline.worker import opening

HOUR = 3_600_000
IDENTITY = StoreIdentity("app", "group", "raw", 0, "changelog", "cluster-a", "topic-1")
CHANGELOG = TopicPartition("changelog", 0)


class Restorer:
    """A restore service over a changelog ending ``records`` past the store; the first end it is asked of is
    refused as stale when ``stale``. It writes nothing and notes every call."""

    def __init__(self, records: int, *, stale: bool = False) -> None:
        self.records = records
        self.stale = stale
        self.ends: list[tuple[PartitionStore, TopicPartition]] = []
        self.restored: list[tuple[PartitionStore, TopicPartition, int | None, dict[str, Any]]] = []

    async def end_of(self, store: PartitionStore, changelog: TopicPartition) -> int:
        self.ends.append((store, changelog))
        if self.stale:
            self.stale = False
            raise StoreStaleError(f"store {store.path} is at offset 9, beyond its changelog's end 3")
        return store.changelog_offset + 1 + self.records

    async def restore(
        self, store: PartitionStore, changelog: TopicPartition, *, end: int | None = None, **options: Any
    ) -> int:
        self.restored.append((store, changelog, end, options))
        return 0


class Opener:
    """PartitionStore.open, noting what each open was asked."""

    def __init__(self) -> None:
        self.opened: list[tuple[Path, StoreIdentity | None, bool]] = []

    def __call__(
        self, path: Path, *, bucket_ms: int, identity: StoreIdentity | None = None, follow: bool = False
    ) -> PartitionStore:
        self.opened.append((path, identity, follow))
        return PartitionStore.open(path, bucket_ms=bucket_ms, identity=identity, follow=follow)


def _ahead_of_its_changelog(path: Path) -> PartitionStore:
    """A served store holding a key at changelog offset 9."""
    store = PartitionStore.open(path, bucket_ms=HOUR, identity=IDENTITY)
    store.write_raw([(b"k", b"v", 10 * HOUR)], changelog_offset=9, stream_time=HOUR)
    return store


async def test_a_store_ahead_of_its_changelog_is_rebuilt_empty_and_restored_from_the_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A stale store is wiped and opened again through the caller's opener, with its identity and mode; the
    caller is handed it; its changelog's end is read again of it and it is restored into, saying why."""
    path = tmp_path / "p0"
    store = _ahead_of_its_changelog(path)
    restorer, opener = Restorer(5, stale=True), Opener()
    kept: list[PartitionStore] = []
    with caplog.at_level(logging.WARNING, logger="pipeline.state.directory"):
        await opening.restore_to_serve(
            store,
            CHANGELOG,
            identity=IDENTITY,
            opener=opener,
            keep=kept.append,
            restorer=restorer,  # type: ignore[arg-type]
            progress="p0",
        )
    (rebuilt,) = kept
    try:
        assert opener.opened == [(path, IDENTITY, False)]
        assert rebuilt.changelog_offset == -1  # wiped: nothing of the other log is left
        assert restorer.ends == [(store, CHANGELOG), (rebuilt, CHANGELOG)]
        assert restorer.restored == [(rebuilt, CHANGELOG, 5, {"progress": "p0"})]
        assert f"store {path} is at offset 9, beyond its changelog's end 3" in caplog.text
    finally:
        rebuilt.close()


async def test_a_long_restore_hands_on_the_store_it_follows_and_the_one_it_serves_with_their_identity(
    tmp_path: Path,
) -> None:
    """A tail past one write batch: the store reopened to follow, then to be served, each checked against the
    identity, each handed to the caller; the restore reads the changelog into the one that follows."""
    path = tmp_path / "p0"
    store = PartitionStore.open(path, bucket_ms=HOUR, identity=IDENTITY)
    restorer, opener = Restorer(opening.FOLLOW_AFTER + 1), Opener()
    kept: list[PartitionStore] = []
    await opening.restore_to_serve(
        store,
        CHANGELOG,
        identity=IDENTITY,
        opener=opener,
        keep=kept.append,
        restorer=restorer,  # type: ignore[arg-type]
    )
    following, served = kept
    try:
        assert opener.opened == [(path, IDENTITY, True), (path, IDENTITY, False)]
        assert (following.follow, served.follow) == (True, False)
        assert restorer.ends == [(store, CHANGELOG)]
        assert restorer.restored == [(following, CHANGELOG, opening.FOLLOW_AFTER + 1, {})]
    finally:
        served.close()
