"""A changelog replayed into a store takes stream time from the entries, never from record timestamps."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import CorruptRecordException, NotLeaderForPartitionError, OffsetOutOfRangeError
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.record.util import calc_crc32c

from pipeline.errors import StoreStaleError
from pipeline.kafka.internals import RawFetch
from pipeline.state import replay as replay_module
from pipeline.state.decision import Entry
from pipeline.state.replay import Replay, expires_at, last_seen
from pipeline.state.store import PartitionStore
from tests.simulation.records import ABORT, COMMIT
from tests.simulation.records import marker as marker_batch

HOUR = 3_600_000
DAY = 24 * HOUR
T0 = 1_700_000_000_000
CHANGELOG = TopicPartition("app-seen-changelog", 0)
LOG_APPEND_TIME = 0x08  # attributes bit 3: the broker stamped the batch
ATTRIBUTES_OFFSET, MAX_TIMESTAMP_OFFSET, CRC_OFFSET = 21, 35, 17


def _batch(
    entries: list[tuple[bytes, Entry]], *, stamped: int, log_append_time: bool = False, base_offset: int = 0
) -> bytes:
    """One v2 batch of changelog records stamped ``stamped``; with ``log_append_time`` as a broker with
    ``message.timestamp.type=LogAppendTime`` writes it (the type bit set, max timestamp the append time)."""
    raw = bytearray(_records_batch([(key, entry.encode()) for key, entry in entries], stamped=stamped))
    if log_append_time:
        attributes = struct.unpack_from(">h", raw, ATTRIBUTES_OFFSET)[0] | LOG_APPEND_TIME
        struct.pack_into(">h", raw, ATTRIBUTES_OFFSET, attributes)
        struct.pack_into(">q", raw, MAX_TIMESTAMP_OFFSET, stamped)
        struct.pack_into(">I", raw, CRC_OFFSET, calc_crc32c(bytes(raw[ATTRIBUTES_OFFSET:])))
    struct.pack_into(">q", raw, 0, base_offset)  # outside the CRC
    return bytes(raw)


class OneBatchReader:
    """A changelog reader holding one batch at offset 0."""

    def __init__(self, raw: bytes, count: int) -> None:
        self.raw = raw
        self.count = count

    async def fetch(self, tp: TopicPartition, position: int) -> RawFetch:
        records = MemoryRecords(self.raw) if position < self.count else None
        return RawFetch(records, [], None)

    async def refresh(self) -> None:
        """Nothing to refresh."""


@pytest.fixture
def store(tmp_path: Path) -> Iterator[PartitionStore]:
    opened = PartitionStore.open(tmp_path / "p0", bucket_ms=HOUR, follow=True)
    yield opened
    opened.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[PartitionStore]:
    """A store opened to be served (read), as a restore before serving has it."""
    opened = PartitionStore.open(tmp_path / "p1", bucket_ms=HOUR)
    yield opened
    opened.close()


def _entry(seen: int, ttl: int = DAY) -> Entry:
    return Entry(first_seen=seen, expires_at=seen + ttl, partition=0, offset=0, last_seen=seen)


@pytest.mark.parametrize("log_append_time", [False, True], ids=["create-time", "log-append-time"])
async def test_stream_time_is_the_latest_entry_time_whatever_the_records_are_stamped(
    store: PartitionStore, log_append_time: bool
) -> None:
    """Claims made on a backlog days old, their changelog records stamped days later (when written, or by
    the broker's LogAppendTime): the replayed store's stream time is the claims' own, so it keeps them."""
    entries = [(b"a", _entry(T0)), (b"b", _entry(T0 + HOUR))]
    stamped = T0 + 10 * DAY  # the wall clock when the worker wrote them, or when the broker appended them
    reader = OneBatchReader(_batch(entries, stamped=stamped, log_append_time=log_append_time), len(entries))
    replay = Replay(store, reader, CHANGELOG, prefetch=False, quiet=True)  # type: ignore[arg-type]
    assert await replay.run(len(entries)) == 2
    assert store.stream_time == T0 + HOUR
    assert store.expire() == 0
    assert store.changelog_offset == 1


def test_last_seen_is_read_from_an_encoded_entry_and_falls_back_to_decoding() -> None:
    """The scan finds ``last_seen`` in Entry.encode's layout; another layout is decoded."""
    assert last_seen(_entry(T0 + 5).encode()) == T0 + 5
    assert last_seen(b'{"l": 7, "f": 1, "x": 2, "p": 0, "o": 0}') == 7


def test_expires_at_is_read_from_an_encoded_entry_and_falls_back_to_decoding() -> None:
    """The scan finds ``expires_at`` in Entry.encode's layout; another layout is decoded."""
    assert expires_at(_entry(T0 + 5, ttl=HOUR).encode()) == T0 + 5 + HOUR
    assert expires_at(b'{"x": 2, "l": 7, "f": 1, "p": 0, "o": 0}') == 2
    assert expires_at(b'{"l": 7, "f": 1, "p": 0, "o": 0, "x": 9}') == 9


async def test_a_fetch_that_begins_inside_a_batch_applies_its_records_from_the_position_on(
    served: PartitionStore,
) -> None:
    """The store holds offsets 0-1 and the fetch hands back the batch of offsets 0-3: only 2 and 3 are applied."""
    served.write_raw([], changelog_offset=1, stream_time=0)
    entries = [(key, _entry(T0)) for key in (b"a", b"b", b"c", b"d")]
    reader = OneBatchReader(_batch(entries, stamped=T0), len(entries))
    replay = Replay(served, reader, CHANGELOG, prefetch=False, quiet=True)  # type: ignore[arg-type]
    assert await replay.run(len(entries)) == 2
    assert sorted(served.get_many([b"a", b"b", b"c", b"d"])) == [b"c", b"d"]
    assert served.changelog_offset == 3


class TruncatedReader:
    """A changelog whose records before ``start`` were deleted (retention): a fetch there is out of range."""

    def __init__(self, raw: bytes, start: int, end: int) -> None:
        self.raw, self.start, self.end = raw, start, end

    async def fetch(self, tp: TopicPartition, position: int) -> RawFetch:
        if position < self.start:
            return RawFetch(None, [], OffsetOutOfRangeError)
        return RawFetch(MemoryRecords(self.raw) if position < self.end else None, [], None)

    async def beginning(self, tp: TopicPartition) -> int:
        return {CHANGELOG: self.start}[tp]

    async def refresh(self) -> None:
        """Nothing to refresh."""


async def test_a_store_behind_the_changelogs_log_start_replays_from_the_log_start(
    served: PartitionStore,
) -> None:
    """The store's next offset (1) fell out of retention, the log starts at 2: the replay goes on from 2."""
    served.write_raw([], changelog_offset=0, stream_time=0)
    raw = _batch([(b"c", _entry(T0)), (b"d", _entry(T0))], stamped=T0, base_offset=2)
    replay = Replay(served, TruncatedReader(raw, start=2, end=4), CHANGELOG, prefetch=False, quiet=True)  # type: ignore[arg-type]
    assert await replay.run(4) == 2
    assert sorted(served.get_many([b"c", b"d"])) == [b"c", b"d"]
    assert served.changelog_offset == 3


async def test_a_fetch_out_of_range_at_the_log_start_means_the_store_is_beyond_the_changelogs_end(
    store: PartitionStore,
) -> None:
    """Out of range while the log starts at the store's next offset: the log was truncated under it (stale)."""
    store.write_raw([], changelog_offset=1, stream_time=0)
    reader = TruncatedReader(b"", start=2, end=2)  # the fetch at 2 is refused, yet the log starts there

    async def refused(tp: TopicPartition, position: int) -> RawFetch:
        await asyncio.sleep(0.01)  # a round trip: the timeout below can end a replay that asks forever
        return RawFetch(None, [], OffsetOutOfRangeError)

    reader.fetch = refused  # type: ignore[method-assign]
    replay = Replay(store, reader, CHANGELOG, prefetch=False, quiet=True)  # type: ignore[arg-type]
    with pytest.raises(StoreStaleError, match="offset 2 is beyond the changelog's end"):
        async with asyncio.timeout(5):  # skipping to where it stands would fetch the same refusal forever
            await replay.run(5)


def _records_batch(records: list[tuple[bytes | None, bytes | None]], *, stamped: int = T0) -> bytes:
    """One v2 batch of raw ``(key, value)`` records at offsets 0.. (a value of None: a tombstone)."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 26,
    )
    for offset, (key, value) in enumerate(records):
        builder.append(offset, timestamp=stamped, key=key, value=value, headers=[])
    return bytes(builder.build())


async def test_tombstones_and_keyless_records_are_read_past_and_never_written(served: PartitionStore) -> None:
    """A tombstone (a key without a value, as compaction leaves) and a record without a key count as read and
    move the position on; only the entries are written."""
    entry = _entry(T0)
    raw = _records_batch(
        [(b"a", entry.encode()), (b"gone", None), (None, entry.encode()), (b"b", entry.encode())]
    )
    replay = Replay(served, OneBatchReader(raw, 4), CHANGELOG, prefetch=False, quiet=True)  # type: ignore[arg-type]
    assert await replay.run(4) == 4
    assert sorted(served.get_many([b"a", b"gone", b"b"])) == [b"a", b"b"]
    assert served.changelog_offset == 3


async def test_a_batch_with_a_bad_crc_stops_the_replay_naming_the_changelog_and_the_offset(
    served: PartitionStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fetched batch whose CRC does not match its bytes is never applied: the replay raises
    CorruptRecordException saying which changelog and which offset, and the store keeps its position."""
    monkeypatch.setattr(replay_module, "RETRY_BACKOFF", 0.001)  # a bad batch is fetched again RETRIES times
    raw = bytearray(_records_batch([(b"a", _entry(T0).encode())]))
    raw[-1] ^= 0xFF  # a flipped bit in the record, inside what the CRC covers
    replay = Replay(served, OneBatchReader(bytes(raw), 1), CHANGELOG, prefetch=False, quiet=True)  # type: ignore[arg-type]
    with pytest.raises(CorruptRecordException, match=r"app-seen-changelog.*bad CRC at offset 0"):
        await replay.run(1)
    assert served.get_many([b"a"]) == {}
    assert served.changelog_offset == -1


class LogReader:
    """A changelog of concatenated batches ending at ``end``, with its aborted transactions."""

    def __init__(self, raw: bytes, end: int, aborted: list[tuple[int, int]]) -> None:
        self.raw, self.end, self.aborted = raw, end, aborted

    async def fetch(self, tp: TopicPartition, position: int) -> RawFetch:
        records = MemoryRecords(self.raw) if position < self.end else None
        return RawFetch(records, list(self.aborted), None)

    async def refresh(self) -> None:
        """Nothing to refresh."""


@pytest.mark.parametrize("producer", [0, 7])
async def test_an_aborted_transaction_is_never_applied_whatever_its_producer_id(
    served: PartitionStore, producer: int
) -> None:
    """Producer id 0 is a producer like any other: its aborted transaction (offset 0, its marker at 1) is skipped,
    and the committed record after it (offset 2) applied."""
    entry = _entry(T0)
    txn = DefaultRecordBatchBuilder(2, 0, 1, producer, 0, 0, 1 << 20)
    txn.append(0, timestamp=T0, key=b"aborted", value=entry.encode(), headers=[])
    aborted = bytes(txn.build())
    marker = marker_batch(1, producer, 0, ABORT, T0).raw
    after = bytearray(_records_batch([(b"kept", entry.encode())]))
    struct.pack_into(">q", after, 0, 2)  # its base offset, outside the CRC
    reader = LogReader(aborted + marker + bytes(after), 3, [(producer, 0)])
    replay = Replay(served, reader, CHANGELOG, prefetch=False, quiet=True)  # type: ignore[arg-type]
    await replay.run(3)
    assert sorted(served.get_many([b"aborted", b"kept"])) == [b"kept"]
    assert served.changelog_offset == 2


def _transactional(offset: int, producer: int, key: bytes) -> bytes:
    """One transactional batch of one changelog record at ``offset``."""
    builder = DefaultRecordBatchBuilder(2, 0, 1, producer, 0, 0, 1 << 20)
    builder.append(0, timestamp=T0, key=key, value=_entry(T0).encode(), headers=[])
    raw = bytearray(builder.build())
    struct.pack_into(">q", raw, 0, offset)  # its base offset, outside the CRC
    return bytes(raw)


async def test_a_producers_committed_transaction_after_its_aborted_one_is_applied(
    served: PartitionStore,
) -> None:
    """The abort marker ends what the producer aborted: its next transaction (offset 2, committed at 3) is applied,
    the aborted one (offset 0, its marker at 1) is not."""
    producer = 7
    log = (
        _transactional(0, producer, b"aborted")
        + marker_batch(1, producer, 0, ABORT, T0).raw
        + _transactional(2, producer, b"committed")
        + marker_batch(3, producer, 0, COMMIT, T0).raw
    )
    reader = LogReader(log, 4, [(producer, 0)])
    replay = Replay(served, reader, CHANGELOG, prefetch=False, quiet=True)  # type: ignore[arg-type]
    await replay.run(4)
    assert sorted(served.get_many([b"aborted", b"committed"])) == [b"committed"]


class FlakyReader:
    """A changelog of one batch whose first ``failures`` fetches fail as a moving leader makes them fail."""

    def __init__(self, raw: bytes, count: int, failures: int) -> None:
        self.raw, self.count, self.failures = raw, count, failures
        self.fetches = 0
        self.refreshes = 0

    async def fetch(self, tp: TopicPartition, position: int) -> RawFetch:
        self.fetches += 1
        if self.fetches <= self.failures:
            return RawFetch(None, [], NotLeaderForPartitionError)
        return RawFetch(MemoryRecords(self.raw) if position < self.count else None, [], None)

    async def refresh(self) -> None:
        self.refreshes += 1


@pytest.mark.parametrize("failures", [replay_module.RETRIES, replay_module.RETRIES + 1])
async def test_a_fetch_is_retried_up_to_its_retries_then_the_error_names_the_changelog_and_offset(
    served: PartitionStore, monkeypatch: pytest.MonkeyPatch, failures: int
) -> None:
    """RETRIES failed fetches in a row are retried (the metadata refreshed each time) and the replay completes;
    one more and the fetch's error is raised, naming the changelog and the offset."""
    monkeypatch.setattr(replay_module, "RETRY_BACKOFF", 0.001)
    reader = FlakyReader(_records_batch([(b"a", _entry(T0).encode())]), 1, failures)
    replay = Replay(served, reader, CHANGELOG, prefetch=False, quiet=True)  # type: ignore[arg-type]
    if failures > replay_module.RETRIES:
        with pytest.raises(NotLeaderForPartitionError, match=r"fetch .*app-seen-changelog.* at 0"):
            await replay.run(1)
        return
    assert await replay.run(1) == 1
    assert reader.refreshes == failures
    assert sorted(served.get_many([b"a"])) == [b"a"]


async def test_a_fetch_larger_than_one_write_is_written_in_parts_each_moving_the_position(
    served: PartitionStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One fetch of WRITE_RECORDS entries and a batch after them whose CRC is bad: the first part is written with
    its offset before the bad batch is found, so the store keeps those entries and their position."""
    monkeypatch.setattr(replay_module, "RETRY_BACKOFF", 0.001)  # a bad batch is fetched again RETRIES times
    count = replay_module.WRITE_RECORDS
    entry = _entry(T0).encode()
    first = _records_batch([(f"k{i}".encode(), entry) for i in range(count)])
    bad = bytearray(_records_batch([(b"z", entry)]))
    struct.pack_into(">q", bad, 0, count)  # its base offset, outside the CRC
    bad[-1] ^= 0xFF
    reader = LogReader(first + bytes(bad), count + 1, [])
    replay = Replay(served, reader, CHANGELOG, prefetch=False, quiet=True)  # type: ignore[arg-type]
    with pytest.raises(CorruptRecordException):
        await replay.run(count + 1)
    assert served.changelog_offset == count - 1
    assert replay.position == count
    assert len(served.get_many([b"k0", f"k{count - 1}".encode()])) == 2
