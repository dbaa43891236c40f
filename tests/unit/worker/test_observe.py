"""The per-partition gauges and the warning when stream time falls behind the changelog's margin."""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aiokafka import TopicPartition
from prometheus_client import Gauge

from pipeline.state.store import PartitionStore
from pipeline.worker import observe
from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.observe import forget_partition, observe_lag, observe_store, warn_if_behind

from .fakes import INPUT, Harness

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS


def _partition(tmp_path: Path, behind_ms: int) -> Any:
    store = PartitionStore.open(tmp_path / "p0", bucket_ms=HOUR_MS)
    store.write({}, changelog_offset=None, stream_time=int(time.time() * 1000) - behind_ms)
    return SimpleNamespace(tp=TopicPartition("raw", 0), store=store)


def test_a_partition_behind_the_margin_warns_once_in_a_while(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Stream time two days behind with a one-day margin: one WARNING naming the partition, then quiet."""
    part = _partition(tmp_path, 2 * DAY_MS)
    with caplog.at_level(logging.WARNING):
        warned = warn_if_behind(part, DAY_MS, float("-inf"))
        assert warn_if_behind(part, DAY_MS, warned) == warned
    part.store.close()
    assert len(caplog.records) == 1
    assert "raw-0" in caplog.text
    assert "48.0 h behind" in caplog.text


def test_a_partition_within_the_margin_does_not_warn(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Half a day behind with a one-day margin is no warning."""
    part = _partition(tmp_path, DAY_MS // 2)
    with caplog.at_level(logging.WARNING):
        assert warn_if_behind(part, DAY_MS, float("-inf")) == float("-inf")
    part.store.close()
    assert caplog.records == []


def test_the_gauge_says_how_far_stream_time_is_behind(tmp_path: Path) -> None:
    """pipeline_stream_time_behind_seconds is the clock minus the store's stream time."""
    part = _partition(tmp_path, 2 * HOUR_MS)
    metrics = WorkerMetrics.create()
    observe_store(metrics, part, 0.0)
    part.store.close()
    behind = metrics.stream_time_behind.labels("raw", "0")._value.get()
    assert 7199 <= behind <= 7260


class Clock:
    """Stands in for the ``time`` module in observe: wall clock and monotonic clock set by the test."""

    def __init__(self, wall: float = 1_000_000.0, mono: float = 5_000.0) -> None:
        self.wall = wall
        self.mono = mono

    def time(self) -> float:
        """The wall clock, in seconds."""
        return self.wall

    def monotonic(self) -> float:
        """The monotonic clock, in seconds."""
        return self.mono


class FakeStore:
    """The store as observe reads it: a stream time, a key estimate and bytes on disk."""

    def __init__(self, stream_time: int, *, keys: int = 7, disk: int = 4096) -> None:
        self.stream_time = stream_time
        self.keys = keys
        self.disk = disk

    def key_count(self) -> int:
        """The key estimate."""
        return self.keys

    def disk_bytes(self) -> int:
        """Bytes on disk."""
        return self.disk


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """observe's clocks, under the test's control."""
    fake = Clock()
    monkeypatch.setattr(observe, "time", fake)
    return fake


def _gauge(metrics: WorkerMetrics, name: str, partition: str = "3") -> float | None:
    """The sample of gauge ``name`` for partition ``raw-<partition>``, None when not reported."""
    return metrics.registry.get_sample_value(name, {"topic": "raw", "partition": partition})


def _task(*, position: int, next_offset: int | None, store: FakeStore | None = None) -> Any:
    """An active task of raw-3 moved to ``position``, whose transaction part is next at ``next_offset``."""
    return SimpleNamespace(
        tp=TopicPartition("raw", 3),
        position=position,
        part=SimpleNamespace(next_offset=next_offset),
        store=store,
    )


def _consumer(highwater: int | None) -> Any:
    """A consumer whose log end for every partition is ``highwater``."""
    return SimpleNamespace(highwater=lambda _tp: highwater)


def test_lag_counts_from_the_transaction_s_next_offset() -> None:
    """Lag is the log end minus the offset the partition's transaction will handle next."""
    metrics = WorkerMetrics.create()
    observe_lag(metrics, _consumer(100), _task(position=10, next_offset=60))
    assert _gauge(metrics, "pipeline_consumer_lag") == 40.0


def test_lag_counts_from_the_position_before_anything_is_handled() -> None:
    """With no next offset yet, lag is the log end minus the consumer's position."""
    metrics = WorkerMetrics.create()
    observe_lag(metrics, _consumer(100), _task(position=75, next_offset=None))
    assert _gauge(metrics, "pipeline_consumer_lag") == 25.0


def test_a_caught_up_partition_has_no_lag() -> None:
    """Handled to the log end (or past a stale log end) is a lag of 0, never negative."""
    metrics = WorkerMetrics.create()
    observe_lag(metrics, _consumer(100), _task(position=0, next_offset=100))
    assert _gauge(metrics, "pipeline_consumer_lag") == 0.0
    observe_lag(metrics, _consumer(100), _task(position=0, next_offset=130))
    assert _gauge(metrics, "pipeline_consumer_lag") == 0.0


def test_lag_is_not_reported_without_a_log_end_or_a_transaction_part() -> None:
    """No highwater known yet, or no part in the transaction: the lag gauge is left unset."""
    metrics = WorkerMetrics.create()
    observe_lag(metrics, _consumer(None), _task(position=0, next_offset=5))
    task = _task(position=0, next_offset=5)
    task.part = None
    observe_lag(metrics, _consumer(100), task)
    assert _gauge(metrics, "pipeline_consumer_lag") is None


def test_store_gauges_and_disk_measured_once_due(clock: Clock) -> None:
    """Keys and stream time behind are set each call; bytes on disk only after DISK_MEASURE_EVERY, which is then now."""
    metrics = WorkerMetrics.create()
    task = _task(position=0, next_offset=0, store=FakeStore(int(clock.wall * 1000) - 90_000))
    assert observe_store(metrics, task, clock.mono - 10.5) == clock.mono
    assert _gauge(metrics, "pipeline_store_keys") == 7.0
    assert _gauge(metrics, "pipeline_stream_time_behind_seconds") == 90.0
    assert _gauge(metrics, "pipeline_store_disk_bytes") == 4096.0


def test_the_disk_is_not_walked_again_within_its_interval(clock: Clock) -> None:
    """Measured exactly DISK_MEASURE_EVERY seconds ago (or just now) is not due: bytes stay unreported."""
    metrics = WorkerMetrics.create()
    task = _task(position=0, next_offset=0, store=FakeStore(int(clock.wall * 1000)))
    due = clock.mono - observe.DISK_MEASURE_EVERY
    assert observe_store(metrics, task, due) == due
    assert observe_store(metrics, task, clock.mono) == clock.mono
    assert _gauge(metrics, "pipeline_store_disk_bytes") is None
    assert _gauge(metrics, "pipeline_store_keys") == 7.0


def test_a_store_without_stream_time_reports_no_time_behind(clock: Clock) -> None:
    """Stream time 0 (nothing written yet) is not "55 years behind": the gauge is left unset."""
    metrics = WorkerMetrics.create()
    observe_store(metrics, _task(position=0, next_offset=0, store=FakeStore(0)), clock.mono)
    assert _gauge(metrics, "pipeline_stream_time_behind_seconds") is None


def test_the_earliest_stream_time_is_reported(clock: Clock) -> None:
    """A stream time of 1 ms after the epoch is a stream time: the gauge says how far behind it is."""
    metrics = WorkerMetrics.create()
    observe_store(metrics, _task(position=0, next_offset=0, store=FakeStore(1)), clock.mono)
    assert _gauge(metrics, "pipeline_stream_time_behind_seconds") == clock.wall - 0.001


def test_stream_time_ahead_of_the_clock_is_zero_behind(clock: Clock) -> None:
    """Records dated after the clock make stream time ahead: 0 seconds behind, never negative."""
    metrics = WorkerMetrics.create()
    observe_store(
        metrics, _task(position=0, next_offset=0, store=FakeStore(int(clock.wall * 1000) + 500)), 0.0
    )
    assert _gauge(metrics, "pipeline_stream_time_behind_seconds") == 0.0


def test_no_store_reports_nothing_and_keeps_the_measure_time() -> None:
    """A task without a store (opening) sets no gauge and returns when the disk was last measured."""
    metrics = WorkerMetrics.create()
    assert observe_store(metrics, _task(position=0, next_offset=0), 12.5) == 12.5
    assert _gauge(metrics, "pipeline_store_keys") is None


def test_no_stream_time_is_no_warning(clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    """No store, or a store with stream time 0, is never said to be behind."""
    with caplog.at_level(logging.WARNING):
        assert warn_if_behind(_task(position=0, next_offset=0), DAY_MS, float("-inf")) == float("-inf")
        empty = _task(position=0, next_offset=0, store=FakeStore(0))
        assert warn_if_behind(empty, DAY_MS, float("-inf")) == float("-inf")
    assert caplog.records == []


def test_the_earliest_stream_time_is_far_behind(clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    """A stream time of 1 ms after the epoch is real and far behind: it warns, and returns now."""
    with caplog.at_level(logging.WARNING):
        assert warn_if_behind(_task(position=0, next_offset=0, store=FakeStore(1)), DAY_MS, 0.0) == clock.mono
    assert len(caplog.records) == 1


def test_exactly_the_margin_behind_is_no_warning(clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    """Behind by exactly the margin is within it; one millisecond more warns."""
    now_ms = int(clock.wall * 1000)
    with caplog.at_level(logging.WARNING):
        at_margin = _task(position=0, next_offset=0, store=FakeStore(now_ms - DAY_MS))
        assert warn_if_behind(at_margin, DAY_MS, float("-inf")) == float("-inf")
        assert caplog.records == []
        past = _task(position=0, next_offset=0, store=FakeStore(now_ms - DAY_MS - 1))
        assert warn_if_behind(past, DAY_MS, float("-inf")) == clock.mono
    assert len(caplog.records) == 1


def test_the_warning_repeats_once_its_interval_has_passed(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """Warned BEHIND_WARN_EVERY seconds ago exactly: it warns again; a moment less: it stays quiet."""
    task = _task(position=0, next_offset=0, store=FakeStore(int(clock.wall * 1000) - 2 * DAY_MS))
    with caplog.at_level(logging.WARNING):
        recent = clock.mono - observe.BEHIND_WARN_EVERY + 0.5
        assert warn_if_behind(task, DAY_MS, recent) == recent
        assert warn_if_behind(task, DAY_MS, clock.mono - observe.BEHIND_WARN_EVERY) == clock.mono
    assert len(caplog.records) == 1


def test_a_released_partition_is_no_longer_reported() -> None:
    """forget_partition removes every per-partition gauge of that partition, and only of that one."""
    metrics = WorkerMetrics.create()
    gauges = {
        "pipeline_consumer_lag": metrics.lag,
        "pipeline_restore_remaining_records": metrics.restore_remaining,
        "pipeline_store_keys": metrics.store_keys,
        "pipeline_store_disk_bytes": metrics.store_bytes,
        "pipeline_stream_time_behind_seconds": metrics.stream_time_behind,
    }
    for gauge in gauges.values():
        gauge.labels("raw", "3").set(5)
        gauge.labels("raw", "4").set(6)
    forget_partition(metrics, TopicPartition("raw", 3))
    for name in gauges:
        assert _gauge(metrics, name, "3") is None, name
        assert _gauge(metrics, name, "4") == 6.0, name


def test_forgetting_a_partition_never_reported_is_harmless() -> None:
    """forget_partition on a partition with no gauges set does nothing and raises nothing."""
    metrics = WorkerMetrics.create()
    forget_partition(metrics, TopicPartition("raw", 9))
    assert _gauge(metrics, "pipeline_consumer_lag", "9") is None


class ForgetfulGauge:
    """A gauge whose ``remove`` of a label set never reported raises KeyError, as older prometheus_client did."""

    def __init__(self) -> None:
        self.removed: list[tuple[str, ...]] = []

    def remove(self, *labels: str) -> None:
        """Raise KeyError: the label set was never reported."""
        self.removed.append(labels)
        raise KeyError(labels)


def test_a_gauge_that_never_had_the_partition_is_skipped() -> None:
    """A KeyError from one gauge's remove (never reported) is ignored and the other gauges are still cleared."""
    metrics = WorkerMetrics.create()
    metrics.store_keys.labels("raw", "3").set(5)
    forgetful = ForgetfulGauge()
    forget_partition(dataclasses.replace(metrics, lag=cast("Gauge", forgetful)), TopicPartition("raw", 3))
    assert forgetful.removed == [("raw", "3")]
    assert _gauge(metrics, "pipeline_store_keys") is None


async def test_a_task_ready_but_not_yet_positioned_counts_its_whole_log_as_lag(tmp_path: Path) -> None:
    """A task serving before the consumer is moved to its offset (the beginning still being looked up): its lag
    is the whole log, and reporting it does not fail."""
    h = Harness(tmp_path)
    task = h.task(0)
    try:
        await task.open(h.txn, time.monotonic() + h.settings.open_timeout)
        observe_lag(h.metrics, _consumer(100), task)
        labels = {"topic": INPUT, "partition": "0"}
        assert h.metrics.registry.get_sample_value("pipeline_consumer_lag", labels) == 100.0
    finally:
        h.close()
