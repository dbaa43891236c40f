"""The worker's outside world (``pipeline.worker.io``): what :func:`kafka_io` builds its clients with."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from pipeline.kafka.clients import STANDBY_CLIENT_ID
from pipeline.kafka.fencing import fence_transactional_id
from pipeline.kafka.group import ConsumerGroup
from pipeline.state.store import PartitionStore
from pipeline.worker import io as worker_io
from pipeline.worker.clients import transactional_producer, worker_consumer
from pipeline.worker.settings import WorkerSettings


def _settings(**changes: Any) -> WorkerSettings:
    values: dict[str, Any] = {"bootstrap": "k:9092", "topology": Path("t.toml"), "state_dir": Path("/s")}
    values.update(changes)
    return WorkerSettings(**values)


def test_the_real_world_is_aiokafka_and_rocksdb() -> None:
    """kafka_io(): the worker's consumer and producer factories, the group, the fence and RocksDB stores."""
    io = worker_io.kafka_io()
    assert io.consumer is worker_consumer
    assert io.producer is transactional_producer
    assert io.group is ConsumerGroup
    assert io.fence is fence_transactional_id
    assert io.open_store == PartitionStore.open
    assert io.wall is worker_io.wall_clock


def test_kafka_io_opens_stores_with_the_opener_it_is_given() -> None:
    """A store opener passed to kafka_io() is the one the worker opens its stores with."""

    def opener(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("not called here")

    assert worker_io.kafka_io(opener).open_store is opener


def test_the_restore_reader_takes_half_the_restore_fetch_size_under_the_standby_client_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two restore fetches are in flight: each reads half of --restore-fetch-bytes (rounded down)."""
    made: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    monkeypatch.setattr(worker_io, "ChangelogReader", lambda *args, **kwargs: made.append((args, kwargs)))
    io = worker_io.kafka_io()
    io.changelog_reader(_settings(restore_fetch_bytes=64 * 1024 + 1))
    io.changelog_reader(_settings(restore_fetch_bytes=3 * 1024 * 1024))
    assert made == [
        (("k:9092",), {"fetch_bytes": 32 * 1024, "client_id": STANDBY_CLIENT_ID}),
        (("k:9092",), {"fetch_bytes": 3 * 512 * 1024, "client_id": STANDBY_CLIENT_ID}),
    ]
    assert type(made[0][1]["fetch_bytes"]) is int


def test_the_wall_clock_is_read_at_each_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """wall_clock() reads time.time when called (so a virtual clock replacing it is seen)."""
    monkeypatch.setattr(time, "time", lambda: 123.5)
    assert worker_io.wall_clock() == 123.5
