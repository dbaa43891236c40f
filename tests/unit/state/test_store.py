"""The RocksDB seen-set: atomic writes with their changelog offset, whole-bucket expiry, reopening."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rocksdict import Options, Rdict

from pipeline.errors import (
    StoreCorruptError,
    StoreError,
    StoreIdentityError,
    StoreLockedError,
    StoreUnusableError,
)
from pipeline.state.decision import Entry
from pipeline.state.store import MIN_BUCKET_MS, Change, PartitionStore, bucket_width
from pipeline.state.store_meta import StoreIdentity, classify_open_failure, classify_write_failure
from tests.unit.worker.fakes import FailingWrites

HOUR = 3_600_000
IDENTITY = StoreIdentity("webhooks", "workers", "webhooks.raw", 3, "webhooks-seen-changelog")


def _entry(first_seen: int, ttl: int = HOUR) -> Entry:
    return Entry(first_seen=first_seen, expires_at=first_seen + ttl, partition=0, offset=first_seen)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[PartitionStore]:
    opened = PartitionStore.open(tmp_path / "p0", bucket_ms=HOUR)
    yield opened
    opened.close()


def test_writes_are_read_back_with_their_offset_and_stream_time(store: PartitionStore) -> None:
    """A write stores entries, the changelog offset and the stream time together."""
    store.write({b"k1": Change.of(_entry(10), None)}, changelog_offset=41, stream_time=10)
    assert store.get_many([b"k1", b"k2"]) == {b"k1": _entry(10)}
    assert store.changelog_offset == 41
    assert store.stream_time == 10


def test_state_survives_closing_and_reopening(tmp_path: Path) -> None:
    """Closing releases the lock; reopening finds entries, offset and stream time."""
    path = tmp_path / "p1"
    first = PartitionStore.open(path, bucket_ms=HOUR)
    first.write({b"k": Change.of(_entry(5), None)}, changelog_offset=3, stream_time=5)
    first.close()
    again = PartitionStore.open(path, bucket_ms=2 * HOUR)
    try:
        assert again.get_many([b"k"]) == {b"k": _entry(5)}
        assert again.changelog_offset == 3
        assert again.bucket_ms == HOUR  # the width is fixed when the store is created
    finally:
        again.close()


def test_a_store_held_by_another_handle_is_locked_not_corrupt(store: PartitionStore) -> None:
    """Opening a store that is open elsewhere fails with the retriable StoreLockedError."""
    with pytest.raises(StoreLockedError) as caught:
        PartitionStore.open(store.path, bucket_ms=HOUR)
    assert caught.value.retriable


@pytest.mark.parametrize("method", ["write", "write_raw"])
def test_a_store_closed_while_its_failed_write_is_still_held_can_be_opened_again(
    tmp_path: Path, method: str
) -> None:
    """A failed write's error, kept (by a retry, a log record), holds no column family handle: once the store
    is closed the same process opens it again (a live handle keeps RocksDB's lock; simulation seed 3024)."""
    store = PartitionStore.open(tmp_path / "p0", bucket_ms=HOUR)
    store._db = FailingWrites(store._db)  # type: ignore[assignment]
    entry = _entry(HOUR)
    if method == "write":
        with pytest.raises(StoreError) as caught:
            store.write({b"k": Change(entry, None, entry.encode())}, changelog_offset=0, stream_time=HOUR)
    else:
        with pytest.raises(StoreError) as caught:
            store.write_raw([(b"k", entry.encode(), entry.expires_at)], changelog_offset=0, stream_time=HOUR)
    assert str(caught.value) == f"store {tmp_path / 'p0'}: write failed: IO error: No space left on device"
    assert (store.changelog_offset, store.stream_time) == (-1, 0)  # nothing moved
    store.close()
    PartitionStore.open(tmp_path / "p0", bucket_ms=HOUR).close()  # StoreLockedError while a handle lived
    assert caught.value is not None  # the error, and its traceback, were alive all along


def test_an_unreadable_store_is_reported_as_corrupt(tmp_path: Path) -> None:
    """Garbage where RocksDB's files should be is StoreCorruptError (the worker wipes and restores)."""
    path = tmp_path / "p2"
    path.mkdir()
    (path / "CURRENT").write_text("MANIFEST-999999\n")
    with pytest.raises(StoreCorruptError):
        PartitionStore.open(path, bucket_ms=HOUR)


def test_moving_a_key_to_a_later_bucket_removes_it_from_the_old_one(store: PartitionStore) -> None:
    """A re-claimed key lives in one bucket only."""
    old = _entry(0)
    new = _entry(5 * HOUR)
    store.write({b"k": Change.of(old, None)}, changelog_offset=None, stream_time=0)
    store.write({b"k": Change.of(new, old)}, changelog_offset=None, stream_time=5 * HOUR)
    assert store.get_many([b"k"]) == {b"k": new}
    assert store.key_count() == 1


def test_expire_drops_whole_buckets_once_stream_time_passes_them(store: PartitionStore) -> None:
    """Buckets whose keys all expired (plus a grace) are dropped; live ones stay."""
    store.write(
        {b"old": Change.of(_entry(0), None), b"new": Change.of(_entry(10 * HOUR), None)},
        changelog_offset=None,
        stream_time=10 * HOUR,
    )
    dropped = store.expire()
    assert dropped == 1
    assert store.get_many([b"old", b"new"]) == {b"new": _entry(10 * HOUR)}
    assert list(store.buckets()) == [11]


def test_expire_keeps_buckets_inside_the_grace_period(store: PartitionStore) -> None:
    """A bucket that ended less than one bucket width ago is kept for late records."""
    store.write({b"k": Change.of(_entry(0), None)}, changelog_offset=None, stream_time=int(1.5 * HOUR))
    assert store.expire() == 0
    assert store.get_many([b"k"])


def test_bucket_width_is_a_tenth_of_the_ttl_and_at_least_an_hour() -> None:
    """About ten live buckets per TTL, never narrower than an hour."""
    assert bucket_width(7 * 24 * HOUR) == int(16.8 * HOUR)
    assert bucket_width(HOUR) == MIN_BUCKET_MS
    assert (
        bucket_width(7 * 24 * HOUR + 7) == (7 * 24 * HOUR + 7) // 10
    )  # whole milliseconds: bucket names are integers
    assert isinstance(bucket_width(7 * 24 * HOUR + 7), int)


def test_stores_use_a_bloom_filter_and_bounded_memtables(store: PartitionStore) -> None:
    """Most lookups miss (every first copy), so tables carry a Bloom filter; memtables are bounded."""
    store.write({b"k": Change.of(_entry(1), None)}, changelog_offset=None, stream_time=1)
    options = max(store.path.glob("OPTIONS-*")).read_text()
    assert "bloomfilter" in options.lower()
    assert "write_buffer_size=8388608" in options


def _open(path: Path, identity: StoreIdentity = IDENTITY) -> PartitionStore:
    return PartitionStore.open(path, bucket_ms=HOUR, identity=identity)


@pytest.mark.parametrize(
    "other",
    [
        IDENTITY._replace(app="billing"),
        IDENTITY._replace(group="other-workers"),
        IDENTITY._replace(topic="webhooks.effects"),
        IDENTITY._replace(partition=4),
        IDENTITY._replace(changelog="webhooks-effects-changelog"),
    ],
    ids=["app", "group", "topic", "partition", "changelog"],
)
def test_a_store_of_another_identity_is_refused_and_left_alone(tmp_path: Path, other: StoreIdentity) -> None:
    """Any field of the identity differing refuses the open with both identities named; the data stays."""
    path = tmp_path / "p"
    first = _open(path)
    first.write({b"k": Change.of(_entry(5))}, changelog_offset=7, stream_time=5)
    first.close()
    with pytest.raises(StoreIdentityError) as caught:
        _open(path, other)
    message = str(caught.value)
    assert "\n" not in message
    assert IDENTITY.describe() in message
    assert other.describe() in message
    assert not caught.value.retriable
    again = _open(path)  # refused without touching (or locking) anything
    try:
        assert again.get_many([b"k"]) == {b"k": _entry(5)}
        assert again.changelog_offset == 7
    finally:
        again.close()


def test_the_identity_is_kept_across_reopening(tmp_path: Path) -> None:
    """A store created for an identity opens again for the same identity."""
    _open(tmp_path / "p").close()
    _open(tmp_path / "p").close()


def test_a_version_1_store_with_data_is_corrupt(tmp_path: Path) -> None:
    """A store written by format 1 (no identity) is StoreCorruptError: the worker wipes and restores it."""
    path = tmp_path / "p"
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    db = Rdict(
        str(path), options, column_families={"meta": Options(raw_mode=True), "b100": Options(raw_mode=True)}
    )
    meta, bucket = db.get_column_family("meta"), db.get_column_family("b100")
    meta[b"version"] = b"1"
    meta[b"bucket_ms"] = str(HOUR).encode()
    meta[b"changelog_offset"] = b"41"
    bucket[b"k"] = _entry(1).encode()
    for family in (meta, bucket, db):
        family.close()
    del meta, bucket, db
    with pytest.raises(StoreCorruptError):
        _open(path)
    PartitionStore.wipe(path)
    assert _open(path).changelog_offset == -1


def test_a_format_2_store_with_data_but_no_identity_is_corrupt(tmp_path: Path) -> None:
    """Data without an identity cannot be vouched for: StoreCorruptError."""
    path = tmp_path / "p"
    unchecked = PartitionStore.open(path, bucket_ms=HOUR)  # the temporary identity-less open
    unchecked.write({b"k": Change.of(_entry(1))}, changelog_offset=1, stream_time=1)
    unchecked.close()
    with pytest.raises(StoreCorruptError):
        _open(path)


def test_a_path_that_is_a_file_is_unusable(tmp_path: Path) -> None:
    """A file where the store's directory should be is StoreUnusableError (retriable, never wiped)."""
    path = tmp_path / "p"
    path.write_text("not a store")
    with pytest.raises(StoreUnusableError) as caught:
        _open(path)
    assert caught.value.retriable
    with pytest.raises(
        StoreUnusableError, match=f"store {re.escape(str(path))} is not a directory; not wiping it"
    ):
        PartitionStore.wipe(path)
    assert path.read_text() == "not a store"


def test_a_path_under_a_file_is_unusable(tmp_path: Path) -> None:
    """A store whose parent is a file cannot be created: StoreUnusableError."""
    (tmp_path / "state").write_text("")
    with pytest.raises(StoreUnusableError):
        _open(tmp_path / "state" / "p")


@pytest.mark.skipif(
    os.geteuid() == 0, reason="root ignores directory permissions; the classifier test covers the message"
)
def test_a_read_only_directory_is_unusable(tmp_path: Path) -> None:
    """A directory the worker may not write is StoreUnusableError."""
    path = tmp_path / "p"
    path.mkdir(mode=0o500)
    with pytest.raises(StoreUnusableError):
        _open(path)


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("IO error: While lock file: /s/LOCK: Resource temporarily unavailable", StoreLockedError),
        ("IO error: While open a file for lock: /s/LOCK: Permission denied", StoreUnusableError),
        ("IO error: While lock file: /s/LOCK: Read-only file system", StoreUnusableError),
        ("IO error: No space left on device: While appending to file: /s/000004.log", StoreUnusableError),
        ("Not a directory (os error 20)", StoreUnusableError),
        ("Corruption: bad record length", StoreCorruptError),
        ("Corruption: checksum mismatch in file /s/000012.sst", StoreCorruptError),
        (
            "IO error: No such file or directory: While opening a file for sequentially reading: /s/MANIFEST-000009",
            StoreCorruptError,
        ),
        ("Invalid argument: something RocksDB has not said before", StoreUnusableError),
    ],
)
def test_open_failures_are_classified_by_what_the_caller_can_do(text: str, kind: type[StoreError]) -> None:
    """Lock → wait; unusable or unknown → wait, never wipe; only corruption → wipe and restore."""
    error = classify_open_failure(Path("/s"), Exception(text))
    assert type(error) is kind
    assert text in str(error)


