"""What a store says about itself, and what its failures mean.

The ``meta`` column family holds the format version, the bucket width, the
changelog offset, the stream time and the store's identity (app, group,
input topic and partition, changelog). RocksDB reports every failure as a
bare ``Exception`` with its status text: :func:`classify_open_failure` and
:func:`classify_write_failure` turn that into locked, corrupt or unusable.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import orjson
from rocksdict import Rdict, WriteBatch

from pipeline.errors import (
    StoreCorruptError,
    StoreError,
    StoreIdentityError,
    StoreLockedError,
    StoreStaleError,
    StoreUnusableError,
)

META = "meta"
OFFSET = b"changelog_offset"
STREAM_TIME = b"stream_time"
BUCKET_MS = b"bucket_ms"
VERSION = b"version"
IDENTITY = b"identity"
FORMAT_VERSION = b"2"  # 2: the meta family holds the store's identity

# Fragments of RocksDB status texts (and of the OS errors inside them), lower case.
_UNUSABLE = (  # checked before "lock": a LOCK file on a read-only disk is not a held lock
    *("permission denied", "read-only file system", "no space left", "disk quota", "not a directory"),
    *("file exists", "operation not permitted", "too many open files"),
)
_CORRUPT = ("corruption", "no such file or directory", "bad magic", "checksum mismatch", "truncated")


class StoreIdentity(NamedTuple):
    """Whose store it is: app, consumer group, input topic and partition, and the changelog topic, by
    name; and where that changelog lives, by id: the cluster and the changelog topic's own id (a topic
    deleted and created again under its name, or another cluster, has others).

    The names say which store this is: a store under another name is someone else's and is never
    used. The ids say which changelog it caches: a store of another changelog is stale, and is wiped
    and rebuilt (a store written before ids were kept has none, and is rebuilt once).
    """

    app: str
    group: str
    topic: str
    partition: int
    changelog: str  # the changelog topic; its partition is ``partition``
    cluster: str = ""
    changelog_id: str = ""

    def encode(self) -> bytes:
        """The JSON kept in the store's ``meta`` column family."""
        return orjson.dumps(self._asdict())

    @classmethod
    def decode(cls, data: bytes) -> StoreIdentity:
        """Read what :meth:`encode` wrote; raises ``ValueError`` on anything else."""
        try:
            raw = orjson.loads(data)
            return cls(
                str(raw["app"]),
                str(raw["group"]),
                str(raw["topic"]),
                int(raw["partition"]),
                str(raw["changelog"]),
                str(raw.get("cluster") or ""),
                str(raw.get("changelog_id") or ""),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a store identity: {exc}") from exc

    def names(self) -> tuple[str, str, str, int, str]:
        """Which store this is (app, group, topic, partition, changelog)."""
        return self.app, self.group, self.topic, self.partition, self.changelog

    def describe(self) -> str:
        """One line naming every field."""
        return " ".join(f"{name}={value or '?'}" for name, value in self._asdict().items())


def classify_open_failure(path: Path, exc: BaseException) -> StoreError:
    """The :class:`StoreError` for a failure to open (or read) the store at ``path``.

    A held lock is :class:`StoreLockedError`; an unusable directory
    (permissions, read-only, full, not a directory) and anything not
    recognised is :class:`StoreUnusableError`, which is never wiped; only
    RocksDB's own "this data is damaged" answers are :class:`StoreCorruptError`.
    """
    text = str(exc)
    lowered = text.lower()
    if any(fragment in lowered for fragment in _UNUSABLE):
        return StoreUnusableError(f"store {path} cannot be used: {text}")
    if "lock" in lowered:
        return StoreLockedError(f"store {path} is held by another process: {text}")
    if any(fragment in lowered for fragment in _CORRUPT):
        return StoreCorruptError(f"store {path} is corrupt: {text}")
    return StoreUnusableError(f"store {path} cannot be opened: {text}")


def classify_write_failure(path: Path, exc: BaseException, action: str) -> StoreError:
    """The :class:`StoreError` for a failed write: IO trouble (disk full, read-only) is :class:`StoreUnusableError`."""
    text = str(exc)
    lowered = text.lower()
    if "io error" in lowered or any(fragment in lowered for fragment in _UNUSABLE):
        return StoreUnusableError(f"store {path}: {action} failed: {text}")
    return StoreError(f"store {path}: {action} failed: {text}")


def check_directory(path: Path) -> None:
    """Cheap checks before RocksDB: the path is (or can be made) a writable directory."""
    if path.exists() and not path.is_dir():
        raise StoreUnusableError(f"store {path} cannot be used: it exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreUnusableError(f"store {path} cannot be used: {exc}") from exc
    if not os.access(path, os.W_OK | os.X_OK):
        raise StoreUnusableError(f"store {path} cannot be used: the directory is not writable")


def read_meta(db: Rdict) -> dict[bytes, bytes | None]:
    # A helper of its own so that no column family object outlives it in a traceback: one would keep
    # the database (and its lock) alive after ``close``.
    meta = db.get_column_family(META)
    return {key: meta.get(key) for key in (VERSION, OFFSET, BUCKET_MS, IDENTITY)}


def write_meta(db: Rdict, values: dict[bytes, bytes]) -> None:
    batch = WriteBatch(raw_mode=True)
    handle = db.get_column_family_handle(META)
    for key, value in values.items():
        batch.put(key, value, handle)
    db.write(batch)


def check_meta(
    path: Path, db: Rdict, bucket_ms: int, identity: StoreIdentity | None, *, has_buckets: bool
) -> int:
    """Check (or, on a new store, write) version, bucket width and identity; return the bucket width."""
    meta = read_meta(db)
    version = meta[VERSION]
    has_data = has_buckets or meta[OFFSET] is not None
    if version is None and not has_data:
        fresh = {BUCKET_MS: str(bucket_ms).encode(), VERSION: FORMAT_VERSION}
        if identity is not None:
            fresh[IDENTITY] = identity.encode()
        write_meta(db, fresh)
        return bucket_ms
    if version != FORMAT_VERSION:
        raise StoreCorruptError(f"store {path} has format {version!r}, expected {FORMAT_VERSION!r}")
    stored_width = meta[BUCKET_MS]
    if stored_width is None:
        raise StoreCorruptError(f"store {path} has no bucket width")
    raw_identity = meta[IDENTITY]
    if identity is not None:
        if raw_identity is None:
            if has_data:
                raise StoreCorruptError(f"store {path} has data but no identity")
            write_meta(db, {IDENTITY: identity.encode()})
        else:
            stored = StoreIdentity.decode(raw_identity)
            if stored.names() != identity.names():
                raise StoreIdentityError(
                    f"store {path} belongs to {stored.describe()}, not to {identity.describe()}; refusing to use it"
                )
            if (stored.cluster, stored.changelog_id) != (identity.cluster, identity.changelog_id):
                raise StoreStaleError(
                    f"store {path} caches changelog {stored.changelog} of cluster {stored.cluster or '?'} "
                    f"(topic id {stored.changelog_id or '?'}), not the one of cluster {identity.cluster or '?'} "
                    f"(topic id {identity.changelog_id or '?'})"
                )
    return int(stored_width)
