"""The worker's producer (``worker/producer.py``): started under the worker's transactional id, replaced when
lost, tried again while a new one cannot start, and the stop after fences in a row.

Over the fake producers of ``fakes.py``; the transaction is a stand-in holding its producer.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError

from pipeline.errors import ProducerFencedError
from pipeline.worker import producer as producer_module
from pipeline.worker.identity import FENCES_ALLOWED
from pipeline.worker.producer import WorkerProducer

from .fakes import fake_io, settings

TXN_ID = "orders-worker-1"


def _producer(tmp_path: Path) -> tuple[WorkerProducer, Any]:
    io, clients = fake_io()
    return WorkerProducer(settings(tmp_path), io, TXN_ID), clients


async def test_nothing_is_replaced_until_a_producer_is_lost(tmp_path: Path) -> None:
    """With no producer lost, replace says ready and neither stops the transaction's producer nor starts one."""
    wanted, clients = _producer(tmp_path)
    txn: Any = SimpleNamespace(producer=await wanted.start())
    assert await wanted.replace(txn) is True
    assert len(clients.producers.made[TXN_ID]) == 1
    assert not txn.producer.client.stopped


async def test_a_lost_producer_is_stopped_and_a_started_one_takes_its_place(tmp_path: Path) -> None:
    """A producer lost (unusable, not fenced): replace stops it and puts a started one with the same id in the
    transaction; nothing is wanted after."""
    wanted, clients = _producer(tmp_path)
    old = await wanted.start()
    txn: Any = SimpleNamespace(producer=old)
    assert wanted.lost(fenced=False) is None
    assert wanted.wanted
    assert await wanted.replace(txn) is True
    made = clients.producers.made[TXN_ID]
    assert [p.started for p in made] == [True, True]
    assert made[0].stopped
    assert txn.producer is not old
    assert txn.producer.client is made[1]
    assert not wanted.wanted


async def test_a_new_producer_that_cannot_start_is_stopped_and_still_wanted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker is away as the new producer starts: replace says not yet, stops the half-started one, and
    the next call starts another."""
    monkeypatch.setattr(producer_module, "PRODUCER_RETRY_S", 0.001)
    wanted, clients = _producer(tmp_path)
    txn: Any = SimpleNamespace(producer=await wanted.start())
    clients.producers.prepare = lambda p: p.fail["start"].append(KafkaConnectionError())
    wanted.lost(fenced=False)
    assert await wanted.replace(txn) is False
    assert wanted.wanted
    assert clients.producers.made[TXN_ID][-1].stopped
    clients.producers.prepare = None
    assert await wanted.replace(txn) is True
    assert txn.producer.client is clients.producers.made[TXN_ID][-1]
    assert txn.producer.client.started


def test_fences_in_a_row_give_the_error_to_stop_with_and_unusable_producers_never_do(tmp_path: Path) -> None:
    """Any number of producers lost unfenced never stops the worker; the fifth fence in the window does, naming
    the transactional id."""
    wanted, _clients = _producer(tmp_path)
    assert all(wanted.lost(fenced=False) is None for _ in range(3 * FENCES_ALLOWED))
    found = [wanted.lost(fenced=True) for _ in range(FENCES_ALLOWED)]
    assert found[:-1] == [None] * (FENCES_ALLOWED - 1)
    assert isinstance(found[-1], ProducerFencedError)
    assert TXN_ID in str(found[-1])
