"""One active task's bookkeeping around the worker's transaction: the bytes of its queued records, what it
takes at a bisecting limit, a commit as progress, a store that cannot be read, a failed restore step retried,
and what a closed task still holds."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from pipeline.errors import PartitionUnservedError, StoreCorruptError
from pipeline.state import directory
from pipeline.state.directory import store_path
from pipeline.state.store import PartitionStore
from pipeline.worker.lifecycle import PartitionState

from .fakes import INPUT, TOPOLOGY, Harness, keys_for, record, records

S = PartitionState
K = keys_for(0, 6)  # owned by input partition 0: never rerouted
Opener = Callable[..., Awaitable[Harness]]


def _size(r: ConsumerRecord[bytes, bytes]) -> int:
    """What a fetched record weighs in the queue: its value and key (a keyless one: its value)."""
    size: int = r.serialized_value_size + max(r.serialized_key_size, 0)
    return size


async def test_queued_bytes_are_the_values_and_keys_of_the_fetched_records_and_zero_once_all_are_taken(
    open_partition: Opener,
) -> None:
    """Two fetches, one of a keyless record: the queue weighs both records' values plus the one key; handled,
    it weighs nothing."""
    h = await open_partition()
    task = h.task()
    keyed, keyless = record(10, K[0]), record(11, None)
    assert task.queued_bytes == 0
    task.feed([keyed])
    task.feed([keyless])
    assert task.queued_bytes == len(keyed.value) + len(K[0]) + len(keyless.value)
    await h.work()
    assert (task.queue, task.queued_bytes) == ([], 0)


async def test_at_a_bisecting_limit_the_task_takes_only_the_room_left_and_still_weighs_what_stays_queued(
    open_partition: Opener,
) -> None:
    """One record already in the transaction and a limit of three: two more are taken (one keyless), the
    fourth stays queued and is all the queue weighs."""
    h = await open_partition()
    task = h.task()
    h.feed([record(10, K[0])])
    await h.work()
    assert task.part is not None
    assert task.part.records == 1
    rest = [record(11, None), record(12, K[1]), record(13, K[2])]
    h.feed(rest)
    task.poison.limit = 3  # as bisecting sets it after a refused commit
    await h.work()
    assert task.part.records == 3
    assert [r.offset for r in task.queue] == [13]
    assert task.queued_bytes == _size(rest[2])


async def test_a_commit_is_progress_so_a_task_with_work_is_stuck_only_stuck_after_seconds_later(
    tmp_path: Path,
) -> None:
    """A task whose last progress was long ago commits: with records waiting, it is stuck only once
    stuck_after has passed since that commit."""
    h = Harness(tmp_path, {"stuck_after": 5.0})
    task = await h.open(0)
    task.progress_at = time.monotonic() - 60
    await h.handle_and_commit(records(0, 10, K[:1]))
    now = time.monotonic()
    task.feed(records(0, 11, K[1:2]))
    assert not task.stuck(now + 1)
    assert task.stuck(now + 60)
    h.close()


async def test_a_store_that_cannot_be_read_after_the_commit_breaks_the_partition_and_is_wiped_on_release(
    open_partition: Opener, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """StoreCorruptError from the write after the Kafka commit: BROKEN, said with the error; closing the
    task wipes its store (the next owner restores it from the changelog)."""
    caplog.set_level(logging.WARNING)
    h = await open_partition()
    task = h.task()
    store = task.store
    assert store is not None

    def corrupt(*_args: object, **_kwargs: object) -> None:
        raise StoreCorruptError("checksum mismatch")

    monkeypatch.setattr(store, "write", corrupt)
    await h.handle_and_commit(records(0, 10, K[:1]))
    assert task.state is S.BROKEN
    assert f"{INPUT}-0: checksum mismatch; reopening it" in caplog.messages
    task.close()
    assert f"{INPUT}-0: wiping store {store.path} (an entry could not be read)" in caplog.messages
    assert not Path(store.path).exists()


async def test_a_restore_step_that_fails_after_its_store_was_closed_reopens_the_store_and_is_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The restore fails once with its store closed (a reopen that failed): it is logged with the partition
    and step, retried after the backoff with the partition's store opened again to be served, and READY."""
    caplog.set_level(logging.WARNING)
    h = Harness(tmp_path)
    restorer = h.context.restorer
    assert restorer is not None
    end_of = restorer.end_of
    failures = [OSError("reopen failed")]

    async def failing_once(store: PartitionStore, changelog: TopicPartition) -> int:
        if failures:
            store.close()
            raise failures.pop()
        return await end_of(store, changelog)

    opened: list[tuple[Path, Any, Any]] = []
    open_store = directory.open_store

    def noting(path: Path, **kwargs: Any) -> PartitionStore:
        opened.append((path, kwargs["identity"], kwargs["follow"]))
        return open_store(path, **kwargs)

    monkeypatch.setattr(restorer, "end_of", failing_once)
    monkeypatch.setattr(directory, "open_store", noting)
    task = await h.open(0)
    assert task.state is S.READY
    assert task.store is not None
    assert not task.store.closed
    assert not task.store.follow
    path = store_path(h.settings.state_dir, TOPOLOGY, h.settings.group, task.tp)
    assert opened == [(path, task.identity, False)] * 2
    assert any(
        m.startswith(f"{INPUT}-0: restore failed (reopen failed); retrying in") for m in caplog.messages
    )
    h.close()


