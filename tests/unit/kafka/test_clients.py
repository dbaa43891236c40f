"""The clients of the restore service and the tools: every setting each is built with, and a broker away at start."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any, ClassVar

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError

from pipeline.errors import BrokerUnavailableError
from pipeline.kafka import clients
from pipeline.kafka.clients import (
    RESTORE_CLIENT_ID,
    RESTORE_PARTITION_BYTES,
    STANDBY_CLIENT_ID,
    restore_consumer,
    restore_partition_bytes,
    started_producer,
    started_reader,
)

BOOTSTRAP = "broker-1:9092,broker-2:9092"
MIB = 1024 * 1024


class Recording:
    """A client class standing in for aiokafka's: records the settings it was built with (checked against the
    real class's parameters, so a misspelt setting fails here too), its start and its stop."""

    real: ClassVar[Callable[..., Any]]
    made: ClassVar[list[Recording]]
    refuse: ClassVar[Exception | None] = None

    def __init__(self, **settings: Any) -> None:
        inspect.signature(self.real).bind(**settings)
        self.settings = settings
        self.calls: list[str] = []
        type(self).made.append(self)

    async def start(self) -> None:
        self.calls.append("start")
        if self.refuse is not None:
            raise self.refuse

    async def stop(self) -> None:
        self.calls.append("stop")


class Consumers(Recording):
    real = AIOKafkaConsumer
    made: ClassVar[list[Recording]] = []


class Producers(Recording):
    real = AIOKafkaProducer
    made: ClassVar[list[Recording]] = []


@pytest.fixture
def consumers(monkeypatch: pytest.MonkeyPatch) -> type[Consumers]:
    """AIOKafkaConsumer, as clients.py sees it, replaced by a recording class."""
    monkeypatch.setattr(Consumers, "made", [])
    monkeypatch.setattr(Consumers, "refuse", None)
    monkeypatch.setattr(clients, "AIOKafkaConsumer", Consumers)
    return Consumers


@pytest.fixture
def producers(monkeypatch: pytest.MonkeyPatch) -> type[Producers]:
    """AIOKafkaProducer, as clients.py sees it, replaced by a recording class."""
    monkeypatch.setattr(Producers, "made", [])
    monkeypatch.setattr(Producers, "refuse", None)
    monkeypatch.setattr(clients, "AIOKafkaProducer", Producers)
    return Producers


@pytest.mark.parametrize(
    ("fetch_bytes", "per_partition"),
    [(1, 1), (4 * MIB, 4 * MIB), (16 * MIB - 1, 16 * MIB - 1), (16 * MIB, 16 * MIB), (64 * MIB, 16 * MIB)],
)
def test_a_changelog_partition_takes_the_whole_fetch_up_to_16_mib(
    fetch_bytes: int, per_partition: int
) -> None:
    """One partition may take all of a restore fetch, but never more than 16 MiB of it."""
    assert RESTORE_PARTITION_BYTES == 16 * MIB
    assert restore_partition_bytes(fetch_bytes) == per_partition


def test_the_restore_consumer_reads_committed_changelogs_from_the_start_without_a_group(
    consumers: type[Consumers],
) -> None:
    """A restore's consumer: named pipeline-restore, read_committed, from the earliest offset, no auto commit,
    the fetch size given with each partition capped at 16 MiB."""
    made = restore_consumer(BOOTSTRAP, fetch_bytes=64 * MIB)
    assert made is consumers.made[0]
    assert made.settings == {
        "bootstrap_servers": BOOTSTRAP,
        "client_id": "pipeline-restore",
        "enable_auto_commit": False,
        "isolation_level": "read_committed",
        "auto_offset_reset": "earliest",
        "max_partition_fetch_bytes": 16 * MIB,
        "fetch_max_bytes": 64 * MIB,
    }
    assert made.calls == []  # not started: the restore starts it
    assert RESTORE_CLIENT_ID == "pipeline-restore"


