"""A changelog replayed into a store takes stream time from the entries, never from record timestamps."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import TopicPartition
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.record.util import calc_crc32c

from pipeline.kafka.internals import RawFetch
from pipeline.state.decision import Entry
from pipeline.state.replay import Replay, expires_at, last_seen
from pipeline.state.store import PartitionStore

HOUR = 3_600_000
DAY = 24 * HOUR
T0 = 1_700_000_000_000
CHANGELOG = TopicPartition("app-seen-changelog", 0)
LOG_APPEND_TIME = 0x08  # attributes bit 3: the broker stamped the batch
ATTRIBUTES_OFFSET, MAX_TIMESTAMP_OFFSET, CRC_OFFSET = 21, 35, 17


def _batch(entries: list[tuple[bytes, Entry]], *, stamped: int, log_append_time: bool) -> bytes:
    """One v2 batch of changelog records stamped ``stamped``; with ``log_append_time`` as a broker with
    ``message.timestamp.type=LogAppendTime`` writes it (the type bit set, max timestamp the append time)."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    for offset, (key, entry) in enumerate(entries):
        builder.append(offset, timestamp=stamped, key=key, value=entry.encode(), headers=[])
    raw = bytearray(builder.build())
    if log_append_time:
        attributes = struct.unpack_from(">h", raw, ATTRIBUTES_OFFSET)[0] | LOG_APPEND_TIME
        struct.pack_into(">h", raw, ATTRIBUTES_OFFSET, attributes)
        struct.pack_into(">q", raw, MAX_TIMESTAMP_OFFSET, stamped)
        struct.pack_into(">I", raw, CRC_OFFSET, calc_crc32c(bytes(raw[ATTRIBUTES_OFFSET:])))
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
