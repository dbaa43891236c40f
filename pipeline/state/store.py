"""The local seen-set of one input partition: RocksDB through rocksdict.

Layout: one column family per *expiry bucket* (``b<n>`` holds the keys whose
``expires_at`` falls in ``[n * bucket_ms, (n + 1) * bucket_ms)``) and a
``meta`` column family with the changelog offset the data reflects, the
partition's stream time, the bucket width, the format version and the
store's :class:`StoreIdentity` (whose partition it is).

Why buckets by expiry: expiring costs nothing on the hot path. Once stream
time passes a bucket's end (plus a grace period for late records) every key
in it has expired, and the whole column family is dropped, which RocksDB does
by deleting files rather than writing tombstones. Disk use is therefore
bounded by TTL x key rate. A lookup asks each live bucket (about ten, since
the width is a tenth of the largest TTL) with one multi-get per batch.

Two modes. A store that is served (its partition handles records) keeps
RocksDB's skip-list memtables, which lookups need. A store that only follows
its changelog (a restore, a standby replica: written, never read) is opened
with ``follow=True``: vector memtables, which append a write and sort once when
they are flushed, in RocksDB's background thread; a write then costs the event
loop about a third of what a sorted insert does (``docs/benchmarks.md``,
Restore). Lookups on such a store are refused: reopen it served first.

Every change, and the changelog offset and stream time it reflects, is
written in one ``WriteBatch``: the store never holds data newer or older than
its recorded offset, and the offset in memory moves only once the batch is
on disk.

Failures are sorted by what the caller can do about them:
:class:`StoreLockedError` (wait), :class:`StoreCorruptError` (wipe and
restore from the changelog), :class:`StoreUnusableError` (the directory
cannot be used: wait for an operator, never wipe) and
:class:`StoreIdentityError` (the store is someone else's: stop).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from rocksdict import BlockBasedOptions, MemtableFactory, Options, Rdict, WriteBatch

from pipeline.errors import (
    StoreCorruptError,
    StoreError,
    StoreUnusableError,
)
from pipeline.state.decision import Entry
from pipeline.state.store_meta import (
    META,
    OFFSET,
    STREAM_TIME,
    StoreIdentity,
    check_directory,
    check_meta,
    classify_open_failure,
    classify_write_failure,
)

log = logging.getLogger(__name__)

MIN_BUCKET_MS = 3_600_000


class Change(NamedTuple):
    """A key's new entry, the entry it replaces, and the new entry's bytes (encoded once)."""

    entry: Entry
    previous: Entry | None
    value: bytes

    @classmethod
    def of(cls, entry: Entry, previous: Entry | None = None) -> Change:
        """The change to ``entry``, encoding it."""
        return cls(entry, previous, entry.encode())


def bucket_width(max_ttl_ms: int) -> int:
    """The bucket width for a largest TTL: a tenth of it, at least an hour."""
    return max(MIN_BUCKET_MS, max_ttl_ms // 10)


WRITE_BUFFER_BYTES = 8 * 1024 * 1024  # per column family; a partition has about ten live buckets
DB_WRITE_BUFFER_BYTES = 64 * 1024 * 1024  # all memtables of one partition's database together


# A memtable's own Bloom filter, as a share of its size: 160 KiB for 8 MiB (about 30 bits a key).
MEMTABLE_BLOOM_RATIO = 0.02


def _family_options(follow: bool = False) -> Options:
    """Options of every column family: small memtables and Bloom filters (most lookups miss).

    The table files' filters spare a missing key the disk; the memtable's spares it the
    skiplist search (it took about a third off a lookup batch's time in ``bench/hotpath.py``).
    A store that only follows its changelog has vector memtables instead, and no memtable
    filter (nothing looks a key up in it).
    """
    options = Options(raw_mode=True)
    options.set_write_buffer_size(WRITE_BUFFER_BYTES)
    options.set_max_write_buffer_number(2)
    if follow:
        options.set_memtable_factory(MemtableFactory.vector())
        options.set_allow_concurrent_memtable_write(False)
    else:
        options.set_memtable_whole_key_filtering(True)
        options.set_memtable_prefix_bloom_ratio(MEMTABLE_BLOOM_RATIO)
    table = BlockBasedOptions()
    table.set_bloom_filter(10, False)
    table.set_cache_index_and_filter_blocks(True)
    options.set_block_based_table_factory(table)
    return options


def _options(follow: bool = False) -> Options:
    options = _family_options(follow)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    options.set_db_write_buffer_size(DB_WRITE_BUFFER_BYTES)
    return options


def _bucket_names(names: Iterable[str]) -> dict[int, str]:
    return {int(name[1:]): name for name in names if name.startswith("b") and name[1:].isdigit()}


class PartitionStore:
    """Key → :class:`Entry` for one input partition, with whole-bucket expiry."""

    def __init__(
        self, path: Path, db: Rdict, bucket_ms: int, families: Iterable[str], *, follow: bool = False
    ) -> None:
        self.path = path
        self._db = db
        self.bucket_ms = bucket_ms
        self.follow = follow  # opened only to follow the changelog: written, never read
        self._meta = db.get_column_family(META)
        self._meta_handle: Any = db.get_column_family_handle(META)
        self._buckets: dict[int, Rdict] = {}
        self._handles: dict[int, Any] = {}
        for bucket, name in _bucket_names(families).items():
            self._buckets[bucket] = db.get_column_family(name)
            self._handles[bucket] = db.get_column_family_handle(name)
        raw_offset = self._meta.get(OFFSET)
        raw_time = self._meta.get(STREAM_TIME)
        self.changelog_offset = int(raw_offset) if raw_offset is not None else -1
        # whether changelog_offset is known to lie within its changelog: an empty store's does, and a
        # restore or a standby's round checks it against the changelog's end (the writes that follow come
        # from the changelog or go to it); a store ahead of the end caches another log
        self.checked = self.changelog_offset < 0
        self.stream_time = int(raw_time) if raw_time is not None else 0
        self.keys_expired = 0
        self._closed = False

    @classmethod
    def open(
        cls, path: Path, *, bucket_ms: int, identity: StoreIdentity | None = None, follow: bool = False
    ) -> PartitionStore:
        """Open (or create) the store at ``path``, checking that it is ``identity``'s; ``follow``
        opens it to follow its changelog (written, never read: see the module).

        Raises :class:`StoreLockedError` when another process holds it,
        :class:`StoreUnusableError` when the directory cannot be used,
        :class:`StoreCorruptError` when it cannot be read or predates format 2
        (the caller wipes it and restores from the changelog), and
        :class:`StoreIdentityError` when it belongs to another identity (its
        data is left alone). ``identity=None`` skips the check; it exists only
        until every caller passes one.
        """
        check_directory(path)
        try:
            existing = Rdict.list_cf(str(path), _options(follow)) if (path / "CURRENT").exists() else []
            families = {name: _family_options(follow) for name in existing if name != "default"}
            families.setdefault(META, _family_options(follow))
            db = Rdict(str(path), _options(follow), column_families=families)
        except Exception as exc:  # rocksdict raises bare Exception for every RocksDB status
            raise classify_open_failure(path, exc) from exc
        try:
            has_buckets = bool(_bucket_names(families))
            bucket_ms = check_meta(path, db, bucket_ms, identity, has_buckets=has_buckets)
            return cls(path, db, bucket_ms, families, follow=follow)
        except StoreError:
            db.close()
            raise
        except ValueError as exc:
            db.close()
            raise StoreCorruptError(f"store {path} has unreadable metadata: {exc}") from exc
        except Exception as exc:  # rocksdict raises bare Exception for every RocksDB status
            db.close()
            raise classify_open_failure(path, exc) from exc

    @staticmethod
    def wipe(path: Path) -> None:
        """Delete the store at ``path`` so it is rebuilt from the changelog.

        Refuses (:class:`StoreUnusableError`) a directory that does not look
        like a store (no ``CURRENT`` file and not empty): only what the
        changelog can restore is deleted. A failed delete is
        :class:`StoreUnusableError` too.
        """
        if not path.exists():
            return
        if not path.is_dir():
            raise StoreUnusableError(f"store {path} is not a directory; not wiping it")
        try:
            looks_like_store = (path / "CURRENT").is_file() or not any(path.iterdir())
        except OSError as exc:
            raise StoreUnusableError(f"store {path} cannot be listed: {exc}") from exc
        if not looks_like_store:
            raise StoreUnusableError(f"{path} does not look like a store (no CURRENT file); not wiping it")
        try:
            shutil.rmtree(path)
        except OSError as exc:
            raise StoreUnusableError(f"store {path} could not be wiped: {exc}") from exc

    def get_many(self, keys: list[bytes]) -> dict[bytes, Entry]:
        """The entries of ``keys`` that exist (expired ones included: the caller decides).

        A key found in more than one bucket (``write_raw`` leaves an older
        copy behind) resolves to the copy with the largest ``expires_at``.
        A failed read raises :class:`StoreError` (:class:`StoreCorruptError` for an
        entry that cannot be decoded: the store is then rebuilt from its changelog).
        """
        found: dict[bytes, Entry] = {}
        if not keys:
            return found
        if self.follow:
            raise StoreError(f"store {self.path} is open to follow its changelog, not to be read")
        for bucket in sorted(self._buckets, reverse=True):
            try:
                values: list[bytes | None] = self._buckets[bucket].get(keys)  # type: ignore[arg-type,assignment]
            except Exception as exc:  # rocksdict raises bare Exception for every RocksDB status
                raise classify_write_failure(self.path, exc, f"reading bucket b{bucket}") from exc
            for key, value in zip(keys, values, strict=True):
                if value is not None:
                    try:
                        entry = Entry.decode(value)
                    except ValueError as exc:
                        raise StoreCorruptError(f"store {self.path}: an entry cannot be read: {exc}") from exc
                    current = found.get(key)
                    if current is None or entry.expires_at > current.expires_at:
                        found[key] = entry
        return found

    def write(
        self,
        changes: Mapping[bytes, Change],
        *,
        changelog_offset: int | None,
        stream_time: int,
    ) -> None:
        """Apply ``key → change`` with the offset and stream time, atomically.

        The offset and stream time in memory move only once the batch is on
        disk; a failed write raises :class:`StoreError` and changes nothing.
        """
        batch = WriteBatch(raw_mode=True)
        width = self.bucket_ms
        for key, (entry, previous, value) in changes.items():
            bucket = entry.expires_at // width
            if previous is not None:
                old = previous.expires_at // width
                if old != bucket and old in self._handles:
                    batch.delete(key, self._handles[old])
            batch.put(key, value, self._handle(bucket))
        self._commit(batch, changelog_offset, stream_time)

    def write_raw(
        self,
        entries: Iterable[tuple[bytes, bytes, int]],
        *,
        changelog_offset: int,
        stream_time: int,
    ) -> None:
        """Write ``(key, encoded entry, expires_at)`` triples as they are, in one batch (restore's fast path).

        Nothing is decoded and no earlier copy is looked up, so a key whose
        ``expires_at`` moved to another bucket keeps its older copy there
        until that bucket expires; :meth:`get_many` picks the copy with the
        largest ``expires_at``, which is the newer one.
        """
        batch = WriteBatch(raw_mode=True)
        width = self.bucket_ms
        handles = self._handles
        put = batch.put
        for key, value, expires_at in entries:
            bucket = expires_at // width
            # no handle in a local: a failed write's traceback keeps this frame, and a live column family
            # handle keeps the database locked after close (the same process could not open it again)
            put(key, value, handles.get(bucket) or self._handle(bucket))
        self._commit(batch, changelog_offset, stream_time)

    def _commit(self, batch: WriteBatch, changelog_offset: int | None, stream_time: int) -> None:
        new_offset = changelog_offset is not None and changelog_offset > self.changelog_offset
        new_time = stream_time > self.stream_time
        if new_offset:
            batch.put(OFFSET, str(changelog_offset).encode(), self._meta_handle)
        if new_time:
            batch.put(STREAM_TIME, str(stream_time).encode(), self._meta_handle)
        try:
            self._db.write(batch)
        except Exception as exc:  # rocksdict raises bare Exception for every RocksDB status
            raise classify_write_failure(self.path, exc, "write") from exc
        if new_offset and changelog_offset is not None:
            self.changelog_offset = changelog_offset
        if new_time:
            self.stream_time = stream_time

    def _handle(self, bucket: int) -> Any:
        handle = self._handles.get(bucket)
        if handle is None:
            name = f"b{bucket}"
            try:
                self._buckets[bucket] = self._db.create_column_family(name, _family_options(self.follow))
                handle = self._handles[bucket] = self._db.get_column_family_handle(name)
            except Exception as exc:  # rocksdict raises bare Exception for every RocksDB status
                self._buckets.pop(bucket, None)
                raise classify_write_failure(self.path, exc, f"creating bucket {name}") from exc
        return handle

    def expire(self, *, grace_ms: int | None = None) -> int:
        """Drop every bucket whose keys all expired before stream time minus ``grace_ms``.

        The grace (default one bucket) keeps keys for records that arrive a
        little out of timestamp order. Returns the number of keys dropped.
        A bucket that cannot be dropped raises :class:`StoreError` and stays.
        """
        grace = self.bucket_ms if grace_ms is None else grace_ms
        dropped = 0
        for bucket in sorted(self._buckets):
            if (bucket + 1) * self.bucket_ms + grace > self.stream_time:
                break
            keys = self.estimate_keys(self._buckets[bucket])
            try:
                self._db.drop_column_family(f"b{bucket}")
            except Exception as exc:  # rocksdict raises bare Exception for every RocksDB status
                self.keys_expired += dropped
                raise classify_write_failure(self.path, exc, f"dropping bucket b{bucket}") from exc
            del self._buckets[bucket]
            self._handles.pop(bucket, None)
            dropped += keys
            log.info("store %s: dropped expired bucket b%s", self.path, bucket)
        self.keys_expired += dropped
        return dropped

    @staticmethod
    def estimate_keys(family: Rdict) -> int:
        """RocksDB's estimate of the keys in one column family."""
        return int(family.property_int_value("rocksdb.estimate-num-keys") or 0)

    def key_count(self) -> int:
        """An estimate of the keys held (expired but not yet dropped ones included)."""
        return sum(self.estimate_keys(family) for family in self._buckets.values())

    def disk_bytes(self) -> int:
        """Bytes on disk under the store's directory."""
        return sum(f.stat().st_size for f in self.path.rglob("*") if f.is_file())

    def buckets(self) -> Iterable[int]:
        """The live bucket numbers, oldest first."""
        return sorted(self._buckets)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run."""
        return self._closed

    def close(self) -> None:
        """Flush and release the database (and its lock); a second call does nothing.

        The database is released even when closing a column family fails.
        """
        if self._closed:
            return
        self._closed = True
        families = [self._meta, *self._buckets.values()]
        self._buckets.clear()
        self._handles.clear()  # column family handles keep the database alive (and locked)
        self._meta_handle = None
        try:
            for family in families:
                try:
                    family.close()
                except Exception as exc:  # noqa: BLE001  (rocksdict raises bare Exception; the db must still close)
                    log.warning("store %s: closing a column family failed: %s", self.path, exc)
        finally:
            try:
                self._db.close()
            except Exception as exc:  # rocksdict raises bare Exception for every RocksDB status
                raise classify_write_failure(self.path, exc, "close") from exc
