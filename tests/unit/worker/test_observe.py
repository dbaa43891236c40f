"""The per-partition gauges and the warning when stream time falls behind the changelog's margin."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition

from pipeline.state.store import PartitionStore
from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.observe import observe_store, warn_if_behind

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