async def test_a_closed_task_holds_no_records_stage_part_or_store(open_partition: Opener) -> None:
    """Closing drops the queue and its bytes, the stage, the transaction part and the store."""
    h = await open_partition()
    task = h.task()
    task.feed(records(0, 10, K[:2]))
    task.close()
    assert (task.queue, task.queued_bytes) == ([], 0)
    assert (task.stage, task.part, task.store) == (None, None, None)
    assert task.state is S.CLOSED


async def test_a_failed_open_step_is_logged_with_the_partition_and_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Opening the store fails once: a warning names the partition and the step, and the retry serves it."""
    caplog.set_level(logging.WARNING)
    failures = [OSError("disk busy")]
    open_store = directory.open_store

    def failing_once(path: Path, **kwargs: Any) -> PartitionStore:
        if failures:
            raise failures.pop()
        return open_store(path, **kwargs)

    monkeypatch.setattr(directory, "open_store", failing_once)
    h = Harness(tmp_path)
    task = await h.open(0)
    assert task.state is S.READY
    assert any(m.startswith(f"{INPUT}-0: open failed (disk busy); retrying in") for m in caplog.messages)
    h.close()


async def test_a_restored_partition_reports_no_changelog_records_left_under_its_topic_and_number(
    open_partition: Opener,
) -> None:
    """After the restore, the partition's pipeline_restore_remaining_records gauge is there, at 0."""
    h = await open_partition()
    remaining = h.metrics.registry.get_sample_value(
        "pipeline_restore_remaining_records", {"topic": INPUT, "partition": "0"}
    )
    assert remaining == 0


async def test_a_task_closed_before_its_store_ever_opened_released_no_position(tmp_path: Path) -> None:
    """An open that fails before a store is opened: the task is CLOSED and says it released no store
    (released_at None), so the position remembered for the partition stands."""
    state_dir = tmp_path / "state"
    state_dir.write_text("not a directory")
    h = Harness(state_dir, {"open_timeout": 0.1})
    task = h.task(0)
    with pytest.raises(PartitionUnservedError):
        await task.open(h.txn, time.monotonic() + 0.1)
    assert task.state is S.CLOSED
    assert task.released_at is None


async def test_a_task_closed_before_its_restore_checked_its_store_leaves_no_position_to_claim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store on disk ahead of its changelog (another log's cache), released before the restore checked it:
    the task says it released no known position, so its worker never claims the store (issue 34, item 7)."""
    h = Harness(tmp_path)
    task = h.task(0)
    path = store_path(h.settings.state_dir, TOPOLOGY, h.settings.group, task.tp)
    ahead = directory.open_store(
        path, bucket_ms=directory.topology_bucket_ms(TOPOLOGY), identity=task.identity
    )
    ahead.write({}, changelog_offset=1000, stream_time=0)
    ahead.close()
    restorer = h.context.restorer
    assert restorer is not None
    never = asyncio.Event()

    async def stalled(store: PartitionStore, changelog: TopicPartition) -> int:
        await never.wait()
        return -1

    monkeypatch.setattr(restorer, "end_of", stalled)
    opening = asyncio.ensure_future(task.open(h.txn, time.monotonic() + 60))
    while task.store is None:
        await asyncio.sleep(0)
    assert task.store.changelog_offset == 1000
    task.close()
    opening.cancel()
    with contextlib.suppress(asyncio.CancelledError, PartitionUnservedError):
        await opening
    assert task.released_at is None
    h.close()