def test_write_failures_from_the_disk_are_unusable() -> None:
    """A full or read-only disk during a write is StoreUnusableError; anything else plain StoreError."""
    full = classify_write_failure(Path("/s"), Exception("IO error: No space left on device"), "write")
    assert type(full) is StoreUnusableError
    other = classify_write_failure(Path("/s"), Exception("Invalid argument: batch"), "write")
    assert type(other) is StoreError
    assert str(full) == "store /s: write failed: IO error: No space left on device"
    assert str(other) == "store /s: write failed: Invalid argument: batch"


def test_an_identity_describes_itself_in_one_line_with_unknown_fields_as_question_marks() -> None:
    """Every field by name, one space apart; an empty one (a store of an older format) is '?'."""
    assert IDENTITY.describe() == (
        "app=webhooks group=workers topic=webhooks.raw partition=3 changelog=webhooks-seen-changelog"
        " cluster=? changelog_id=?"
    )


def test_wipe_deletes_a_store(tmp_path: Path) -> None:
    """A directory with RocksDB's CURRENT file is deleted."""
    store = _open(tmp_path / "p")
    store.close()
    PartitionStore.wipe(tmp_path / "p")
    assert not (tmp_path / "p").exists()


def test_wipe_refuses_a_directory_that_is_not_a_store(tmp_path: Path) -> None:
    """Only what the changelog can restore is wiped: a non-empty directory without CURRENT stays."""
    path = tmp_path / "p"
    path.mkdir()
    (path / "precious.txt").write_text("keep me")
    with pytest.raises(
        StoreUnusableError, match=r"does not look like a store \(no CURRENT file\); not wiping it"
    ):
        PartitionStore.wipe(path)
    assert (path / "precious.txt").read_text() == "keep me"


