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
    StoreStaleError,
    StoreUnusableError,
)
from pipeline.state import store_meta
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
        assert again.stream_time == 5
        assert again.bucket_ms == HOUR  # the width is fixed when the store is created
    finally:
        again.close()


def test_a_store_held_by_another_handle_is_locked_not_corrupt(store: PartitionStore) -> None:
    """Opening a store that is open elsewhere fails with the retriable StoreLockedError naming it."""
    with pytest.raises(
        StoreLockedError, match=f"^store {re.escape(str(store.path))} is held by another process"
    ) as caught:
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


def _memtables(path: Path) -> dict[str, str]:
    """The memtable of each section of the store's newest OPTIONS file (the database's, then each family's)."""
    found: dict[str, str] = {}
    section = ""
    for line in max(path.glob("OPTIONS-*")).read_text().splitlines():
        if line.startswith("["):
            section = line
        elif line.strip().startswith(("memtable_factory=", "allow_concurrent_memtable_write=")):
            found[section] = line.strip()
    return found


@pytest.mark.parametrize(
    ("reopened", "follow"),
    [(False, True), (False, False), (True, True), (True, False)],
    ids=["new-to-follow", "new-to-be-served", "reopened-to-follow", "reopened-to-be-served"],
)
def test_a_store_has_the_memtables_of_its_mode_in_every_family(
    tmp_path: Path, *, reopened: bool, follow: bool
) -> None:
    """A store with meta and two buckets, made or reopened to follow its changelog, has vector memtables (and no
    concurrent memtable writes) in every family; to be served, skip lists; whatever it was opened as before."""
    path = tmp_path / "p"
    entries = [(b"a", _entry(0).encode(), HOUR), (b"b", _entry(HOUR).encode(), 2 * HOUR)]
    first = PartitionStore.open(path, bucket_ms=HOUR, identity=IDENTITY, follow=follow != reopened)
    first.write_raw(entries, changelog_offset=1, stream_time=0)
    first.close()
    if reopened:
        PartitionStore.open(path, bucket_ms=HOUR, identity=IDENTITY, follow=follow).close()
    memtable = (
        "memtable_factory={id=VectorRepFactory;count=0;}" if follow else "memtable_factory=SkipListFactory"
    )
    assert _memtables(path) == {
        "[DBOptions]": f"allow_concurrent_memtable_write={'false' if follow else 'true'}",
        **{f'[CFOptions "{name}"]': memtable for name in ("default", "meta", "b1", "b2")},
    }


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


def _handmade(path: Path, meta: dict[bytes, bytes], families: tuple[str, ...] = ()) -> None:
    """A store written by hand, as an older (or a damaged) one is: ``meta`` in its meta family, and a key in each
    of ``families``."""
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    db = Rdict(
        str(path), options, column_families={name: Options(raw_mode=True) for name in ("meta", *families)}
    )
    written = [db.get_column_family(name) for name in ("meta", *families)]
    for key, value in meta.items():
        written[0][key] = value
    for family in written[1:]:
        family[b"k"] = _entry(1).encode()
    for family in (*written, db):
        family.close()
    del written, db


def test_a_version_1_store_with_data_is_corrupt(tmp_path: Path) -> None:
    """A store written by format 1 (no identity) is StoreCorruptError: the worker wipes and restores it."""
    path = tmp_path / "p"
    _handmade(
        path, {b"version": b"1", b"bucket_ms": str(HOUR).encode(), b"changelog_offset": b"41"}, ("b100",)
    )
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


@pytest.mark.parametrize(
    ("offset", "keys"),
    [(1, {}), (None, {b"k": Change.of(_entry(1))}), (1, {b"k": Change.of(_entry(1))})],
    ids=["an-offset", "keys", "both"],
)
def test_a_store_with_keys_or_an_offset_but_no_identity_is_corrupt_saying_so(
    tmp_path: Path, offset: int | None, keys: dict[bytes, Change]
) -> None:
    """Either a changelog offset or a bucket of keys is data: without an identity nothing vouches for it, so
    opening it for an identity is StoreCorruptError saying what it has and lacks."""
    path = tmp_path / "p"
    unchecked = PartitionStore.open(path, bucket_ms=HOUR)  # the temporary identity-less open
    unchecked.write(keys, changelog_offset=offset, stream_time=1)
    unchecked.close()
    with pytest.raises(StoreCorruptError, match=f"^store {re.escape(str(path))} has data but no identity$"):
        _open(path)


def test_an_empty_store_made_without_an_identity_takes_the_first_it_is_opened_with(tmp_path: Path) -> None:
    """A store with no data and no identity is given the identity it is next opened with, and is then refused to
    any other."""
    path = tmp_path / "p"
    PartitionStore.open(path, bucket_ms=HOUR).close()
    _open(path).close()
    with pytest.raises(StoreIdentityError):
        _open(path, IDENTITY._replace(partition=4))


def test_an_empty_store_keeps_the_bucket_width_it_was_made_with(tmp_path: Path) -> None:
    """The width is fixed when the store is made, data or not: an empty store opened with another keeps its own."""
    path = tmp_path / "p"
    _open(path).close()
    again = PartitionStore.open(path, bucket_ms=2 * HOUR, identity=IDENTITY)
    try:
        assert again.bucket_ms == HOUR
    finally:
        again.close()