def test_the_standbys_consumer_is_named_for_them_and_otherwise_a_restores(consumers: type[Consumers]) -> None:
    """``client_id`` names the consumer to the broker; a small fetch is the per-partition limit too."""
    made = restore_consumer(BOOTSTRAP, fetch_bytes=MIB, client_id=STANDBY_CLIENT_ID)
    assert made.settings["client_id"] == "pipeline-standby"
    assert (made.settings["max_partition_fetch_bytes"], made.settings["fetch_max_bytes"]) == (MIB, MIB)


async def test_the_real_restore_consumer_takes_these_settings() -> None:
    """Built by aiokafka itself (never started): the settings land where aiokafka reads them."""
    made = restore_consumer(BOOTSTRAP, fetch_bytes=32 * MIB)
    await made.stop()
    assert made._client._bootstrap_servers == BOOTSTRAP
    assert made._client._client_id == RESTORE_CLIENT_ID
    assert made._isolation_level == "read_committed"
    assert made._enable_auto_commit is False
    assert (made._max_partition_fetch_bytes, made._fetch_max_bytes) == (16 * MIB, 32 * MIB)
    assert made._auto_offset_reset == "earliest"


@pytest.mark.parametrize(("from_beginning", "reset"), [(True, "earliest"), (False, "latest")])
async def test_a_tools_reader_is_a_started_group_less_read_committed_consumer(
    consumers: type[Consumers], monkeypatch: pytest.MonkeyPatch, from_beginning: bool, reset: str
) -> None:
    """``started_reader``: read_committed, no auto commit, from the earliest offset or the latest; started, then
    one turn of the loop (aiokafka's coordinator task must start before a stop)."""
    sleeps: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    made = await started_reader(BOOTSTRAP, from_beginning=from_beginning)
    assert made is consumers.made[0]
    assert made.settings == {
        "bootstrap_servers": BOOTSTRAP,
        "isolation_level": "read_committed",
        "enable_auto_commit": False,
        "auto_offset_reset": reset,
    }
    assert made.calls == ["start"]
    assert sleeps == [0]


async def test_a_tools_reader_starts_from_the_beginning_by_default(consumers: type[Consumers]) -> None:
    """With no ``from_beginning``, the reader starts at the earliest offset."""
    made = await started_reader(BOOTSTRAP)
    assert made.settings["auto_offset_reset"] == "earliest"


async def test_a_tools_producer_is_a_started_idempotent_acks_all_producer(producers: type[Producers]) -> None:
    """``started_producer``: every replica acknowledges, idempotent, batches lingering 10 ms; started."""
    made = await started_producer(BOOTSTRAP)
    assert made is producers.made[0]
    assert made.settings == {
        "bootstrap_servers": BOOTSTRAP,
        "acks": "all",
        "enable_idempotence": True,
        "linger_ms": 10,
    }
    assert made.calls == ["start"]


@pytest.mark.parametrize("start", [started_reader, started_producer])
async def test_a_client_that_cannot_reach_the_broker_is_stopped_and_broker_unavailable(
    consumers: type[Consumers], producers: type[Producers], start: Callable[[str], Any]
) -> None:
    """A start refused with a KafkaError: the client is stopped, and BrokerUnavailableError names the address
    and the error (the aiokafka traceback left out)."""
    consumers.refuse = producers.refuse = KafkaConnectionError(
        "Unable to bootstrap from [('broker-1', 9092)]"
    )
    with pytest.raises(BrokerUnavailableError) as raised:
        await start(BOOTSTRAP)
    assert str(raised.value) == (
        f"cannot reach Kafka at {BOOTSTRAP}: KafkaConnectionError: Unable to bootstrap from [('broker-1', 9092)]"
    )
    assert raised.value.__cause__ is None
    assert raised.value.__suppress_context__
    made = consumers.made if start is started_reader else producers.made
    assert [client.calls for client in made] == [["start", "stop"]]


@pytest.mark.parametrize("start", [started_reader, started_producer])
async def test_a_start_failing_otherwise_is_not_taken_for_a_broker_away(
    consumers: type[Consumers], producers: type[Producers], start: Callable[[str], Any]
) -> None:
    """Only a KafkaError means the broker is away: anything else is raised as it is."""
    consumers.refuse = producers.refuse = ValueError("a bug")
    with pytest.raises(ValueError, match="a bug"):
        await start(BOOTSTRAP)