def test_wipe_says_which_store_it_could_not_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store directory that cannot be listed is StoreUnusableError naming it and the OS error; nothing is deleted."""
    path = tmp_path / "p"
    path.mkdir()

    def unreadable(self: Path) -> Iterator[Path]:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "iterdir", unreadable)
    with pytest.raises(
        StoreUnusableError, match=f"store {re.escape(str(path))} cannot be listed: .*Permission denied"
    ):
        PartitionStore.wipe(path)
    assert path.is_dir()


def test_wipe_says_which_store_it_could_not_delete(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A delete that fails (a busy or read-only disk) is StoreUnusableError naming the store and the OS error."""
    store = _open(tmp_path / "p")
    store.close()

    def busy(path: Path) -> None:
        raise OSError(16, "Device or resource busy")

    monkeypatch.setattr(shutil, "rmtree", busy)
    with pytest.raises(
        StoreUnusableError,
        match=f"store {re.escape(str(tmp_path / 'p'))} could not be wiped: .*resource busy",
    ):
        PartitionStore.wipe(tmp_path / "p")


class _FailingDb:
    """The real database, except that ``write`` fails as a full disk does."""

    def __init__(self, db: Any) -> None:
        self._db = db

    def write(self, *args: Any) -> None:
        raise Exception("IO error: No space left on device: While appending to file")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