@pytest.mark.parametrize(
    ("version", "families"),
    [(b"1", ()), (b"1", ("b100",)), (b"3", ()), (b"", ("b100",))],
    ids=["1-empty", "1-with-keys", "3-empty", "blank-with-keys"],
)
def test_a_store_of_another_format_is_corrupt_naming_both_formats(
    tmp_path: Path, version: bytes, families: tuple[str, ...]
) -> None:
    """Any format but 2, with data or without, is StoreCorruptError naming the format found and the one expected
    (the worker wipes and restores it; only a store without any meta is new)."""
    path = tmp_path / "p"
    _handmade(path, {b"version": version, b"bucket_ms": str(HOUR).encode()}, families)
    with pytest.raises(
        StoreCorruptError,
        match=f"^store {re.escape(str(path))} has format {re.escape(repr(version))}, expected b'2'$",
    ):
        _open(path)


def test_a_store_without_a_bucket_width_is_corrupt_saying_so(tmp_path: Path) -> None:
    """Format 2 without a bucket width cannot say which bucket a key is in: StoreCorruptError saying so."""
    path = tmp_path / "p"
    _handmade(path, {b"version": b"2", b"changelog_offset": b"4"})
    with pytest.raises(StoreCorruptError, match=f"^store {re.escape(str(path))} has no bucket width$"):
        _open(path)


@pytest.mark.parametrize(
    ("meta", "cause"),
    [
        ({b"bucket_ms": b"an hour"}, "invalid literal for int"),
        ({b"bucket_ms": str(HOUR).encode(), b"identity": b"{not json"}, "not a store identity"),
    ],
    ids=["width", "identity"],
)
def test_a_store_whose_metadata_cannot_be_read_is_corrupt_naming_it_and_the_cause(
    tmp_path: Path, meta: dict[bytes, bytes], cause: str
) -> None:
    """A bucket width that is not a number, or an identity that is not one, is StoreCorruptError naming the store
    and what could not be read (the worker wipes and restores it)."""
    path = tmp_path / "p"
    _handmade(path, {b"version": b"2", **meta})
    with pytest.raises(
        StoreCorruptError, match=f"^store {re.escape(str(path))} has unreadable metadata: .*{cause}"
    ):
        _open(path)


def test_a_new_store_whose_metadata_cannot_be_written_is_unusable_naming_it_and_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RocksDB failing the first write of a new store's metadata (a full disk: rocksdict's bare Exception) is
    StoreUnusableError naming the store and the cause; the database is closed, so the store opens once the disk
    takes writes again."""
    path = tmp_path / "p"

    def full_disk(*_: object) -> None:
        # rocksdict raises bare Exception
        raise Exception("IO error: No space left on device: While appending to file")

    monkeypatch.setattr(store_meta, "write_meta", full_disk)
    with pytest.raises(
        StoreUnusableError,
        match=f"^store {re.escape(str(path))} cannot be used: IO error: No space left on device: While appending",
    ):
        _open(path)
    monkeypatch.undo()
    _open(path).close()


@pytest.mark.parametrize(
    ("stored", "asked", "caches", "not_the_one"),
    [
        (("", ""), ("east", "t-2"), "of cluster ? (topic id ?)", "of cluster east (topic id t-2)"),
        (("east", "t-1"), ("", ""), "of cluster east (topic id t-1)", "of cluster ? (topic id ?)"),
        (
            ("east", "t-1"),
            ("east", "t-2"),
            "of cluster east (topic id t-1)",
            "of cluster east (topic id t-2)",
        ),
        (
            ("east", "t-1"),
            ("west", "t-1"),
            "of cluster east (topic id t-1)",
            "of cluster west (topic id t-1)",
        ),
    ],
    ids=["ids-not-kept", "ids-not-asked", "topic-made-again", "other-cluster"],
)
def test_a_store_of_another_changelog_is_stale_naming_both_clusters_and_topic_ids(
    tmp_path: Path, stored: tuple[str, str], asked: tuple[str, str], caches: str, not_the_one: str
) -> None:
    """Same names, another cluster or changelog topic id: StoreStaleError (wiped and rebuilt) naming what the
    store caches and what was asked, an id not known as '?'."""
    path = tmp_path / "p"
    _open(path, IDENTITY._replace(cluster=stored[0], changelog_id=stored[1])).close()
    with pytest.raises(StoreStaleError) as caught:
        _open(path, IDENTITY._replace(cluster=asked[0], changelog_id=asked[1]))
    assert str(caught.value) == (
        f"store {path} caches changelog webhooks-seen-changelog {caches}, not the one {not_the_one}"
    )


def test_a_path_that_is_a_file_is_unusable(tmp_path: Path) -> None:
    """A file where the store's directory should be is StoreUnusableError naming it (retriable, never wiped)."""
    path = tmp_path / "p"
    path.write_text("not a store")
    with pytest.raises(
        StoreUnusableError,
        match=f"store {re.escape(str(path))} cannot be used: it exists and is not a directory",
    ) as caught:
        _open(path)
    assert caught.value.retriable
    with pytest.raises(
        StoreUnusableError, match=f"store {re.escape(str(path))} is not a directory; not wiping it"
    ):
        PartitionStore.wipe(path)
    assert path.read_text() == "not a store"


