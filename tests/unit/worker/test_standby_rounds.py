"""A standby's rounds, step by step: what it replays and reports, how it waits and retries, and its store.

Time is the test's: the module's clock is a :class:`Clock` the test moves, and its waits are noted
(with what the standby says at that moment) instead of slept.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaConnectionError

from pipeline.errors import (
    StoreIdentityError,
    StoreLockedError,
    StoreStaleError,
    StoreUnusableError,
)
from pipeline.state.store import PartitionStore
from pipeline.state.store_meta import StoreIdentity
from pipeline.worker import standby as standby_module
from pipeline.worker.lifecycle import StandbyState
from pipeline.worker.standby import POLL_S, Standby

TP = TopicPartition("raw", 0)
CHANGELOG = TopicPartition("raw-changelog", 0)
IDENTITY = StoreIdentity(app="app", group="g", topic="raw", partition=0, changelog="raw-changelog")
BUCKET_MS = 3_600_000

Round = Callable[[PartitionStore], tuple[int, int]]  # one round: (records applied, the changelog's end)


@dataclass(frozen=True)
class Wait:
    """A wait of the standby, and what it said of itself as it began."""

    seconds: float
    state: StandbyState
    replaying: bool
    position: int
    stored: int | None


@dataclass
class Clock:
    """The standby module's clock and sleep: the test sets ``now``; waits are noted and end at once."""

    now: float = 90.0
    waits: list[Wait] = field(default_factory=list)
    standby: Standby | None = None

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        s = self.standby
        assert s is not None
        self.waits.append(Wait(seconds, s.state, s.replaying, s.position, s.stored))
        await asyncio.sleep(0)


@dataclass
class Script:
    """The restore service's standby rounds, one scripted step each; after the last, a round waits until cancelled."""

    steps: list[Round]
    changelogs: list[TopicPartition] = field(default_factory=list)
    replaying: list[bool] = field(default_factory=list)
    standby: Standby | None = None
    cancelled: bool = False

    async def catch_up(self, store: PartitionStore, changelog: TopicPartition) -> tuple[int, int]:
        self.changelogs.append(changelog)
        self.replaying.append(self.standby is not None and self.standby.replaying)
        if not self.steps:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled = True
                raise
        return self.steps.pop(0)(store)


def replay_to(offset: int, end: int, applied: int) -> Round:
    """A round that writes the store up to ``offset`` (checked against the end), reporting ``applied`` records."""

    def step(store: PartitionStore) -> tuple[int, int]:
        if offset > store.changelog_offset:
            store.write_raw([(b"k", b"v", 2 * BUCKET_MS)], changelog_offset=offset, stream_time=1)
        store.checked = True
        return applied, end

    return step


def fail(error: BaseException) -> Round:
    """A round that raises ``error``."""

    def step(_store: PartitionStore) -> tuple[int, int]:
        raise error

    return step


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The standby module's time and sleep, the test's."""
    made = Clock()
    monkeypatch.setattr(standby_module, "time", SimpleNamespace(monotonic=made.monotonic))
    monkeypatch.setattr(
        standby_module, "asyncio", SimpleNamespace(sleep=made.sleep, create_task=asyncio.create_task)
    )
    return made


def _standby(
    tmp_path: Path,
    clock: Clock,
    steps: list[Round],
    *,
    opener: Any = PartitionStore.open,
    on_applied: Callable[[int], None] | None = None,
) -> tuple[Standby, Script]:
    script = Script(steps)
    standby = Standby(
        TP,
        changelog=CHANGELOG,
        identity=IDENTITY,
        path=tmp_path / "s",
        bucket_ms=BUCKET_MS,
        restorer=script,  # type: ignore[arg-type]
        opener=opener,
        on_applied=on_applied,
    )
    clock.standby = script.standby = standby
    return standby, script


async def _until_blocked(script: Script, rounds: int) -> None:
    """Let the standby run until its ``rounds``-th round waits (the script is spent)."""
    for _ in range(1000):
        if len(script.changelogs) >= rounds:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"only {len(script.changelogs)} rounds of {rounds}")


def _store_at(path: Path, offset: int) -> None:
    store = PartitionStore.open(path, bucket_ms=BUCKET_MS, identity=IDENTITY)
    store.write_raw([(b"k", b"v", 2 * BUCKET_MS)], changelog_offset=offset, stream_time=1)
    store.close()


async def test_a_new_standby_describes_itself_as_opening_with_nothing_known(
    tmp_path: Path, clock: Clock
) -> None:
    """Before its first round: OPENING, not replaying, at position -1, lag unknown, behind since it was made."""
    standby, _ = _standby(tmp_path, clock, [])
    assert (standby.tp, standby.name, standby.changelog) == (TP, "raw-0", CHANGELOG)
    assert standby.lifecycle.name == "raw-0"
    assert standby.describe(91.23456) == {
        "state": "opening",
        "replaying": False,
        "position": -1,
        "lag_records": None,
        "lag_seconds": 1.235,
        "replayed": 0,
    }
    assert standby.applied == 0


def at(clock: Clock, now: float, step: Round) -> Round:
    """``step``, run when the clock reads ``now``."""

    def timed(store: PartitionStore) -> tuple[int, int]:
        clock.now = now
        return step(store)

    return timed


async def test_a_standby_level_with_its_changelog_has_no_lag(tmp_path: Path, clock: Clock) -> None:
    """A round that leaves the store at the changelog's end: no records and no seconds behind, whenever asked."""
    standby, script = _standby(tmp_path, clock, [at(clock, 100.0, replay_to(9, 10, 10))])
    standby.start()
    try:
        await _until_blocked(script, 2)
        assert (standby.position, standby.lag_records, standby.lag_seconds(150.0)) == (9, 0, 0.0)
    finally:
        await standby.close()


