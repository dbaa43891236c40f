"""The stale rule (tests/simulation/stale.py): a store called stale must lie beyond its changelog's end in the broker model."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition

from pipeline.errors import StoreStaleError
from pipeline.state import restore
from pipeline.state.store import PartitionStore
from tests.simulation.stale import StaleCheck

BUCKET_MS = 3_600_000
CHANGELOG = TopicPartition("sim-seen-changelog", 0)


def _world(log_end: int) -> Any:
    """A world whose broker holds one changelog partition ending at ``log_end``."""
    log = SimpleNamespace(end=log_end)
    broker = SimpleNamespace(
        log=lambda topic, partition: log if (topic, partition) == ("sim-seen-changelog", 0) else None
    )
    return SimpleNamespace(broker=broker)


def _store_at(tmp_path: Path, offset: int) -> PartitionStore:
    store = PartitionStore.open(tmp_path / "p", bucket_ms=BUCKET_MS)
    store.write_raw([], changelog_offset=offset, stream_time=0)
    return store


@pytest.mark.parametrize(("offset", "log_end", "problems"), [(5, 6, 1), (6, 6, 0), (1000, 6, 0)])
def test_a_store_called_stale_is_a_problem_only_below_the_changelogs_end(
    tmp_path: Path, offset: int, log_end: int, problems: int
) -> None:
    """Called stale against a stable end of 3: a problem at offset 5 of a log ending at 6 (it has it all), none at 6 or beyond."""
    check = StaleCheck(_world(log_end))
    store = _store_at(tmp_path, offset)
    try:
        with check.installed(), pytest.raises(StoreStaleError):
            restore._level(store, CHANGELOG, 3)
    finally:
        store.close()
    assert check.stale == 1
    assert len(check.problems) == problems
    assert restore._level.__name__ == "_level"  # put back after the block
