"""A standby replica on its own: a failure it did not expect is retried, and what it says its store holds."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition

from pipeline.errors import StoreError, StoreStaleError, StoreUnusableError
from pipeline.state.store import PartitionStore
from pipeline.state.store_meta import StoreIdentity
from pipeline.worker import standby as standby_module
from pipeline.worker.lifecycle import StandbyState
from pipeline.worker.standby import Standby

from .fakes import FailingWrites

TP = TopicPartition("raw", 0)
CHANGELOG = TopicPartition("raw-changelog", 0)
IDENTITY = StoreIdentity(app="app", group="g", topic="raw", partition=0, changelog="raw-changelog")


def _restorer(catch_up: Any) -> Any:
    """A restore service whose standby rounds are ``catch_up``."""
    return SimpleNamespace(catch_up=catch_up)


async def test_an_unexpected_error_in_a_round_is_retried_and_closing_still_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round that raises a bug's error (a ValueError from decoding, say) closes the store and tries again;
    the standby's task never ends with it, and close() returns the position without raising."""
    rounds: list[int] = []

    async def catch_up(store: Any, changelog: TopicPartition, **_kwargs: Any) -> tuple[int, int]:
        rounds.append(len(rounds))
        if len(rounds) == 1:
            raise ValueError("a record that cannot be decoded")
        return 0, store.changelog_offset + 1

    monkeypatch.setattr(standby_module, "RETRY_FIRST_S", 0.01)
    monkeypatch.setattr(standby_module, "POLL_S", 0.01)
    standby = Standby(
        TP,
        changelog=CHANGELOG,
        identity=IDENTITY,
        path=tmp_path / "s",
        bucket_ms=3_600_000,
        restorer=_restorer(catch_up),
    )
    standby.start()
    try:
        for _ in range(200):
            if len(rounds) >= 3:
                break
            await asyncio.sleep(0.01)
        assert len(rounds) >= 3  # the failed round was followed by more
        assert standby.state is StandbyState.FOLLOWING
    finally:
        assert await standby.close() == -1
    assert standby.lifecycle.closed


async def test_a_store_closed_after_a_failed_round_is_released_while_the_standby_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round failing on a disk write closes the store; during the backoff that follows, the same process can
    open it (a promotion does): the failure, whose traceback holds a column family handle, is not kept."""
    failed: list[StoreError] = []

    async def catch_up(store: PartitionStore, changelog: TopicPartition, **_kwargs: Any) -> tuple[int, int]:
        store._db = FailingWrites(store._db)  # type: ignore[assignment]
        try:
            store.write_raw([(b"k", b"v", 2 * 3_600_000)], changelog_offset=0, stream_time=1)
        except StoreError as exc:
            failed.append(exc)
            raise
        return 0, 0

    monkeypatch.setattr(standby_module, "RETRY_FIRST_S", 5.0)
    path = tmp_path / "s"
    standby = Standby(
        TP,
        changelog=CHANGELOG,
        identity=IDENTITY,
        path=path,
        bucket_ms=3_600_000,
        restorer=_restorer(catch_up),
    )
    standby.start()
    try:
        for _ in range(200):
            if failed and standby.store is None:
                break
            await asyncio.sleep(0.01)
        assert failed
        assert standby.store is None  # closed; waiting to try again
        failed.clear()  # this test's own reference to the failure
        PartitionStore.open(path, bucket_ms=3_600_000, identity=IDENTITY).close()  # not StoreLockedError
    finally:
        await standby.close()


async def test_a_standby_whose_wiped_store_cannot_be_made_again_holds_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store at offset 30,000 found stale is wiped for a rebuild, and opening it again fails: the standby says
    its store holds nothing (-1), never the offset the wiped store had."""
    at = tmp_path / "s"
    store = PartitionStore.open(at, bucket_ms=3_600_000, identity=IDENTITY)
    store.write_raw([(b"k", b"v", 2 * 3_600_000)], changelog_offset=30_000, stream_time=1)
    store.close()
    opens: list[Path] = []

    def opener(
        path: Path, *, bucket_ms: int, identity: StoreIdentity | None = None, follow: bool = False
    ) -> PartitionStore:
        opens.append(path)
        if len(opens) > 1:
            raise StoreUnusableError(f"store {path} cannot be created: no space left on device")
        return PartitionStore.open(path, bucket_ms=bucket_ms, identity=identity, follow=follow)

    async def catch_up(store: PartitionStore, changelog: TopicPartition, **_kwargs: Any) -> tuple[int, int]:
        raise StoreStaleError(f"store {store.path} is beyond the end of {changelog}")

    monkeypatch.setattr(standby_module, "RETRY_FIRST_S", 0.01)
    standby = Standby(
        TP,
        changelog=CHANGELOG,
        identity=IDENTITY,
        path=at,
        bucket_ms=3_600_000,
        restorer=_restorer(catch_up),
        opener=opener,
    )
    standby.start()
    try:
        for _ in range(200):
            if len(opens) >= 3:  # the rebuild's open failed, and a retry's too
                break
            await asyncio.sleep(0.01)
        assert len(opens) >= 3
        assert standby.stored == -1
    finally:
        assert await standby.close() == -1