async def test_the_lag_in_seconds_counts_from_the_last_round_that_left_it_level(
    tmp_path: Path, clock: Clock
) -> None:
    """Level at 100s, then one record behind at 103s: at 104.5s it is 4.5s behind, counted from the level round,
    not from its start (90s) nor from the round that found it one behind."""
    steps = [at(clock, 100.0, replay_to(9, 10, 10)), at(clock, 103.0, replay_to(9, 11, 0))]
    standby, script = _standby(tmp_path, clock, steps)
    standby.start()
    try:
        await _until_blocked(script, 3)
        assert standby.lag_records == 1
        assert standby.describe(104.5)["lag_seconds"] == 4.5
    finally:
        await standby.close()


async def test_a_standby_never_level_is_behind_since_it_started(tmp_path: Path, clock: Clock) -> None:
    """A round that leaves it 10 records behind: behind since the standby was made (90s)."""
    standby, script = _standby(tmp_path, clock, [at(clock, 100.0, replay_to(9, 20, 10))])
    standby.start()
    try:
        await _until_blocked(script, 2)
        assert (standby.lag_records, standby.lag_seconds(100.0)) == (10, 10.0)
    finally:
        await standby.close()


async def test_each_round_replays_its_changelog_and_counts_what_it_applied(
    tmp_path: Path, clock: Clock
) -> None:
    """Rounds applying 3, 0 and 4 records: 7 applied in all, the metric told 3 then 4 (never 0), every round on the
    partition's changelog, replaying while it runs and not once it is done; a round with nothing waits POLL_S."""
    told: list[int] = []
    steps = [replay_to(2, 10, 3), replay_to(2, 10, 0), replay_to(6, 10, 4)]
    standby, script = _standby(tmp_path, clock, steps, on_applied=told.append)
    standby.start()
    try:
        await _until_blocked(script, 4)
        assert standby.applied == 7
        assert told == [3, 4]
        assert script.changelogs == [CHANGELOG] * 4
        assert script.replaying == [True] * 4
        assert [(w.seconds, w.replaying) for w in clock.waits] == [(POLL_S, False)]
    finally:
        await standby.close()


