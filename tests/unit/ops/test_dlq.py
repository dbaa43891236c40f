"""``pipeline dlq list`` and ``dlq replay`` over a fake consumer: read to the end offsets, or fail saying how far."""

from __future__ import annotations

import asyncio
import io
import types
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from pipeline import dead_letter
from pipeline import topology as topology_module
from pipeline.cli.main import main
from pipeline.contract import Delivery
from pipeline.headers import COMMAND_TOPIC_HEADER, EFFECT_TTL_HEADER, REPLAYED_FROM_HEADER
from pipeline.kafka.partitioner import owner_partition
from pipeline.ops import dlq as dlq_module
from pipeline.ops.dlq import list_dlq
from pipeline.ops.dlq_records import DlqFilter
from tests.unit.kafka.reader_fakes import Partitions
from tests.unit.worker.fakes import TOPOLOGY_PATH

TOPOLOGY = topology_module.load(TOPOLOGY_PATH)
DLQ, INPUT = TOPOLOGY.topics.dlq, TOPOLOGY.topics.input


class FakeProducer:
    """An idempotent producer that acknowledges every send at once, keeping what it was sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, int, bytes | None, list[tuple[str, bytes]]]] = []

    async def send(
        self, topic: str, value: bytes, *, key: bytes | None, partition: int, headers: Any, **_: Any
    ) -> Any:
        self.sent.append((topic, partition, key, list(headers)))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    async def stop(self) -> None:
        return None


@pytest.fixture
def broker(monkeypatch: pytest.MonkeyPatch) -> Partitions:
    """The DLQ (two partitions) behind ``dlq``'s consumer, on a clock that only fetches move."""
    held = Partitions.of(DLQ, {0: 9, 1: 5}, input_topic=INPUT)
    fake_time = types.SimpleNamespace(monotonic=held.clock.monotonic)
    monkeypatch.setattr(dlq_module, "time", fake_time)  # where the scan took its time before the fix
    monkeypatch.setattr("pipeline.kafka.bounded_read.time", fake_time, raising=False)

    async def partition_count(_: str, topic: str) -> int:
        return len(held.ends) if topic == DLQ else 6

    async def started_reader(_: str) -> Any:
        return await held.connect()

    monkeypatch.setattr(dlq_module, "partition_count", partition_count)
    monkeypatch.setattr(dlq_module, "started_reader", started_reader)
    return held


@pytest.fixture
def producer(monkeypatch: pytest.MonkeyPatch) -> FakeProducer:
    """The producer ``dlq replay`` sends with."""
    made = FakeProducer()

    async def started_producer(_: str) -> FakeProducer:
        return made

    monkeypatch.setattr(dlq_module, "started_producer", started_producer)
    return made


async def test_records_that_stop_coming_for_longer_than_the_old_idle_window_are_still_all_listed(
    broker: Partitions,
) -> None:
    """Partition 0 gives nothing for 20 s (twice the old 5 s idle window) half-way to its end: every record is still listed."""
    broker.pauses[(0, 4)] = 40  # 40 empty fetches of 0.5 s
    out = io.StringIO()
    counts = await list_dlq("x", DLQ, DlqFilter(), out=out, as_json=False)
    assert counts == Counter({"unknown-source": 14})
    listed = [line.split()[0] for line in out.getvalue().splitlines()]
    assert sorted(listed) == sorted([f"0:{o}" for o in range(9)] + [f"1:{o}" for o in range(5)])


def test_a_replay_that_cannot_reach_the_end_exits_1_with_one_line_naming_the_partition_and_the_count(
    broker: Partitions, producer: FakeProducer, capsys: pytest.CaptureFixture[str]
) -> None:
    """Partition 1 never gets past offset 2 of 6: exit 1 and one stderr line with partition, offset, end and records replayed."""
    broker.reachable[1] = 2
    status = main(["dlq", "replay", "--bootstrap", "x", "--topology", str(TOPOLOGY_PATH)])
    captured = capsys.readouterr()
    assert status == 1
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(
        f"pipeline: error: replay stopped: reading {DLQ} stopped short of its end: partition 1 at offset 2 of 6 "
    )
    assert "after 60s without progress" in lines[0]
    assert lines[0].endswith(
        "; 11 records replayed so far (running it again is safe: the worker dedupes replays)"
    )
    assert len(producer.sent) == 11  # 9 of partition 0 and 2 of partition 1, each once
    assert "replayed 11 records" not in captured.out  # no summary claiming a finished run


def test_an_effect_stage_dlq_record_is_replayed_into_the_effects_topic_keyed_by_its_effect_key(
    broker: Partitions, producer: FakeProducer, capsys: pytest.CaptureFixture[str]
) -> None:
    """A too-large DLQ record from the effect stage goes back to the effects topic, on its effect key's partition,
    with its headers and replayed-from, so the effect stage forwards it once its command topic's limit is raised."""
    effects = TOPOLOGY.topics.effects
    headers = ((EFFECT_TTL_HEADER, b"604800000"), (COMMAND_TOPIC_HEADER, TOPOLOGY.topics.commands.encode()))
    command = b'{"command":"fulfil-order","key":"stripe:evt_1","effect_key":"fulfil-order:pi_1"}'
    delivery = Delivery(effects, 4, 12, 1_790_000_000_000, b"fulfil-order:pi_1", command, headers)
    value = dead_letter.dlq_value(delivery, error="larger than its command topic takes", reason="too-large")
    broker.records = {0: {0: replace(broker.records[0][0], key=delivery.key, value=value)}, 1: {}}
    broker.ends = {0: 1, 1: 0}
    status = main(["dlq", "replay", "--bootstrap", "x", "--topology", str(TOPOLOGY_PATH)])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    [(topic, partition, key, sent_headers)] = producer.sent
    assert (topic, key) == (effects, b"fulfil-order:pi_1")
    assert partition == owner_partition(
        b"fulfil-order:pi_1", 6
    )  # the fixture's count for every topic but the DLQ
    assert sent_headers == [*headers, (REPLAYED_FROM_HEADER, f"{DLQ}:0:0".encode())]
    assert f"-> {effects}:{partition}" in captured.out
    assert f"replayed 1 record: too-large 1 to {effects}; skipped 0" in captured.out
