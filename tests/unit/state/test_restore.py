"""The restore service: its fast read of ``expires_at`` out of an encoded entry (and its fallback), a standby's rounds."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import orjson
import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaConnectionError
from aiokafka.record.memory_records import MemoryRecords

from pipeline.errors import BrokerUnavailableError, RestoreIncompleteError, StoreStaleError
from pipeline.kafka.internals import RawFetch
from pipeline.state.decision import Entry
from pipeline.state.restore import RestoreBudget, Restorer, expires_at
from pipeline.state.store import PartitionStore
from tests.unit.state.test_replay import CHANGELOG, DAY, HOUR, T0, _batch


def test_expires_at_is_read_from_an_encoded_entry() -> None:
    """The scan finds the same value a full decode does, strings with commas and quotes included."""
    entry = Entry(1, 604_800_001, 2, 3, 4, 5, command='cmd "x":9, ,', topic="t", body_hash="h")
    assert expires_at(entry.encode()) == 604_800_001


def test_an_entry_in_another_field_order_falls_back_to_decoding() -> None:
    """A value whose first "x": is not followed by digits and a comma is decoded instead."""
    value = orjson.dumps({"c": '"x":oops', "f": 1, "x": 77, "p": 0, "o": 0})
    assert expires_at(value) == 77
    assert expires_at(orjson.dumps({"f": 1, "p": 0, "o": 0, "x": 88})) == 88


def test_a_value_that_is_not_an_entry_raises_value_error() -> None:
    """Garbage in the changelog is reported, not stored under a made-up bucket."""
    with pytest.raises(ValueError, match="not a seen-set entry"):
        expires_at(b"not json")


class StandbyReader:
    """A changelog reader over one batch of ``count`` records at offset 0 of ``CHANGELOG`` (its end: ``count``),
    noting how much of ``budget`` is free while it fetches."""

    fetch_bytes = 1_000

    def __init__(self, raw: bytes, count: int, budget: RestoreBudget) -> None:
        self.raw, self.count, self.budget = raw, count, budget
        self.free_while_fetching: list[int] = []

    async def start(self) -> None:
        """Nothing to connect to."""

    async def stop(self) -> None:
        """Nothing to close."""

    async def end(self, tp: TopicPartition) -> int:
        return {CHANGELOG: self.count}[tp]

    async def fetch(self, tp: TopicPartition, position: int) -> RawFetch:
        self.free_while_fetching.append(self.budget._free)
        records = MemoryRecords(self.raw) if tp == CHANGELOG and position < self.count else None
        return RawFetch(records, [], None)

    async def refresh(self) -> None:
        """Nothing to refresh."""


async def test_a_standby_round_replays_its_changelog_to_the_end_quietly_holding_a_fetch_of_the_budget(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One round applies what the changelog has, to its end, holding one fetch's bytes of the budget while it
    reads and logging nothing (a standby's rounds are many); the next round, with nothing new, applies nothing."""
    budget = RestoreBudget(10_000)
    entries = [(key, Entry(T0, T0 + DAY, 0, 0, last_seen=T0)) for key in (b"a", b"b")]
    reader = StandbyReader(_batch(entries, stamped=T0), len(entries), budget)
    restorer = Restorer(lambda: reader, budget, fetch_bytes=reader.fetch_bytes)  # type: ignore[arg-type,return-value]
    store = PartitionStore.open(tmp_path / "standby", bucket_ms=HOUR, follow=True)
    try:
        with caplog.at_level(logging.INFO, logger="pipeline.state"):
            assert await restorer.catch_up(store, CHANGELOG) == (2, 2)
        assert store.changelog_offset == 1
        assert store.stream_time == T0
        assert reader.free_while_fetching == [10_000 - reader.fetch_bytes]
        assert budget._free == 10_000
        assert caplog.records == []
        assert await restorer.catch_up(store, CHANGELOG) == (0, 2)
    finally:
        store.close()
        await restorer.close()


class Gauge:
    """A gauge child that keeps every value it was set to."""

    def __init__(self) -> None:
        self.values: list[float] = []

    def set(self, value: float) -> None:
        self.values.append(value)


