"""Fixtures of the worker's unit tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition

from pipeline.worker.loop import Worker

from .effect_world import Make, build_world
from .fakes import TOPOLOGY, FakeConsumer, FakeReader, Harness, Running, Starter, fake_io, settings

Opener = Callable[..., Awaitable[Harness]]


@pytest.fixture
def open_partition(tmp_path: Path) -> Iterator[Opener]:
    """Open partition 0's task for real (store in tmp_path) over a FakeProducer's transaction and an empty changelog."""
    opened: list[Harness] = []

    async def make(*, limits: dict[str, int] | None = None, **overrides: Any) -> Harness:
        harness = Harness(tmp_path, overrides, limits)
        await harness.open(0)
        opened.append(harness)
        return harness

    yield make
    for harness in opened:
        harness.close()


@pytest.fixture
def effect_world() -> Make:
    """Build effects partition 0's stage: ``limits`` override 4 MiB, ``partitioner`` murmur2, the rest go to the stage."""
    return build_world


@pytest.fixture
async def start_worker(tmp_path: Path) -> AsyncIterator[Starter]:
    """Start a Worker over a FakeConsumer (``assign``, ``committed``, ``logs``), a fake producer and changelog."""
    started: list[Running] = []

    async def start(
        *,
        assign: set[TopicPartition],
        committed: dict[TopicPartition, int] | None = None,
        logs: dict[TopicPartition, list[Any]] | None = None,
        reader: FakeReader | None = None,
        limits: dict[str, str] | None = None,
        **overrides: Any,
    ) -> Running:
        consumer = FakeConsumer(assign=assign, committed=committed, logs=logs)
        io, clients = fake_io(reader=reader, consumer=consumer, limits=limits)
        # transactions stay open until the test acts, unless it asks for another policy
        values = {
            "commit_interval": 60.0,
            "transaction_timeout": 120.0,
            "commit_policy": "interval",
            "open_timeout": 5.0,
            **overrides,
        }
        worker = Worker(settings(tmp_path, **values), TOPOLOGY, io=io)
        await worker.start()
        running = Running(worker, clients)
        started.append(running)
        return running

    yield start
    for running in started:  # whatever a test left running is stopped (and its task awaited)
        running.worker.stop()
        if running.task is not None:
            await asyncio.gather(running.task, return_exceptions=True)
        elif running.worker._consumer is not None:
            await running.worker.run()