def test_a_path_under_a_file_is_unusable(tmp_path: Path) -> None:
    """A store whose parent is a file cannot be created: StoreUnusableError naming the store and the OS error."""
    (tmp_path / "state").write_text("")
    path = tmp_path / "state" / "p"
    with pytest.raises(
        StoreUnusableError, match=f"store {re.escape(str(path))} cannot be used: .*Not a directory"
    ):
        _open(path)


def test_a_store_is_made_with_the_directories_above_it_that_are_missing(tmp_path: Path) -> None:
    """A store two directories below any that exists is made, with both directories."""
    path = tmp_path / "state" / "webhooks.raw" / "p"
    _open(path).close()
    assert (path / "CURRENT").is_file()


@pytest.mark.parametrize("denied", [os.W_OK, os.X_OK], ids=["not-writable", "not-searchable"])
def test_a_directory_the_worker_may_not_write_in_is_unusable_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, denied: int
) -> None:
    """The store's directory must be writable and searchable: either denied (as the OS answers for a mode of 0o500
    or 0o600, even to root here) is StoreUnusableError naming the store, before RocksDB is asked."""
    path = tmp_path / "p"
    path.mkdir()
    asked = os.access

    def access(where: Any, mode: int) -> bool:
        return not mode & denied if Path(where) == path else asked(where, mode)

    monkeypatch.setattr(os, "access", access)
    with pytest.raises(
        StoreUnusableError,
        match=f"store {re.escape(str(path))} cannot be used: the directory is not writable",
    ):
        _open(path)
    assert list(path.iterdir()) == []


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


@pytest.mark.parametrize(
    "text",
    [
        "IO error: While appending to file: /s/000012.log: Input/output error",
        "io error: fsync /s/000012.sst",
    ],
    ids=["eio", "lower-case"],
)
def test_any_io_error_during_a_write_is_unusable_whatever_the_os_error_inside(text: str) -> None:
    """RocksDB's IO error, in any case, is StoreUnusableError even when the OS error inside is none of those known."""
    error = classify_write_failure(Path("/s"), Exception(text), "write")
    assert type(error) is StoreUnusableError
    assert str(error) == f"store /s: write failed: {text}"


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


@pytest.mark.parametrize(
    ("offset", "checked"), [(None, True), (0, False), (1, False)], ids=["empty", "at-0", "at-1"]
)
def test_only_a_store_without_a_changelog_offset_is_taken_as_checked(
    tmp_path: Path, offset: int | None, *, checked: bool
) -> None:
    """An empty store's position lies within any changelog; one at an offset, 0 included, is checked against its
    changelog's end (a restore or a standby's round) before its position is claimed."""
    first = _open(tmp_path / "p")
    first.write({}, changelog_offset=offset, stream_time=0)
    first.close()
    again = _open(tmp_path / "p")
    try:
        assert (again.changelog_offset, again.checked) == (-1 if offset is None else offset, checked)
    finally:
        again.close()


def test_only_families_named_b_and_a_number_are_buckets(tmp_path: Path) -> None:
    """A store's families other than b<n> (b1 the one-digit bucket; bx5, backup, meta and RocksDB's default not
    buckets) are left alone: the store opens with bucket 1 alone, and reads its key."""
    path = tmp_path / "p"
    _open(path).close()
    _handmade(path, {}, ("b1", "bx5", "backup"))  # a key expiring at 1 h + 1 ms in each
    again = _open(path)
    try:
        assert list(again.buckets()) == [1]
        assert again.get_many([b"k"]) == {b"k": _entry(1)}
    finally:
        again.close()


@pytest.mark.parametrize("failing", [False, True], ids=["all-dropped", "the-second-fails"])
def test_the_keys_of_buckets_dropped_together_add_up_onto_what_earlier_expiries_counted(
    store: PartitionStore, *, failing: bool
) -> None:
    """One key expired earlier, then buckets 2 (one key) and 3 (two) expire together: all three keys are counted,
    returned and added (4 in all); when bucket 3 fails to drop, bucket 2's key is still added (2 in all)."""
    _at(store, 0, a=_entry(0))  # bucket 1
    _at(store, 3 * HOUR)
    assert store.expire() == 1
    _at(store, 3 * HOUR, b=_entry(HOUR), c=_entry(2 * HOUR), d=_entry(2 * HOUR + 1))  # buckets 2, 3, 3
    _at(store, 10 * HOUR)
    if failing:
        store._db = FailingDrops(store._db)  # type: ignore[assignment]
        with pytest.raises(StoreError, match="dropping bucket b3"):
            store.expire()
        assert (store.keys_expired, list(store.buckets())) == (2, [3])
    else:
        assert store.expire() == 3
        assert (store.keys_expired, list(store.buckets())) == (4, [])
