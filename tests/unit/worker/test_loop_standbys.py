"""A running worker given a standby by its group: it says so in standby_partitions(), /healthz and /partitions.

The group's assignment reaches the worker's assignor as aiokafka hands it over (``on_assignment``,
before the rebalance listener runs); the standby then follows its (empty) changelog.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from pathlib import Path
from typing import Any

import aiohttp
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

from pipeline.worker.assignor import encode_standbys
from pipeline.worker.loop import Worker
from tests.unit.worker.test_loop import eventually as _eventually

from .fakes import INPUT, TOPOLOGY, FakeConsumer, fake_io, keys_for, records, settings, tp

TP0, TP1 = tp(0), tp(1)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


async def test_a_worker_holding_a_standby_names_it_in_its_health_and_partitions_pages(tmp_path: Path) -> None:
    """Partition 0 served and partition 1 kept as a standby: standby_partitions(), health() and the HTTP pages
    list the standby (and it never makes the worker unready)."""
    assignors: list[Any] = []
    io, clients = fake_io(consumer=FakeConsumer(assign={TP0}, logs={TP0: records(0, 0, keys_for(0, 2))}))

    def consumer(_settings: Any, *, assignor: Any) -> FakeConsumer:
        assignors.append(assignor)
        return clients.consumer

    port = _free_port()
    worker = Worker(
        settings(tmp_path, standby_replicas=1, metrics_port=port),
        TOPOLOGY,
        io=dataclasses.replace(io, consumer=consumer),
    )
    await worker.start()
    (assignor,) = assignors
    assignor.on_assignment(
        ConsumerProtocolMemberAssignment(assignor.version, [(INPUT, [0])], encode_standbys([TP1]))
    )
    task = asyncio.create_task(worker.run())
    try:
        await _eventually(lambda: (t := worker.tasks.get(TP0)) is not None and t.serving, what="partition 0")
        assert worker.standby_partitions() == {TP1}
        health = worker.health()
        assert health.ready
        assert set(health.detail["standby"]) == {f"{INPUT}-1"}
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/partitions") as answer:
                pages = await answer.json()
            async with http.get(f"http://127.0.0.1:{port}/healthz") as answer:
                healthz = await answer.json()
        assert (pages["partitions"], pages["standby"]) == ({INPUT: [0]}, {INPUT: [1]})
        assert set(pages["standbys"]) == {f"{INPUT}-1"}
        assert set(healthz["standby"]) == {f"{INPUT}-1"}
    finally:
        worker.stop()
        await asyncio.wait_for(task, 5)
    assert worker.standby_partitions() == set()  # closed with the worker