class SplitReader(StandbyReader):
    """``count`` records at offsets 0.., each in a batch of its own, one batch per fetch; its log end is ``count``."""

    def __init__(self, keys: list[bytes], budget: RestoreBudget, *, down: bool = False) -> None:
        self.batches = [
            _batch([(key, Entry(T0, T0 + DAY, 0, 0, last_seen=T0))], stamped=T0, base_offset=offset)
            for offset, key in enumerate(keys)
        ]
        super().__init__(b"", len(keys), budget)
        self.down = down

    async def log_end(self, tp: TopicPartition) -> int:
        if self.down:
            raise KafkaConnectionError("broker down")
        return {CHANGELOG: self.count}[tp]

    async def fetch(self, tp: TopicPartition, position: int) -> RawFetch:
        records = MemoryRecords(self.batches[position]) if position < self.count else None
        return RawFetch(records, [], None)


async def test_a_restore_replays_to_the_log_end_and_reports_what_is_left_as_it_goes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Three records, one per fetch: all applied, the gauge of records left goes 2, 1, 0 (and 0 at the end),
    and a progress line comes as often as ``progress_every`` (the worker's ``restore_progress_every``) says."""
    budget = RestoreBudget(10_000)
    reader = SplitReader([b"a", b"b", b"c"], budget)
    restorer = Restorer(lambda: reader, budget, fetch_bytes=reader.fetch_bytes)  # type: ignore[arg-type,return-value]
    store = PartitionStore.open(tmp_path / "p", bucket_ms=HOUR)
    left = Gauge()
    try:
        with caplog.at_level(logging.INFO, logger="pipeline.state.replay"):
            applied = await restorer.restore(store, CHANGELOG, progress_every=0.0, remaining=left)  # type: ignore[arg-type]
        assert applied == 3
        assert left.values == [2, 1, 0, 0]
        assert sum("offsets, " in r.getMessage() for r in caplog.records) == 3
        assert sorted(store.get_many([b"a", b"b", b"c"])) == [b"a", b"b", b"c"]
        again = Gauge()
        assert await restorer.restore(store, CHANGELOG, remaining=again) == 0  # type: ignore[arg-type]
        assert again.values == [0]
        assert await restorer.restore(store, CHANGELOG) == 0
    finally:
        store.close()
        await restorer.close()


@pytest.mark.parametrize("call", ["restore", "end_of"])
async def test_a_restore_that_cannot_reach_the_broker_is_broker_unavailable_naming_the_changelog(
    tmp_path: Path, call: str
) -> None:
    """aiokafka's connection error becomes BrokerUnavailableError, with the changelog and the cause (a restore,
    and the end read before one)."""
    budget = RestoreBudget(10_000)
    reader = SplitReader([b"a"], budget, down=True)
    restorer = Restorer(lambda: reader, budget, fetch_bytes=reader.fetch_bytes)  # type: ignore[arg-type,return-value]
    store = PartitionStore.open(tmp_path / "p", bucket_ms=HOUR)
    try:
        with pytest.raises(BrokerUnavailableError, match=r"restore .*app-seen-changelog.*broker down"):
            await getattr(restorer, call)(store, CHANGELOG)
    finally:
        store.close()
        await restorer.close()


async def test_a_standby_round_waits_while_a_restore_waits_for_the_budget(tmp_path: Path) -> None:
    """A restore waiting for bytes of the budget goes first: a standby's round does not fetch, though bytes
    for it are free, until no restore waits."""
    budget = RestoreBudget(2_000)
    entries = [(b"a", Entry(T0, T0 + DAY, 0, 0, last_seen=T0))]
    reader = StandbyReader(_batch(entries, stamped=T0), 1, budget)
    reader.fetch_bytes = 500
    restorer = Restorer(lambda: reader, budget, fetch_bytes=reader.fetch_bytes)  # type: ignore[arg-type,return-value]
    store = PartitionStore.open(tmp_path / "standby", bucket_ms=HOUR, follow=True)
    holding, release_holding = asyncio.Event(), asyncio.Event()
    waiting, release_waiting = asyncio.Event(), asyncio.Event()

    async def restore(size: int, entered: asyncio.Event, release: asyncio.Event) -> None:
        async with budget.hold(size):
            entered.set()
            await release.wait()

    first = asyncio.create_task(restore(1_500, holding, release_holding))
    await holding.wait()
    second = asyncio.create_task(restore(1_000, waiting, release_waiting))  # waits: 500 free
    round_ = asyncio.create_task(restorer.catch_up(store, CHANGELOG))
    try:
        for _ in range(20):
            await asyncio.sleep(0)
        assert reader.free_while_fetching == []  # 500 free, but a restore waits
        release_holding.set()
        await waiting.wait()
        release_waiting.set()
        assert await asyncio.wait_for(round_, 5) == (1, 1)
        await asyncio.gather(first, second)
    finally:
        for task in (first, second, round_):
            task.cancel()
        store.close()
        await restorer.close()


async def test_a_store_beyond_its_changelogs_end_is_stale_naming_the_changelog_partition_and_the_end(
    tmp_path: Path,
) -> None:
    """A store at offset 4 of a changelog that ends at 2 (another log): the restore and end_of both refuse it
    with StoreStaleError naming the changelog partition and its end."""
    budget = RestoreBudget(10_000)
    reader = SplitReader([b"a", b"b"], budget)
    restorer = Restorer(lambda: reader, budget, fetch_bytes=reader.fetch_bytes)  # type: ignore[arg-type,return-value]
    store = PartitionStore.open(tmp_path / "p", bucket_ms=HOUR)
    store.write_raw([], changelog_offset=4, stream_time=0)
    try:
        beyond = r"at changelog offset 4, beyond the end of app-seen-changelog-0 \(2\)"
        with pytest.raises(StoreStaleError, match=beyond):
            await restorer.restore(store, CHANGELOG)
        with pytest.raises(StoreStaleError, match=beyond):
            await restorer.end_of(store, CHANGELOG)
    finally:
        store.close()
        await restorer.close()


class ShortReplay:
    """A replay that applies nothing and returns at once, short of any end (what a bug in the fetch loop would do)."""

    def __init__(self, store: PartitionStore, *_args: object, **_options: object) -> None:
        self.position = store.changelog_offset + 1

    async def run(self, end: int, **_options: object) -> int:
        return 0


async def test_a_restore_whose_replay_stops_short_of_the_log_end_is_not_level_and_is_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replay that returns before the end it was asked to reach leaves the store short of its changelog:
    the restore raises a retriable RestoreIncompleteError naming both offsets, it never returns as level."""
    monkeypatch.setattr("pipeline.state.restore.Replay", ShortReplay)
    budget = RestoreBudget(10_000)
    reader = SplitReader([b"a", b"b"], budget)
    restorer = Restorer(lambda: reader, budget, fetch_bytes=reader.fetch_bytes)  # type: ignore[arg-type,return-value]
    store = PartitionStore.open(tmp_path / "p", bucket_ms=HOUR)
    left = Gauge()
    try:
        with pytest.raises(
            RestoreIncompleteError,
            match=r"restore .*app-seen-changelog.*stopped at offset 0, short of its end 2",
        ) as raised:
            await restorer.restore(store, CHANGELOG, remaining=left)  # type: ignore[arg-type]
        assert raised.value.retriable
        assert left.values == []  # nothing says the restore is done
        assert budget._free == 10_000
    finally:
        store.close()
        await restorer.close()


class MarkersOnTheirWay(SplitReader):
    """A changelog of ``count`` records whose last transaction is committed and its markers not yet written:
    its last stable offset (``end``) is ``stable``, below its log end."""

    def __init__(self, keys: list[bytes], budget: RestoreBudget, *, stable: int) -> None:
        super().__init__(keys, budget)
        self.stable = stable

    async def end(self, tp: TopicPartition) -> int:
        return {CHANGELOG: self.stable}[tp]


async def test_a_standby_round_keeps_a_store_past_the_stable_end_that_the_log_end_covers(
    tmp_path: Path,
) -> None:
    """A store at offset 4 of a changelog whose log ends at 6 and whose last stable offset is 3 (the store's
    last commit went through, its markers are on their way): the round replays nothing and the store is
    kept as it is, not wiped as a cache of another log; at offset 6, beyond the log end, it is stale."""
    budget = RestoreBudget(10_000)
    reader = MarkersOnTheirWay([b"a", b"b", b"c", b"d", b"e", b"f"], budget, stable=3)
    restorer = Restorer(lambda: reader, budget, fetch_bytes=reader.fetch_bytes)  # type: ignore[arg-type,return-value]
    store = PartitionStore.open(tmp_path / "p", bucket_ms=HOUR, follow=True)
    try:
        store.write_raw([], changelog_offset=4, stream_time=0)
        assert await restorer.catch_up(store, CHANGELOG) == (0, 3)
        assert store.changelog_offset == 4
        assert store.checked
        store.write_raw([], changelog_offset=6, stream_time=0)
        with pytest.raises(
            StoreStaleError, match=r"at changelog offset 6, beyond the end of app-seen-changelog-0 \(6\)"
        ):
            await restorer.catch_up(store, CHANGELOG)
    finally:
        store.close()
        await restorer.close()


class WatchedReader(SplitReader):
    """A :class:`SplitReader` that notes, at each fetch, the offset asked and the store's position then; each fetch
    takes ``fetch_seconds`` of ``clock``."""

    def __init__(self, keys: list[bytes], budget: RestoreBudget, store: PartitionStore) -> None:
        super().__init__(keys, budget)
        self.store = store
        self.asked: list[tuple[int, int]] = []
        self.clock = 100.0
        self.fetch_seconds = 0.0

    async def fetch(self, tp: TopicPartition, position: int) -> RawFetch:
        self.asked.append((position, self.store.changelog_offset))
        self.clock += self.fetch_seconds
        return await super().fetch(tp, position)


async def test_a_restore_sends_the_next_fetch_before_it_writes_the_one_it_has(tmp_path: Path) -> None:
    """Three records, one per fetch: the fetch of each next record is sent before the record in hand is written
    (the store one behind where a fetch-then-write restore would be), none after the last."""
    budget = RestoreBudget(10_000)
    store = PartitionStore.open(tmp_path / "p", bucket_ms=HOUR)
    reader = WatchedReader([b"a", b"b", b"c"], budget, store)
    restorer = Restorer(lambda: reader, budget, fetch_bytes=reader.fetch_bytes)  # type: ignore[arg-type,return-value]
    try:
        assert await restorer.restore(store, CHANGELOG) == 3
        assert reader.asked == [(0, -1), (1, -1), (2, 0)]
    finally:
        store.close()
        await restorer.close()


async def test_a_restore_logs_its_progress_every_five_seconds_unless_told_otherwise(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restore left to its default logs a progress line once five seconds have passed: after a fetch that took
    exactly five."""
    budget = RestoreBudget(10_000)
    store = PartitionStore.open(tmp_path / "p", bucket_ms=HOUR)
    reader = WatchedReader([b"a"], budget, store)
    reader.fetch_seconds = 5.0
    monkeypatch.setattr("pipeline.state.replay.time.monotonic", lambda: reader.clock)
    restorer = Restorer(lambda: reader, budget, fetch_bytes=reader.fetch_bytes)  # type: ignore[arg-type,return-value]
    try:
        with caplog.at_level(logging.INFO, logger="pipeline.state.replay"):
            assert await restorer.restore(store, CHANGELOG) == 1
        assert [r.getMessage() for r in caplog.records if "offsets, " in r.getMessage()] == [
            f"restore {CHANGELOG}: 1/1 offsets, 0 records/s, ETA 0s"
        ]
    finally:
        store.close()
        await restorer.close()


class CountingReader(StandbyReader):
    """A reader over an empty changelog that counts its starts and stops."""

    def __init__(self, budget: RestoreBudget) -> None:
        super().__init__(b"", 0, budget)
        self.starts = self.stops = 0

    async def start(self) -> None:
        self.starts += 1

    async def stop(self) -> None:
        self.stops += 1


async def test_closing_the_restorer_stops_its_reader_once_and_the_next_use_starts_another() -> None:
    """A restorer closed before any use stops nothing; closed after one, it stops its reader once (a second close
    stops nothing more), and the next use starts a new reader."""
    budget = RestoreBudget(10_000)
    readers: list[CountingReader] = []

    def make() -> CountingReader:
        readers.append(CountingReader(budget))
        return readers[-1]

    restorer = Restorer(make, budget, fetch_bytes=1_000)  # type: ignore[arg-type]
    await restorer.close()
    assert readers == []
    first = await restorer.reader()
    await restorer.close()
    await restorer.close()
    assert (len(readers), readers[0].starts, readers[0].stops) == (1, 1, 1)
    second = await restorer.reader()
    assert second is not first
    assert (len(readers), readers[1].starts, readers[1].stops) == (2, 1, 0)
    await restorer.close()
    assert readers[1].stops == 1
