"""``pipeline rescale``'s partition raise (pipeline/ops/rescale.py), against a fake admin client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError

from pipeline import topology
from pipeline.errors import BrokerUnavailableError
from pipeline.kafka.admin import topic_specs
from pipeline.ops import rescale
from tests.integration.harness import write_topology


class SlowBroker:
    """An admin client whose broker serves added partitions only after a few metadata answers."""

    def __init__(self, counts: dict[str, int], lag: int) -> None:
        self.counts = dict(counts)
        self.served = dict(counts)
        self.lag = lag
        self.answers_after_create = 0

    async def create_partitions(self, wanted: dict[str, Any]) -> None:
        for name, spec in wanted.items():
            self.counts[name] = spec.total_count
        self.answers_after_create = 0

    async def describe_topics(self, names: list[str]) -> list[dict[str, Any]]:
        self.answers_after_create += 1
        if self.answers_after_create > self.lag:
            self.served = dict(self.counts)
        return [{"topic": n, "error_code": 0, "partitions": list(range(self.served[n]))} for n in names]


async def test_raising_partitions_returns_only_once_the_broker_serves_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition just added is waited for until the broker's metadata shows it, before any entry moves there."""
    topo = topology.load(write_topology(tmp_path / "t.toml", "rescale-unit", partitions=4))
    names = [spec.name for spec in topic_specs(topo, 8)]
    broker = SlowBroker(dict.fromkeys(names, 4), lag=3)

    @asynccontextmanager
    async def fake_admin(_bootstrap: str) -> AsyncIterator[SlowBroker]:
        yield broker

    async def count(_bootstrap: str, name: str) -> int:
        return broker.served[name]

    monkeypatch.setattr(rescale, "admin_client", fake_admin)
    monkeypatch.setattr(rescale, "partition_count", count)
    await rescale._raise_partitions("127.0.0.1:1", names, 8, lambda _line: None)
    assert broker.served == dict.fromkeys(names, 8)


@pytest.mark.parametrize(
    "error",
    [
        BrokerUnavailableError("lost Kafka at 127.0.0.1:1: no answer within 10s"),
        KafkaConnectionError("closed"),
    ],
)
async def test_a_broker_lost_mid_rescale_says_to_run_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    """The broker going away partway (a half-raised rescale) ends in one line that says to run it again."""
    topo = topology.load(write_topology(tmp_path / "t.toml", "rescale-unit", partitions=4))

    async def lost(*_args: object) -> int:
        raise error

    monkeypatch.setattr(rescale, "_rescale", lost)
    with pytest.raises(rescale.RescaleError, match="run it again, it resumes") as caught:
        await rescale.rescale(
            "127.0.0.1:1", topo, partitions=8, group="g", state_file=tmp_path / "rescale.json"
        )
    assert str(error) in str(caught.value) or repr(error) in str(caught.value)
