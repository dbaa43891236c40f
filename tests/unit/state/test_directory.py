"""Opening a partition's store: the store is a cache of one changelog, and a stale one is rebuilt, never trusted."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition

from pipeline.errors import (
    StateDirInUseError,
    StoreCorruptError,
    StoreError,
    StoreIdentityError,
    StoreStaleError,
    StoreUnusableError,
)
from pipeline.state import directory
from pipeline.state.decision import Entry
from pipeline.state.restore import RestoreBudget, Restorer
from pipeline.state.store import Change, PartitionStore
from pipeline.state.store_meta import StoreIdentity
from pipeline.topology import load
from tests.unit.worker.fakes import TOPOLOGY_PATH

HOUR = 3_600_000
OURS = StoreIdentity("app", "group", "raw", 0, "changelog", "cluster-a", "topic-1")
CHANGELOG = TopicPartition("changelog", 0)


def _reader_ending_at(end: int) -> Any:
    """A changelog reader that only knows the changelog's end."""

    async def end_of(_tp: TopicPartition) -> int:
        return end

    async def nothing() -> None:
        return None

    return SimpleNamespace(end=end_of, log_end=end_of, fetch_bytes=1024, start=nothing, stop=nothing)


async def catch_up(store: PartitionStore, changelog: TopicPartition, *, reader: Any) -> tuple[int, int]:
    """One standby round of the restore service over ``reader``."""
    return await Restorer(lambda: reader, RestoreBudget(1 << 20), fetch_bytes=1024).catch_up(store, changelog)


def _claimed_store(path: Path, identity: StoreIdentity) -> None:
    store = PartitionStore.open(path, bucket_ms=HOUR, identity=identity)
    try:
        entry = Entry(first_seen=1, expires_at=HOUR, partition=0, offset=5)
        store.write({b"k": Change.of(entry)}, changelog_offset=7, stream_time=1)
    finally:
        store.close()


@pytest.mark.parametrize(
    "theirs",
    [
        OURS._replace(cluster="cluster-b"),  # the worker now points at another cluster
        OURS._replace(changelog_id="topic-2"),  # the topics were deleted and created again
        OURS._replace(cluster="", changelog_id=""),  # written before stores kept ids
    ],
    ids=["other-cluster", "recreated-changelog", "no-ids"],
)
def test_a_store_of_another_changelog_is_wiped_and_rebuilt_with_one_warning(
    tmp_path: Path, theirs: StoreIdentity, caplog: pytest.LogCaptureFixture
) -> None:
    """Same names, another changelog: the store is wiped (its claims would suppress real first deliveries)."""
    path = tmp_path / "s"
    _claimed_store(path, theirs)
    with caplog.at_level(logging.WARNING):
        store = directory.open_store(path, bucket_ms=HOUR, identity=OURS)
    try:
        assert store.get_many([b"k"]) == {}
        assert store.changelog_offset == -1
    finally:
        store.close()
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "wiping it and restoring from the changelog" in caplog.text


def test_a_store_of_this_changelog_is_kept(tmp_path: Path) -> None:
    """The same names and ids: the store opens with what it holds."""
    path = tmp_path / "s"
    _claimed_store(path, OURS)
    store = directory.open_store(path, bucket_ms=HOUR, identity=OURS)
    try:
        assert set(store.get_many([b"k"])) == {b"k"}
        assert store.changelog_offset == 7
    finally:
        store.close()


def test_a_store_under_another_name_is_refused_and_left_alone(tmp_path: Path) -> None:
    """Another partition's store in this place is a misconfiguration: refused, never wiped."""
    path = tmp_path / "s"
    _claimed_store(path, OURS._replace(partition=1))
    with pytest.raises(StoreIdentityError):
        directory.open_store(path, bucket_ms=HOUR, identity=OURS)
    PartitionStore.open(path, bucket_ms=HOUR, identity=OURS._replace(partition=1)).close()  # still there


def test_rebuild_empties_the_store_it_is_given(tmp_path: Path) -> None:
    """A store found ahead of its changelog (by the restore) is rebuilt empty, to restore from the start."""
    path = tmp_path / "s"
    _claimed_store(path, OURS)
    store = directory.open_store(path, bucket_ms=HOUR, identity=OURS)
    fresh = directory.rebuild(store, identity=OURS, why="store s is at offset 7, beyond the end (0)")
    try:
        assert fresh.changelog_offset == -1
        assert fresh.get_many([b"k"]) == {}
    finally:
        fresh.close()


