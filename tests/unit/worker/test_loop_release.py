"""What a worker gives back as it stops: every release runs though one before it raised."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pipeline.worker.loop import Worker

from .fakes import TOPOLOGY, FakeConsumer, fake_io, settings


async def test_a_close_that_raises_still_lets_the_consumer_leave_and_frees_the_state_dir(
    tmp_path: Path,
) -> None:
    """A background task's error out of its close (the metadata refresh's here) comes out of the stop after
    the consumer has left the group and the state directory is unlocked: another worker takes it at once."""
    consumer = FakeConsumer(assign=set())
    io, _clients = fake_io(consumer=consumer)
    worker_settings = settings(tmp_path)
    worker = Worker(worker_settings, TOPOLOGY, io=io)
    await worker.start()

    async def broken_close() -> None:
        raise RuntimeError("a bug in the metadata refresh")

    worker._metadata.close = broken_close  # type: ignore[method-assign]
    task = asyncio.create_task(worker.run())
    await asyncio.sleep(0.05)
    worker.stop()
    with pytest.raises(RuntimeError, match="a bug in the metadata refresh"):
        await asyncio.wait_for(task, 5)
    assert consumer.stopped
    again, _ = fake_io(consumer=FakeConsumer(assign=set()))
    successor = Worker(worker_settings, TOPOLOGY, io=again)
    await successor.start()  # raises StateDirInUseError while the first still holds the directory
    successor.stop()
    await asyncio.wait_for(successor.run(), 5)