def test_a_failed_write_leaves_offset_and_stream_time_unchanged(store: PartitionStore) -> None:
    """The offset in memory never runs ahead of the disk: a failed write moves nothing."""
    store.write({b"a": Change.of(_entry(1))}, changelog_offset=10, stream_time=1)
    real = store._db
    store._db = _FailingDb(real)  # type: ignore[assignment]
    try:
        with pytest.raises(StoreUnusableError):
            store.write({b"b": Change.of(_entry(2))}, changelog_offset=11, stream_time=2)
        with pytest.raises(StoreUnusableError):
            store.write_raw(
                [(b"c", _entry(3).encode(), _entry(3).expires_at)], changelog_offset=12, stream_time=3
            )
    finally:
        store._db = real
    assert (store.changelog_offset, store.stream_time) == (10, 1)
    assert store.get_many([b"a", b"b", b"c"]) == {b"a": _entry(1)}


def test_a_write_to_a_closed_store_is_a_store_error(tmp_path: Path) -> None:
    """Writing after close raises StoreError (not rocksdict's own exception) and moves nothing."""
    store = _open(tmp_path / "p")
    store.close()
    with pytest.raises(StoreError):
        store.write({b"a": Change.of(_entry(1))}, changelog_offset=1, stream_time=1)
    assert store.changelog_offset == -1


def test_close_is_idempotent_and_releases_the_lock(tmp_path: Path) -> None:
    """A second close does nothing; the store can be opened again after the first."""
    store = _open(tmp_path / "p")
    store.close()
    store.close()
    _open(tmp_path / "p").close()


def test_write_raw_then_get_many_returns_the_newest_entry(store: PartitionStore) -> None:
    """Raw writes keep an older copy in an earlier bucket; get_many picks the largest expires_at."""
    old = _entry(0)
    new = old._replace(expires_at=old.expires_at + 5 * HOUR, duplicates=1)
    store.write_raw([(b"k", old.encode(), old.expires_at)], changelog_offset=0, stream_time=0)
    store.write_raw([(b"k", new.encode(), new.expires_at)], changelog_offset=1, stream_time=5)
    assert store.get_many([b"k"]) == {b"k": new}
    assert len(list(store.buckets())) == 2
    assert (store.changelog_offset, store.stream_time) == (1, 5)