async def test_a_released_store_says_what_it_left_on_disk(tmp_path: Path) -> None:
    """Released, a store reports the offset it keeps on disk once checked against its changelog's end (None
    before: it may lie beyond it); released with a wipe, -1 (nothing), and it is gone."""
    unchecked, kept, wiped = tmp_path / "unchecked", tmp_path / "kept", tmp_path / "wiped"
    for path in (unchecked, kept, wiped):
        _claimed_store(path, OURS)
    store = directory.open_store(unchecked, bucket_ms=HOUR, identity=OURS)
    assert directory.release(store, wipe=False, name="p0") is None
    assert directory.holds_store(unchecked)
    store = directory.open_store(kept, bucket_ms=HOUR, identity=OURS)
    assert await catch_up(store, CHANGELOG, reader=_reader_ending_at(8)) == (0, 8)  # level with the changelog
    assert directory.release(store, wipe=False, name="p1") == 7
    store = directory.open_store(wiped, bucket_ms=HOUR, identity=OURS)
    assert directory.release(store, wipe=True, name="p2") == -1
    assert not directory.holds_store(wiped)


async def test_a_store_beyond_its_changelogs_end_is_never_checked(tmp_path: Path) -> None:
    """A store at offset 7 of a changelog that ends at 5 is stale: the check raises and leaves it unchecked."""
    _claimed_store(tmp_path / "s", OURS)
    store = directory.open_store(tmp_path / "s", bucket_ms=HOUR, identity=OURS)
    with pytest.raises(StoreStaleError, match="beyond the end"):
        await catch_up(store, CHANGELOG, reader=_reader_ending_at(5))
    assert not store.checked
    assert directory.release(store, wipe=False, name="p0") is None


def test_an_empty_store_is_checked_from_the_start(tmp_path: Path) -> None:
    """A new (or wiped and made again) store holds nothing, which lies within any changelog: it claims -1."""
    store = directory.open_store(tmp_path / "s", bucket_ms=HOUR, identity=OURS)
    assert store.checked
    assert directory.release(store, wipe=False, name="p0") == -1


async def test_restores_share_a_budget_in_bytes() -> None:
    """With a 64-byte budget and 32-byte fetches, two restores run at once and the third waits for one to end."""
    budget = RestoreBudget(64)
    running: list[int] = []
    peak = 0
    release = asyncio.Event()

    async def restore(i: int) -> None:
        nonlocal peak
        async with budget.hold(32):
            running.append(i)
            peak = max(peak, len(running))
            await release.wait()
            running.remove(i)

    tasks = [asyncio.ensure_future(restore(i)) for i in range(3)]
    await asyncio.sleep(0.01)
    assert len(running) == 2
    release.set()
    await asyncio.gather(*tasks)
    assert peak == 2


async def test_a_level_store_restores_without_waiting_for_the_budget(tmp_path: Path) -> None:
    """A store already level with its changelog's end needs no fetch: its restore ends while every byte of
    the budget is held by others (48 partitions reopened after a clean handover do not queue two by two)."""
    store = directory.open_store(tmp_path / "s", bucket_ms=HOUR, identity=OURS)
    try:
        budget = RestoreBudget(64)
        restorer = Restorer(lambda: _reader_ending_at(0), budget, fetch_bytes=64)
        async with budget.hold(64):
            assert await asyncio.wait_for(restorer.restore(store, CHANGELOG), 1) == 0
        assert store.checked
    finally:
        store.close()


async def test_a_fetch_larger_than_the_whole_budget_still_runs_alone() -> None:
    """A restore whose fetch size exceeds the budget holds all of it rather than waiting forever."""
    budget = RestoreBudget(64)
    async with budget.hold(1000):
        pass


def test_a_second_worker_of_a_group_on_one_state_dir_is_refused_naming_the_first(tmp_path: Path) -> None:
    """Two workers of one group on one state dir would wait on each other's stores for minutes: the second is
    refused at once, naming the first's pid; another group, or the same one after a release, is fine."""
    topology = load(TOPOLOGY_PATH)
    first = directory.StateDirLock(tmp_path, topology, "g")
    first.acquire()
    try:
        with pytest.raises(StateDirInUseError, match=f"pid {os.getpid()}"):
            directory.StateDirLock(tmp_path, topology, "g").acquire()
        other = directory.StateDirLock(tmp_path, topology, "h")
        other.acquire()
        other.release()
    finally:
        first.release()
    again = directory.StateDirLock(tmp_path, topology, "g")
    again.acquire()
    again.release()


