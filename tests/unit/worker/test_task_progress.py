"""A task's progress: when it counts as stuck, what idling and a rewind reset, and a store rebuilt on open (still\nits partition's)."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition

from pipeline.errors import StoreIdentityError, StoreLockedError
from pipeline.state.store import PartitionStore
from pipeline.worker import opening
from pipeline.worker.lifecycle import PartitionState

from .fakes import TOPICS, Harness, keys_for, records, tp

Opener = Callable[..., Awaitable[Harness]]
K = keys_for(0, 4)


async def test_a_task_with_work_is_stuck_only_once_stuck_after_has_fully_passed(
    open_partition: Opener,
) -> None:
    """Queued records and no commit: not stuck at exactly stuck_after since its last progress, stuck just after."""
    h = await open_partition()
    task = h.task()
    h.feed(records(0, 0, K[:1]))
    task.progress_at = 1000.0  # a value whose sums are exact
    limit = task.progress_at + h.settings.stuck_after
    assert not task.stuck(limit)
    assert task.stuck(limit + 0.001)


async def test_idling_counts_as_progress_only_with_nothing_queued_and_nothing_in_the_transaction(
    open_partition: Opener,
) -> None:
    """idle() moves the progress mark of a task with nothing to do, never of one with queued or handled records."""
    h = await open_partition()
    task = h.task()
    task.progress_at = 0.0
    h.feed(records(0, 0, K[:1]))
    task.idle()
    assert task.progress_at == 0.0  # queued
    await h.work()
    assert task.in_transaction
    assert not task.queue
    task.idle()
    assert task.progress_at == 0.0  # in the open transaction
    await h.commit()
    task.progress_at = 0.0
    task.idle()
    assert task.progress_at > 0.0
    assert not task.stuck(task.progress_at + h.settings.stuck_after + 1)


async def test_a_rewind_empties_the_queue_and_its_bytes_and_the_task_is_no_longer_caught_up(
    open_partition: Opener,
) -> None:
    """After a rewind nothing is queued (zero bytes), the position is the rewind's, and caught_up is False."""
    h = await open_partition()
    task = h.task()
    h.feed(records(0, 5, K[:3]))
    task.caught_up = True
    task.rewind(5)
    assert (task.queue, task.queued_bytes, task.position, task.caught_up) == ([], 0, 5, False)


async def test_a_store_ahead_of_its_empty_changelog_is_rebuilt_and_served(tmp_path: Path) -> None:
    """A store left at a changelog offset past the changelog's end (a cache of another log) is rebuilt on open, and
    the task serves from the rebuilt store."""
    first = Harness(tmp_path)
    await first.open(0)
    await first.handle_and_commit(records(0, 0, K[:3]))
    assert first.producer.committed_to(TOPICS.changelog)
    first.close()
    again = Harness(tmp_path)
    task = await again.open(0)
    try:
        assert task.state is PartitionState.READY
        assert task.store is not None
        assert not task.store.closed
        assert task.store.changelog_offset == -1  # rebuilt empty, level with the empty changelog
        await again.handle_and_commit(records(0, 3, K[3:4]))
        assert again.producer.committed_keys(TOPICS.commands) == [K[3].encode()]
    finally:
        again.close()


async def test_a_store_rebuilt_on_open_still_belongs_to_its_partition(tmp_path: Path) -> None:
    """The store rebuilt for being ahead of its changelog is stamped with the partition's identity again: opened
    afterwards as another partition's store, it is refused."""
    first = Harness(tmp_path)
    await first.open(0)
    await first.handle_and_commit(records(0, 0, K[:3]))
    first.close()
    again = Harness(tmp_path)
    task = await again.open(0)
    assert task.store is not None
    path, bucket_ms = task.store.path, task.store.bucket_ms
    again.close()
    other = again.context.identity(tp(1), TopicPartition(TOPICS.changelog, 1))
    with pytest.raises(StoreIdentityError):
        PartitionStore.open(path, bucket_ms=bucket_ms, identity=other)


async def test_a_store_found_locked_while_it_is_rebuilt_is_waited_for_and_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's rebuild (it is ahead of its changelog) finds it held by another process once: the restore is
    retried within store_lock_wait, and the task serves from the rebuilt store."""
    monkeypatch.setattr(opening, "BACKOFF_FIRST", 0.0)
    first = Harness(tmp_path)
    await first.open(0)
    await first.handle_and_commit(records(0, 0, K[:3]))
    first.close()
    opens: list[Path] = []

    def opener(path: Path, **kwargs: Any) -> PartitionStore:
        opens.append(path)
        if len(opens) == 2:  # the rebuild's open
            raise StoreLockedError(f"store {path} is held by pid 7")
        return PartitionStore.open(path, **kwargs)

    again = Harness(tmp_path)
    again.context = dataclasses.replace(again.context, open_store=opener)
    try:
        task = await again.open(0)
        assert task.state is PartitionState.READY
        assert task.store is not None
        assert task.store.changelog_offset == -1
        assert len(opens) >= 3
    finally:
        again.close()