async def test_failed_rounds_are_retried_after_a_pause_that_doubles_up_to_the_maximum(
    tmp_path: Path, clock: Clock
) -> None:
    """Each failure closes the store (OPENING again) and waits 1s, 2s, 4s ... up to 30s; a round that works
    brings the pause back to 1s."""
    broker = KafkaConnectionError("no broker")
    steps = [fail(broker), fail(broker), replay_to(0, 1, 1), *[fail(broker)] * 7]
    standby, script = _standby(tmp_path, clock, steps)
    standby.start()
    try:
        await _until_blocked(script, len(steps) + 1)
        assert [w.seconds for w in clock.waits] == [1.0, 2.0, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
        assert {w.state for w in clock.waits} == {StandbyState.OPENING}
        assert standby.state is StandbyState.FOLLOWING  # open again for the round now waiting
    finally:
        await standby.close()


async def test_a_store_of_someone_else_is_left_alone_and_the_standby_ends(
    tmp_path: Path, clock: Clock
) -> None:
    """A store that belongs to another app or partition: the standby closes for good, without retrying, and the
    store stays on disk, untouched and claimed by nobody."""
    _store_at(tmp_path / "s", 7)

    def opener(path: Path, **_kwargs: Any) -> PartitionStore:
        raise StoreIdentityError(f"store {path} belongs to another app")

    standby, script = _standby(tmp_path, clock, [], opener=opener)
    standby.start()
    for _ in range(20):
        await asyncio.sleep(0)
    assert standby.state is StandbyState.CLOSED
    assert clock.waits == []
    assert script.changelogs == []
    assert await standby.close() is None
    assert (tmp_path / "s" / "CURRENT").is_file()


async def test_a_started_standby_runs_as_a_named_task_until_it_is_closed(
    tmp_path: Path, clock: Clock
) -> None:
    """Its background task is named for the partition; closing cancels the round in progress and closes the store."""
    standby, script = _standby(tmp_path, clock, [replay_to(4, 5, 5)])
    standby.start()
    await _until_blocked(script, 2)
    assert "standby raw-0" in {task.get_name() for task in asyncio.all_tasks()}
    assert await standby.close() == 4
    assert script.cancelled
    assert "standby raw-0" not in {task.get_name() for task in asyncio.all_tasks()}
    assert standby.store is None
    assert standby.state is StandbyState.CLOSED


async def test_a_standby_closed_before_it_started_knows_nothing_of_its_store(
    tmp_path: Path, clock: Clock
) -> None:
    """Closing one never started: CLOSED, and nothing known of what its store holds."""
    standby, _ = _standby(tmp_path, clock, [])
    assert await standby.close() is None
    assert standby.state is StandbyState.CLOSED


async def test_the_store_is_opened_through_the_given_opener_to_follow_its_changelog(
    tmp_path: Path, clock: Clock
) -> None:
    """The standby's opener (the simulation passes its own) opens the store where it lives, with its identity and
    bucket width, to follow: written, never read."""
    opened: list[tuple[Path, dict[str, Any]]] = []

    def opener(path: Path, **kwargs: Any) -> PartitionStore:
        opened.append((path, kwargs))
        return PartitionStore.open(path, **kwargs)

    standby, script = _standby(tmp_path, clock, [], opener=opener)
    standby.start()
    try:
        await _until_blocked(script, 1)
        assert opened == [(tmp_path / "s", {"bucket_ms": BUCKET_MS, "identity": IDENTITY, "follow": True})]
        assert standby.state is StandbyState.FOLLOWING
    finally:
        await standby.close()


async def test_a_store_that_cannot_be_opened_claims_what_it_holds_only_while_it_is_on_disk(
    tmp_path: Path, clock: Clock
) -> None:
    """A store checked at 500 whose reopen fails: locked, it still holds 500; wiped and not made again, nothing."""
    path = tmp_path / "s"
    _store_at(path, 500)
    failures: list[Exception] = []

    def opener(at: Path, **kwargs: Any) -> PartitionStore:
        if failures:
            error = failures.pop(0)
            if isinstance(error, StoreUnusableError):
                PartitionStore.wipe(at)
            raise error
        return PartitionStore.open(at, **kwargs)

    def broker_gone(_store: PartitionStore) -> tuple[int, int]:
        failures.extend([StoreLockedError("held"), StoreUnusableError("no space left on device")])
        raise KafkaConnectionError("no broker")

    standby, script = _standby(tmp_path, clock, [replay_to(500, 501, 0), broker_gone], opener=opener)
    standby.start()
    try:
        await _until_blocked(script, 3)
        assert [(w.seconds, w.stored) for w in clock.waits] == [
            (POLL_S, 500),
            (1.0, 500),
            (2.0, 500),
            (4.0, -1),
        ]
    finally:
        assert await standby.close() == -1


async def test_a_store_beyond_its_changelog_is_rebuilt_empty_with_the_standbys_opener(
    tmp_path: Path, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """A store at 30,000 that its round finds beyond the changelog's end is wiped and opened empty again, through the
    same opener with the same identity, and the warning says why; the next round follows from the start."""
    _store_at(tmp_path / "s", 30_000)
    opened: list[dict[str, Any]] = []

    def opener(path: Path, **kwargs: Any) -> PartitionStore:
        opened.append(kwargs)
        return PartitionStore.open(path, **kwargs)

    stale = StoreStaleError("store s is at changelog offset 30000, beyond the end of raw-changelog-0 (20)")
    standby, script = _standby(tmp_path, clock, [fail(stale)], opener=opener)
    standby.start()
    try:
        with caplog.at_level(logging.WARNING):
            await _until_blocked(script, 2)
        assert [kwargs["identity"] for kwargs in opened] == [IDENTITY, IDENTITY]
        assert (standby.position, standby.stored, clock.waits) == (-1, -1, [])
        assert f"{stale}; wiping it and restoring from the changelog" in caplog.messages
    finally:
        await standby.close()


async def test_a_rebuilt_store_that_cannot_be_opened_again_holds_nothing(
    tmp_path: Path, clock: Clock
) -> None:
    """The stale store is wiped before it is opened again: when that open fails, the standby holds nothing (-1)
    while it waits to retry, never the 30,000 the wiped store had."""
    _store_at(tmp_path / "s", 30_000)
    opens: list[Path] = []

    def opener(path: Path, **kwargs: Any) -> PartitionStore:
        opens.append(path)
        if len(opens) == 2:
            raise StoreUnusableError("no space left on device")
        return PartitionStore.open(path, **kwargs)

    stale = StoreStaleError("beyond the end")
    standby, script = _standby(tmp_path, clock, [fail(stale)], opener=opener)
    standby.start()
    try:
        await _until_blocked(script, 2)
        assert [(w.seconds, w.position, w.stored) for w in clock.waits] == [(1.0, -1, -1)]
    finally:
        await standby.close()