def test_the_worker_command_refuses_a_busy_state_dir_in_one_line_before_reaching_kafka(
    tmp_path: Path,
) -> None:
    """``pipeline worker`` on a state dir another worker of its group holds: exit 1, one line, at once."""
    topology = load(TOPOLOGY_PATH)
    held = directory.StateDirLock(tmp_path, topology, topology.app)
    held.acquire()
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "pipeline",
                "worker",
                "--bootstrap",
                "127.0.0.1:1",
                "--topology",
                str(TOPOLOGY_PATH),
                "--state-dir",
                str(tmp_path),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        held.release()
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "in use by another worker" in result.stderr


async def test_a_standby_takes_the_budget_only_when_no_restore_waits() -> None:
    """A restore waiting for the budget goes before a standby that asked earlier: a partition to serve never waits behind a copy."""
    budget = RestoreBudget(64)
    order: list[str] = []
    first = budget.hold(64)
    await first.__aenter__()

    async def take(name: str, *, urgent: bool) -> None:
        async with budget.hold(64, urgent=urgent):
            order.append(name)

    standby = asyncio.ensure_future(take("standby", urgent=False))
    await asyncio.sleep(0)
    restore = asyncio.ensure_future(take("restore", urgent=True))
    await asyncio.sleep(0)
    await first.__aexit__(None, None, None)
    await asyncio.gather(standby, restore)
    assert order == ["restore", "standby"]


def test_a_store_reopened_to_be_served_keeps_what_it_followed(tmp_path: Path) -> None:
    """A store opened to follow its changelog takes raw writes but refuses lookups; reopened served, it has them all."""
    path = tmp_path / "s"
    store = directory.open_store(path, bucket_ms=HOUR, identity=OURS, follow=True)
    entry = Entry(first_seen=1, expires_at=HOUR, partition=0, offset=5)
    store.write_raw([(b"k", entry.encode(), entry.expires_at)], changelog_offset=3, stream_time=1)
    with pytest.raises(StoreError, match="follow"):
        store.get_many([b"k"])
    served = directory.reopen(store, identity=OURS, follow=False)
    try:
        assert store.closed
        assert not served.follow
        assert served.get_many([b"k"]) == {b"k": entry}
        assert served.changelog_offset == 3
    finally:
        served.close()


async def test_a_store_restored_then_reopened_to_be_served_stays_checked(tmp_path: Path) -> None:
    """The restore checks the store it follows; the store reopened to be served keeps that, so the partition's
    position is claimed when it closes (an unchecked store is not)."""
    _claimed_store(tmp_path / "s", OURS)
    store = directory.open_store(tmp_path / "s", bucket_ms=HOUR, identity=OURS, follow=True)
    await catch_up(store, CHANGELOG, reader=_reader_ending_at(8))  # level
    served = directory.reopen(store, identity=OURS, follow=False)
    assert served.checked
    assert directory.release(served, wipe=False, name="p0") == 7
    unchecked = directory.reopen(
        directory.open_store(tmp_path / "s", bucket_ms=HOUR, identity=OURS, follow=True),
        identity=OURS,
        follow=False,
    )
    assert not unchecked.checked
    unchecked.close()


def test_reopening_checks_the_identity_again(tmp_path: Path) -> None:
    """A store reopened for another identity is refused, as at any open."""
    path = tmp_path / "s"
    store = directory.open_store(path, bucket_ms=HOUR, identity=OURS, follow=True)
    with pytest.raises(StoreIdentityError):
        directory.reopen(store, identity=OURS._replace(partition=3), follow=False)
    assert store.closed


def test_a_topologys_stores_have_buckets_a_tenth_of_its_largest_ttl() -> None:
    """The default topology's largest TTL is 91 days: every store's buckets are 9.1 days wide."""
    topology = load(TOPOLOGY_PATH)
    assert topology.max_ttl.days == 91
    assert directory.topology_bucket_ms(topology) == 91 * 24 * HOUR // 10


