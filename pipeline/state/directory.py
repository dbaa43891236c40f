"""Where a partition's store lives, and opening it: the store is a cache of its changelog.

A store that cannot be read, that predates what this version keeps, or that
caches another changelog (:class:`~pipeline.errors.StoreStaleError`: the
topics were deleted and created again, another cluster, a position beyond the
changelog's end) is wiped and rebuilt from the changelog, with one WARNING line
saying why. A store under another name (another app, group, topic or partition)
is someone else's and is never touched (:class:`~pipeline.errors.StoreIdentityError`).
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from aiokafka import TopicPartition

from pipeline.errors import StateDirInUseError, StoreCorruptError, StoreError, StoreUnusableError
from pipeline.state.store import PartitionStore, bucket_width
from pipeline.state.store_meta import StoreIdentity
from pipeline.topology import Topology

log = logging.getLogger(__name__)


class StoreOpener(Protocol):
    """Opens (or creates) the store at ``path`` (``PartitionStore.open``; the simulation passes its own)."""

    def __call__(
        self, path: Path, *, bucket_ms: int, identity: StoreIdentity | None = None, follow: bool = False
    ) -> PartitionStore: ...


def store_path(state_dir: Path, topology: Topology, group: str, tp: TopicPartition) -> Path:
    """Where a partition's store lives: namespaced by app and group, so pipelines never share one."""
    return Path(state_dir) / topology.app / group / f"{tp.topic}-{tp.partition}"


def holds_store(path: Path) -> bool:
    """Whether a store lies at ``path`` (a wiped one is gone until it is opened again)."""
    return (path / "CURRENT").is_file()


def topology_bucket_ms(topology: Topology) -> int:
    """The bucket width of every store of ``topology``."""
    return bucket_width(int(topology.max_ttl.total_seconds() * 1000))


def open_store(
    path: Path,
    *,
    bucket_ms: int,
    identity: StoreIdentity,
    opener: StoreOpener = PartitionStore.open,
    follow: bool = False,
) -> PartitionStore:
    """Open the store at ``path``, checking it is ``identity``'s; a corrupt or stale one is rebuilt.

    ``follow`` opens it to follow its changelog (a restore, a standby): written, never read.
    """
    try:
        return opener(path, bucket_ms=bucket_ms, identity=identity, follow=follow)
    except StoreCorruptError as exc:
        log.warning("%s; wiping it and restoring from the changelog", exc)
        PartitionStore.wipe(path)  # StoreUnusableError when even that fails
        return opener(path, bucket_ms=bucket_ms, identity=identity, follow=follow)


def reopen(
    store: PartitionStore, *, identity: StoreIdentity, follow: bool, opener: StoreOpener = PartitionStore.open
) -> PartitionStore:
    """Close ``store`` and open it again, to follow its changelog or to be served (``follow``); the
    identity is checked again, and a position checked against the changelog stays checked. A failure
    leaves ``store`` closed and raises :class:`StoreError`."""
    path, bucket_ms, offset, checked = store.path, store.bucket_ms, store.changelog_offset, store.checked
    store.close()
    again = open_store(path, bucket_ms=bucket_ms, identity=identity, opener=opener, follow=follow)
    again.checked = again.checked or (checked and again.changelog_offset == offset)  # the same position
    return again


def release(store: PartitionStore, *, wipe: bool, name: str) -> int | None:
    """Close ``store``, and wipe it if ``wipe`` (an entry could not be read: the next owner restores it);
    a store that fails to close is logged, not raised (its owner is letting it go).

    Returns the changelog offset the store left on disk holds, for its worker to claim: -1 (nothing)
    when it was wiped or meant to be, None when that is not known: it failed to close, or its position
    was never checked against its changelog's end (it may lie beyond it: released before its restore)."""
    offset = store.changelog_offset if store.checked else None
    try:
        store.close()
    except StoreError as exc:
        log.warning("%s: %s", name, exc)
        return -1 if wipe else None
    if not wipe:
        return offset
    log.warning("%s: wiping store %s (an entry could not be read)", name, store.path)
    try:
        PartitionStore.wipe(store.path)
    except StoreError as exc:
        log.warning("%s: %s", name, exc)
    return -1


def rebuild(
    store: PartitionStore, *, identity: StoreIdentity, why: str, opener: StoreOpener = PartitionStore.open
) -> PartitionStore:
    """Close ``store``, wipe it and open it empty (to restore from the changelog's start); ``why`` names the store."""
    log.warning("%s; wiping it and restoring from the changelog", why)
    path, bucket_ms, follow = store.path, store.bucket_ms, store.follow
    store.close()
    PartitionStore.wipe(path)
    return opener(path, bucket_ms=bucket_ms, identity=identity, follow=follow)


class StateDirLock:
    """One worker per state directory and group: an exclusive lock on ``<state-dir>/<app>/<group>/.lock``.

    A second worker of the same group on the same state dir would wait on each store's
    RocksDB lock, one partition after another, for minutes; it is refused at once instead,
    naming the process that holds the directory. The lock goes with the process (a crash
    releases it), so a restarted worker finds it free.
    """

    def __init__(self, state_dir: Path, topology: Topology, group: str) -> None:
        self.path = Path(state_dir) / topology.app / group / ".lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or raise :class:`StateDirInUseError` naming its holder (or :class:`StoreUnusableError`
        when the directory cannot be used)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StoreUnusableError(f"state dir {self.path.parent} cannot be used: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise StateDirInUseError(
                f"state dir {self.path.parent} is in use by another worker of this group (pid {holder}); "
                "give each worker its own --state-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd

    def release(self) -> None:
        """Give the lock up (a second call does nothing)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor drops the lock


def stored_positions(
    state_dir: Path,
    topology: Topology,
    group: str,
    identities: Mapping[str, StoreIdentity],
    *,
    opener: StoreOpener = PartitionStore.open,
) -> dict[TopicPartition, int]:
    """The changelog position of every store of ``topology`` and ``group`` on this disk.

    ``identities`` gives, per consumed topic, the identity its stores carry (the
    partition is each store's own). Each store is opened to follow (nothing is
    written) and closed again; one that is locked, corrupt, of another changelog
    or someone else's claims nothing and is left as it is.
    """
    root = Path(state_dir) / topology.app / group
    positions: dict[TopicPartition, int] = {}
    if not root.is_dir():
        return positions
    bucket_ms = topology_bucket_ms(topology)
    for child in sorted(root.iterdir()):
        topic, _, number = child.name.rpartition("-")
        if topic not in identities or not number.isdigit() or not holds_store(child):
            continue
        identity = identities[topic]._replace(partition=int(number))
        try:
            store = opener(child, bucket_ms=bucket_ms, identity=identity, follow=True)
        except StoreError as exc:
            log.info("store %s claims nothing: %s", child, exc)
            continue
        try:
            positions[TopicPartition(topic, int(number))] = store.changelog_offset
        finally:
            store.close()
    return positions