def test_a_failed_read_is_a_store_error_not_a_crash(tmp_path: Path) -> None:
    """RocksDB failing a read (rocksdict raises a bare Exception) is a StoreError the partition can act on."""
    store = PartitionStore.open(tmp_path / "r", bucket_ms=HOUR, identity=IDENTITY)
    try:
        store.write({b"k": Change.of(Entry(1, HOUR, 0, 1))}, changelog_offset=1, stream_time=1)

        class Failing:
            def get(self, *_: object) -> object:
                raise Exception("IO error: while reading")

        store._buckets = {b: Failing() for b in store._buckets}  # type: ignore[misc]
        with pytest.raises(StoreError, match="IO error"):
            store.get_many([b"k"])
    finally:
        store._buckets = {}
        store.close()


def test_an_entry_that_cannot_be_decoded_is_corruption(tmp_path: Path) -> None:
    """A value that is not an entry makes get_many raise StoreCorruptError (the partition wipes and restores)."""
    store = PartitionStore.open(tmp_path / "c", bucket_ms=HOUR, identity=IDENTITY)
    try:
        store.write({b"k": Change.of(Entry(1, HOUR, 0, 1))}, changelog_offset=1, stream_time=1)
        [bucket] = list(store.buckets())
        store._buckets[bucket][b"k"] = b"garbage"
        with pytest.raises(StoreCorruptError):
            store.get_many([b"k"])
    finally:
        store.close()


def test_a_stores_disk_bytes_are_the_sizes_of_all_its_files(tmp_path: Path) -> None:
    """The gauge of a store's size adds up every file under its directory, in every subdirectory."""
    store = _open(tmp_path / "p")
    try:
        (tmp_path / "p" / "extra").mkdir()
        (tmp_path / "p" / "extra" / "blob").write_bytes(b"x" * 1234)
        files = [f for f in (tmp_path / "p").rglob("*") if f.is_file()]
        assert store.disk_bytes() == sum(f.stat().st_size for f in files)
        assert store.disk_bytes() >= 1234
    finally:
        store.close()


def _at(store: PartitionStore, stream_time: int, **entries: Entry) -> None:
    """Write ``entries`` (none: only move stream time) at ``stream_time``."""
    changes = {key.encode(): Change.of(entry, None) for key, entry in entries.items()}
    store.write(changes, changelog_offset=None, stream_time=stream_time)


def test_a_bucket_is_dropped_exactly_when_stream_time_reaches_its_end_plus_the_grace(
    store: PartitionStore,
) -> None:
    """Keys expiring in [1 h, 2 h) live in bucket 1: with the default grace of one bucket it goes at stream time
    3 h, not a millisecond before; a grace of 0 drops it at 2 h."""
    _at(store, 0, k=_entry(0))  # expires at 1 h: bucket 1
    _at(store, 2 * HOUR)
    assert store.expire() == 0
    assert store.expire(grace_ms=HOUR - 1) == 0
    _at(store, 3 * HOUR - 1)
    assert store.expire() == 0
    _at(store, 3 * HOUR)
    assert store.expire() == 1
    assert list(store.buckets()) == []


def test_no_grace_drops_a_bucket_as_soon_as_stream_time_passes_it(store: PartitionStore) -> None:
    """expire(grace_ms=0) drops bucket 1 at stream time 2 h, where the default grace keeps it."""
    _at(store, 2 * HOUR, k=_entry(0))
    assert store.expire() == 0
    assert store.expire(grace_ms=0) == 1


def test_the_keys_expired_add_up_and_a_dropped_bucket_is_made_anew_for_a_late_key(
    store: PartitionStore,
) -> None:
    """Two expiries of one key each: keys_expired is 2. A key written afterwards into the dropped bucket's range (a
    late record) gets a new bucket, and the store reads it."""
    _at(store, 0, a=_entry(0), b=_entry(2 * HOUR))  # buckets 1 and 3
    _at(store, 3 * HOUR)
    assert store.expire() == 1
    _at(store, 5 * HOUR)
    assert store.expire() == 1
    assert store.keys_expired == 2
    late = _entry(0)
    store.write_raw([(b"late", late.encode(), late.expires_at)], changelog_offset=-1, stream_time=5 * HOUR)
    assert list(store.buckets()) == [1]
    assert store.get_many([b"late"]) == {b"late": late}