def test_the_stores_on_disk_report_their_changelog_positions_and_a_missing_state_dir_none(
    tmp_path: Path,
) -> None:
    """Each store of the topology and group on disk gives its changelog offset; no directory, no stores."""
    topology = load(TOPOLOGY_PATH)
    identity = OURS._replace(app=topology.app)
    assert directory.stored_positions(tmp_path / "nothing", topology, "group", {"raw": identity}) == {}
    for partition, offset in ((0, 4), (2, 9)):
        path = directory.store_path(tmp_path, topology, "group", TopicPartition("raw", partition))
        store = PartitionStore.open(path, bucket_ms=HOUR, identity=identity._replace(partition=partition))
        store.write({}, changelog_offset=offset, stream_time=0)
        store.close()
    found = directory.stored_positions(tmp_path, topology, "group", {"raw": identity})
    assert found == {TopicPartition("raw", 0): 4, TopicPartition("raw", 2): 9}


class RecordingOpener:
    """Opens stores as ``PartitionStore.open`` does and remembers how each was asked for (the simulation passes
    its own opener: whatever opens a store must go through the one it is given)."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(
        self, path: Path, *, bucket_ms: int, identity: StoreIdentity | None = None, follow: bool = False
    ) -> PartitionStore:
        self.calls.append({"path": path, "bucket_ms": bucket_ms, "identity": identity, "follow": follow})
        return PartitionStore.open(path, bucket_ms=bucket_ms, identity=identity, follow=follow)


def test_a_store_reopened_to_follow_follows_and_is_opened_through_the_opener_given(tmp_path: Path) -> None:
    """reopen(follow=True) gives a store that follows its changelog, opened by the caller's opener with the same
    path, bucket width and the identity asked."""
    path = tmp_path / "s"
    store = directory.open_store(path, bucket_ms=HOUR, identity=OURS)
    opener = RecordingOpener()
    again = directory.reopen(store, identity=OURS, follow=True, opener=opener)
    try:
        assert again.follow
        assert opener.calls == [{"path": path, "bucket_ms": HOUR, "identity": OURS, "follow": True}]
    finally:
        again.close()


def test_a_rebuilt_store_follows_as_the_old_one_did_and_carries_its_identity(tmp_path: Path) -> None:
    """rebuild keeps how the store was opened (following its changelog) and writes the identity into the new
    store: another partition's owner is refused it afterwards, through the opener given."""
    path = tmp_path / "s"
    _claimed_store(path, OURS)
    store = directory.open_store(path, bucket_ms=HOUR, identity=OURS, follow=True)
    opener = RecordingOpener()
    fresh = directory.rebuild(store, identity=OURS, why="stale", opener=opener)
    assert fresh.follow
    assert opener.calls == [{"path": path, "bucket_ms": HOUR, "identity": OURS, "follow": True}]
    fresh.write_raw([], changelog_offset=0, stream_time=0)
    fresh.close()
    with pytest.raises(StoreIdentityError):
        PartitionStore.open(path, bucket_ms=HOUR, identity=OURS._replace(partition=1)).close()


def test_only_the_topologys_own_stores_claim_positions_each_opened_to_follow(tmp_path: Path) -> None:
    """Among the lock file, a wiped store, a directory that is no store, a store of a topic not consumed and one
    of another changelog, only the group's own stores claim (a topic name with dashes included), each opened
    to follow and closed; a wiped store is not created again, and one refused does not end the scan."""
    topology = load(TOPOLOGY_PATH)
    identity = OURS._replace(app=topology.app, topic="web-raw")
    root = tmp_path / topology.app / "group"

    def store_at(name: str, ident: StoreIdentity, offset: int) -> None:
        store = PartitionStore.open(root / name, bucket_ms=HOUR, identity=ident)
        store.write({}, changelog_offset=offset, stream_time=0)
        store.close()

    root.mkdir(parents=True)
    (root / ".lock").write_text("123")
    (root / "web-raw-0").mkdir()  # wiped: nothing until it is opened again
    (root / "web-raw-x").mkdir()  # not a partition's store
    store_at(
        "other-0", OURS._replace(app=topology.app, topic="other"), 3
    )  # a topic this worker does not consume
    store_at("web-raw-1", identity._replace(partition=1, changelog_id="topic-old"), 5)  # another changelog's
    store_at("web-raw-2", identity._replace(partition=2), 9)
    opener = RecordingOpener()
    found = directory.stored_positions(tmp_path, topology, "group", {"web-raw": identity}, opener=opener)
    assert found == {TopicPartition("web-raw", 2): 9}
    assert not (root / "web-raw-0" / "CURRENT").exists()
    bucket_ms = directory.topology_bucket_ms(topology)
    assert opener.calls == [
        {
            "path": root / name,
            "bucket_ms": bucket_ms,
            "identity": identity._replace(partition=p),
            "follow": True,
        }
        for name, p in (("web-raw-1", 1), ("web-raw-2", 2))
    ]


