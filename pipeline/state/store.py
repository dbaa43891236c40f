"""The local seen-set of one input partition: RocksDB through rocksdict.

Layout: one column family per *expiry bucket* (``b<n>`` holds the keys whose
``expires_at`` falls in ``[n * bucket_ms, (n + 1) * bucket_ms)``) and a
``meta`` column family with the changelog offset the data reflects, the
partition's stream time and the bucket width.

Why buckets by expiry: expiring costs nothing on the hot path. Once stream
time passes a bucket's end (plus a grace period for late records) every key
in it has expired, and the whole column family is dropped, which RocksDB does
by deleting files rather than writing tombstones. Disk use is therefore
bounded by TTL x key rate. A lookup asks each live bucket (about ten, since
the width is a tenth of the largest TTL) with one multi-get per batch.

Every change, and the changelog offset and stream time it reflects, is
written in one ``WriteBatch``: the store never holds data newer or older than
its recorded offset.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from rocksdict import BlockBasedOptions, Options, Rdict, WriteBatch

from pipeline.errors import StoreCorruptError, StoreError
from pipeline.state.decision import Entry

log = logging.getLogger(__name__)

_META = "meta"
_OFFSET = b"changelog_offset"
_STREAM_TIME = b"stream_time"
_BUCKET_MS = b"bucket_ms"
_VERSION = b"version"
FORMAT_VERSION = b"1"
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


def _family_options() -> Options:
    """Options of every column family: small memtables and a Bloom filter (most lookups miss)."""
    options = Options(raw_mode=True)
    options.set_write_buffer_size(WRITE_BUFFER_BYTES)
    options.set_max_write_buffer_number(2)
    table = BlockBasedOptions()
    table.set_bloom_filter(10, False)
    table.set_cache_index_and_filter_blocks(True)
    options.set_block_based_table_factory(table)
    return options


def _options() -> Options:
    options = _family_options()
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    options.set_db_write_buffer_size(DB_WRITE_BUFFER_BYTES)
    return options


class PartitionStore:
    """Key → :class:`Entry` for one input partition, with whole-bucket expiry."""

    def __init__(self, path: Path, db: Rdict, bucket_ms: int) -> None:
        self.path = path
        self._db = db
        self.bucket_ms = bucket_ms
        self._meta = db.get_column_family(_META)
        self._buckets: dict[int, Rdict] = {}
        for name in Rdict.list_cf(str(path), _options()):
            if name.startswith("b") and name[1:].isdigit():
                self._buckets[int(name[1:])] = db.get_column_family(name)
        raw_offset = self._meta.get(_OFFSET)
        raw_time = self._meta.get(_STREAM_TIME)
        self.changelog_offset = int(raw_offset) if raw_offset is not None else -1
        self.stream_time = int(raw_time) if raw_time is not None else 0
        self.keys_expired = 0

    @classmethod
    def open(cls, path: Path, *, bucket_ms: int) -> PartitionStore:
        """Open (or create) the store at ``path``.

        Raises :class:`StoreCorruptError` when it exists but cannot be read (the
        caller wipes it and restores from the changelog), and :class:`StoreError`
        when another process holds it.
        """
        path.mkdir(parents=True, exist_ok=True)
        try:
            existing = Rdict.list_cf(str(path), _options()) if (path / "CURRENT").exists() else []
            families = {name: _family_options() for name in existing if name != "default"}
            families.setdefault(_META, _family_options())
            db = Rdict(str(path), _options(), column_families=families)
        except Exception as exc:  # rocksdict raises bare Exception for every RocksDB status
            if "lock" in str(exc).lower():
                raise StoreError(f"store {path} is held by another process: {exc}") from exc
            raise StoreCorruptError(f"store {path} cannot be opened: {exc}") from exc
        try:
            meta = db.get_column_family(_META)
            version = meta.get(_VERSION)
            if version not in (None, FORMAT_VERSION):
                raise StoreCorruptError(f"store {path} has format {version!r}, expected {FORMAT_VERSION!r}")
            stored_width = meta.get(_BUCKET_MS)
            if stored_width is None:
                meta.put(_BUCKET_MS, str(bucket_ms).encode())
                meta.put(_VERSION, FORMAT_VERSION)
            else:
                bucket_ms = int(stored_width)
            return cls(path, db, bucket_ms)
        except (ValueError, StoreCorruptError) as exc:
            db.close()
            raise StoreCorruptError(f"store {path} has unreadable metadata: {exc}") from exc

    @staticmethod
    def wipe(path: Path) -> None:
        """Delete the store at ``path`` (it is rebuilt from the changelog)."""
        shutil.rmtree(path, ignore_errors=True)

    def get_many(self, keys: list[bytes]) -> dict[bytes, Entry]:
        """The entries of ``keys`` that exist (expired ones included: the caller decides)."""
        found: dict[bytes, Entry] = {}
        if not keys:
            return found
        for bucket in sorted(self._buckets, reverse=True):
            values: list[bytes | None] = self._buckets[bucket].get(keys)  # type: ignore[arg-type,assignment]
            for key, value in zip(keys, values, strict=True):
                if value is not None:
                    entry = Entry.decode(value)
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
        """Apply ``key → change`` with the offset and stream time, atomically."""
        batch = WriteBatch(raw_mode=True)
        for key, (entry, previous, value) in changes.items():
            bucket = entry.expires_at // self.bucket_ms
            if previous is not None:
                old = previous.expires_at // self.bucket_ms
                if old != bucket and old in self._buckets:
                    batch.delete(key, self._db.get_column_family_handle(f"b{old}"))
            batch.put(key, value, self._handle(bucket))
        meta = self._db.get_column_family_handle(_META)
        if changelog_offset is not None and changelog_offset > self.changelog_offset:
            batch.put(_OFFSET, str(changelog_offset).encode(), meta)
            self.changelog_offset = changelog_offset
        if stream_time > self.stream_time:
            batch.put(_STREAM_TIME, str(stream_time).encode(), meta)
            self.stream_time = stream_time
        try:
            self._db.write(batch)
        except Exception as exc:  # rocksdict raises bare Exception for every RocksDB status
            raise StoreError(f"store {self.path}: write failed: {exc}") from exc

    def _handle(self, bucket: int) -> Any:
        if bucket not in self._buckets:
            self._buckets[bucket] = self._db.create_column_family(f"b{bucket}", _family_options())
        return self._db.get_column_family_handle(f"b{bucket}")

    def expire(self, *, grace_ms: int | None = None) -> int:
        """Drop every bucket whose keys all expired before stream time minus ``grace_ms``.

        The grace (default one bucket) keeps keys for records that arrive a
        little out of timestamp order. Returns the number of keys dropped.
        """
        grace = self.bucket_ms if grace_ms is None else grace_ms
        dropped = 0
        for bucket in sorted(self._buckets):
            if (bucket + 1) * self.bucket_ms + grace > self.stream_time:
                break
            dropped += self.estimate_keys(self._buckets[bucket])
            del self._buckets[bucket]
            self._db.drop_column_family(f"b{bucket}")
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

    def close(self) -> None:
        """Flush and release the database (and its lock)."""
        families = [self._meta, *self._buckets.values()]
        self._buckets.clear()
        for family in families:
            family.close()
        self._db.close()
        del self._meta