class FailingDrops(FailingWrites):
    """A store's database that drops its first bucket and fails on the next, as a disk error would."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.drops = 0

    def write(self, *args: Any) -> None:
        self._inner.write(*args)

    def drop_column_family(self, name: str) -> None:
        self.drops += 1
        if self.drops > 1:
            raise Exception("IO error: No space left on device")  # rocksdict raises bare Exception
        self._inner.drop_column_family(name)


def test_a_bucket_that_cannot_be_dropped_stays_counting_what_was_dropped_and_naming_it(
    store: PartitionStore,
) -> None:
    """The second of two expired buckets fails to drop: StoreError naming the store, the bucket and the cause;
    the first is gone and counted, the second stays."""
    _at(store, 0, a=_entry(0), b=_entry(HOUR))  # buckets 1 and 2
    _at(store, 10 * HOUR)
    store._db = FailingDrops(store._db)  # type: ignore[assignment]
    with pytest.raises(StoreError, match=rf"{re.escape(str(store.path))}.*dropping bucket b2.*No space left"):
        store.expire()
    assert store.keys_expired == 1
    assert list(store.buckets()) == [2]


class FailingFamilies(FailingWrites):
    """A store's database that cannot create a column family, or close, as a full disk makes RocksDB's fail."""

    def write(self, *args: Any) -> None:
        self._inner.write(*args)

    failing = "create_column_family"  # or "get_column_family_handle": the family is made, its handle fails

    def create_column_family(self, *args: Any) -> Any:
        if self.failing == "create_column_family":
            raise Exception("IO error: No space left on device")  # rocksdict raises bare Exception
        return self._inner.create_column_family(*args)

    def get_column_family_handle(self, *args: Any) -> Any:
        if self.failing == "get_column_family_handle":
            raise Exception("IO error: No space left on device")
        return self._inner.get_column_family_handle(*args)

    def close(self) -> None:
        self._inner.close()
        raise Exception("IO error: close")


@pytest.mark.parametrize("failing", ["create_column_family", "get_column_family_handle"])
def test_a_bucket_that_cannot_be_made_fails_the_write_naming_it_and_leaves_no_trace(
    store: PartitionStore, failing: str
) -> None:
    """Creating bucket b2 (or taking its handle) fails: StoreUnusableError naming the store, the bucket and the
    cause; the store keeps no half-made bucket and its position does not move."""
    database = FailingFamilies(store._db)
    database.failing = failing
    store._db = database  # type: ignore[assignment]
    entry = _entry(HOUR)  # expires at 2 h: bucket 2
    with pytest.raises(StoreUnusableError) as caught:
        store.write({b"k": Change.of(entry, None)}, changelog_offset=3, stream_time=HOUR)
    assert (
        str(caught.value)
        == f"store {store.path}: creating bucket b2 failed: IO error: No space left on device"
    )
    assert list(store.buckets()) == []
    assert store.changelog_offset == -1
    store._db = database._inner  # the fixture closes it


def test_a_close_that_fails_names_the_store_and_the_cause(tmp_path: Path) -> None:
    """RocksDB failing to close the database: StoreError naming the store and the cause (the database is released
    all the same: a second close does nothing)."""
    store = PartitionStore.open(tmp_path / "p", bucket_ms=HOUR)
    store._db = FailingFamilies(store._db)  # type: ignore[assignment]
    with pytest.raises(StoreError) as caught:
        store.close()
    assert str(caught.value) == f"store {tmp_path / 'p'}: close failed: IO error: close"
    store.close()


def test_a_write_with_an_older_changelog_offset_never_moves_the_position_back(store: PartitionStore) -> None:
    """The store's changelog offset only grows: a later write carrying an older offset keeps it, in memory and on
    disk."""
    store.write({}, changelog_offset=9, stream_time=0)
    store.write({b"k": Change.of(_entry(HOUR), None)}, changelog_offset=4, stream_time=0)
    assert store.changelog_offset == 9


def test_a_key_moved_to_a_later_bucket_leaves_no_copy_in_its_old_one(store: PartitionStore) -> None:
    """A key whose expiry moves from bucket 1 (1.5 h) to bucket 3 (3.5 h) is deleted from bucket 1 in the same
    write: the store counts it once."""
    first = Entry(first_seen=0, expires_at=int(1.5 * HOUR), partition=0, offset=0)
    later = first._replace(expires_at=int(3.5 * HOUR))
    store.write({b"k": Change.of(first, None)}, changelog_offset=None, stream_time=0)
    store.write({b"k": Change.of(later, first)}, changelog_offset=None, stream_time=HOUR)
    assert store.key_count() == 1
    assert store.get_many([b"k"]) == {b"k": later}


def test_an_identity_that_is_not_one_says_so() -> None:
    """Bytes that are not a store identity raise ValueError saying what they are not."""
    with pytest.raises(ValueError, match="not a store identity"):
        StoreIdentity.decode(b'{"app": "a"}')