class CorruptOnce(RecordingOpener):
    """An opener whose first open finds the store corrupt (as a torn write leaves it)."""

    def __call__(
        self, path: Path, *, bucket_ms: int, identity: StoreIdentity | None = None, follow: bool = False
    ) -> PartitionStore:
        if not self.calls:
            self.calls.append({"corrupt": True})
            raise StoreCorruptError(f"store {path} cannot be read")
        return super().__call__(path, bucket_ms=bucket_ms, identity=identity, follow=follow)


def test_a_corrupt_store_is_wiped_and_opened_again_as_it_was_asked_for(tmp_path: Path) -> None:
    """open_store finds the store corrupt: it wipes it and opens it again with the same bucket width, identity and
    follow, through the opener it was given; the new store is empty."""
    path = tmp_path / "s"
    _claimed_store(path, OURS)
    opener = CorruptOnce()
    store = directory.open_store(path, bucket_ms=HOUR, identity=OURS, opener=opener, follow=True)
    try:
        assert store.follow
        assert store.changelog_offset == -1
        assert opener.calls[1:] == [{"path": path, "bucket_ms": HOUR, "identity": OURS, "follow": True}]
    finally:
        store.close()


@pytest.mark.parametrize(("wipe", "claims"), [(True, -1), (False, None)])
def test_a_store_that_fails_to_close_claims_nothing_or_its_wipe(wipe: bool, claims: int | None) -> None:
    """release() of a store whose close fails: a wipe asked for is claimed as nothing (-1), otherwise its
    position is unknown (None); the failure is logged, not raised."""

    def failing_close() -> None:
        raise StoreError("close failed")

    store = SimpleNamespace(checked=True, changelog_offset=7, close=failing_close, path=Path("/nowhere"))
    assert directory.release(store, wipe=wipe, name="p0") == claims  # type: ignore[arg-type]


def test_the_state_dir_lock_is_a_file_of_the_group_readable_by_all_and_released_once(tmp_path: Path) -> None:
    """The lock is ``<state-dir>/<app>/<group>/.lock``, mode 0644 (less the umask), holding the pid; releasing it
    without having taken it, or twice, does nothing."""
    topology = load(TOPOLOGY_PATH)
    lock = directory.StateDirLock(tmp_path, topology, "g")
    lock.release()  # never taken
    lock.acquire()
    try:
        path = tmp_path / topology.app / "g" / ".lock"
        umask = os.umask(0)
        os.umask(umask)
        assert stat.S_IMODE(path.stat().st_mode) == 0o644 & ~umask
        assert path.read_text() == str(os.getpid())
    finally:
        lock.release()
    lock.release()


def test_a_state_dir_held_without_a_pid_is_refused_naming_another_process_and_the_remedy(
    tmp_path: Path,
) -> None:
    """A holder that wrote no pid (or bytes that are not text) is named "another process" or as best it can, and
    the error says to give each worker its own --state-dir."""
    topology = load(TOPOLOGY_PATH)
    path = tmp_path / topology.app / "g" / ".lock"
    path.parent.mkdir(parents=True)
    for content, holder in ((b"", "another process"), (b"\xff12", "\ufffd12")):
        path.write_bytes(content)
        fd = os.open(path, os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        try:
            with pytest.raises(StateDirInUseError) as refused:
                directory.StateDirLock(tmp_path, topology, "g").acquire()
            assert f"(pid {holder})" in str(refused.value)
            assert "give each worker its own --state-dir" in str(refused.value)
        finally:
            os.close(fd)


def test_a_state_dir_that_cannot_be_made_is_unusable_naming_it(tmp_path: Path) -> None:
    """A state dir under a file cannot be made: StoreUnusableError naming the directory and the cause."""
    (tmp_path / "file").write_text("")
    topology = load(TOPOLOGY_PATH)
    with pytest.raises(
        StoreUnusableError, match=rf"state dir {re.escape(str(tmp_path / 'file'))}.* cannot be used"
    ):
        directory.StateDirLock(tmp_path / "file", topology, "g").acquire()
