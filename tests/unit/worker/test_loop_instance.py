"""Two live workers under one ``--instance-id``: the one the group coordinator fenced out stops with a line that
says so, not with aiokafka's ``UnknownError()``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiokafka.errors import KafkaError

from pipeline.errors import InstanceIdTakenError
from pipeline.kafka import internals
from pipeline.worker.loop import Worker

from .fakes import TOPOLOGY, FakeConsumer, fake_io, settings, tp

# what aiokafka's group coordinator raises for a JoinGroup answered FENCED_INSTANCE_ID, once the code is known
FENCED = KafkaError(repr(internals.FencedInstanceIdError()))


async def _run_until_the_group_raises(tmp_path: Path, error: KafkaError, *, instance_id: str | None) -> None:
    consumer = FakeConsumer(assign={tp(0)})

    def poll(count: int) -> None:
        if count >= 2:
            raise error

    consumer.on_poll = poll
    io, _clients = fake_io(consumer=consumer)
    worker = Worker(settings(tmp_path, group="g", instance_id=instance_id), TOPOLOGY, io=io)
    await worker.start()
    await asyncio.wait_for(worker.run(), 5)


async def test_a_worker_fenced_out_of_its_group_by_a_twin_stops_naming_its_instance_id(
    tmp_path: Path,
) -> None:
    """FENCED_INSTANCE_ID from the group: InstanceIdTakenError, one line naming the group and the instance id."""
    with pytest.raises(InstanceIdTakenError) as taken:
        await _run_until_the_group_raises(tmp_path, FENCED, instance_id="worker-0")
    assert str(taken.value) == (
        "another worker joined group g with --instance-id worker-0 and took this one's place; two live workers "
        "must not share an instance id"
    )


async def test_other_group_errors_and_workers_without_an_instance_id_are_left_as_they_are(
    tmp_path: Path,
) -> None:
    """Another KafkaError is raised unchanged; so is a fenced-instance text for a worker with no instance id."""
    other = KafkaError("UnknownError()")
    with pytest.raises(KafkaError) as raised:
        await _run_until_the_group_raises(tmp_path / "a", other, instance_id="worker-0")
    assert raised.value is other
    with pytest.raises(KafkaError) as raised:
        await _run_until_the_group_raises(tmp_path / "b", FENCED, instance_id=None)
    assert raised.value is FENCED


def test_fenced_instance_is_found_in_each_shape_aiokafka_raises_it() -> None:
    """The error itself, JoinGroup's and SyncGroup's ``KafkaError(repr(err))`` and the heartbeat's text."""
    error = internals.FencedInstanceIdError()
    assert internals.fenced_instance(error)
    assert internals.fenced_instance(KafkaError(repr(error)))
    assert internals.fenced_instance(KafkaError(f"Unexpected exception in heartbeat task: {error!r}"))
    assert not internals.fenced_instance(KafkaError("UnknownError()"))
    assert not internals.fenced_instance(ValueError(repr(error)))
