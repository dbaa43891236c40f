"""The RocksDB seen-set: atomic writes with their changelog offset, whole-bucket expiry, reopening."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.errors import StoreCorruptError, StoreError
from pipeline.state.decision import Entry
from pipeline.state.store import MIN_BUCKET_MS, Change, PartitionStore, bucket_width

HOUR = 3_600_000


def _entry(first_seen: int, ttl: int = HOUR) -> Entry:
    return Entry(first_seen=first_seen, expires_at=first_seen + ttl, partition=0, offset=first_seen)


@pytest.fixture
def store(tmp_path: Path):
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


def test_a_store_held_by_another_handle_is_a_store_error(store: PartitionStore) -> None:
    """Opening a store that is open elsewhere fails with StoreError, not corruption."""
    with pytest.raises(StoreError) as caught:
        PartitionStore.open(store.path, bucket_ms=HOUR)
    assert not isinstance(caught.value, StoreCorruptError)


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


def test_stores_use_a_bloom_filter_and_bounded_memtables(store: PartitionStore) -> None:
    """Most lookups miss (every first copy), so tables carry a Bloom filter; memtables are bounded."""
    store.write({b"k": Change.of(_entry(1), None)}, changelog_offset=None, stream_time=1)
    options = max(store.path.glob("OPTIONS-*")).read_text()
    assert "bloomfilter" in options.lower()
    assert "write_buffer_size=8388608" in options
