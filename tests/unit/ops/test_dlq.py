"""``pipeline dlq list`` and ``dlq replay`` over a fake consumer: read to the end offsets, or fail saying how far."""

from __future__ import annotations

import asyncio
import io
import types
from collections import Counter
from typing import Any

import pytest

from pipeline import topology as topology_module
from pipeline.cli.main import main
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
        self.sent: list[tuple[str, bytes | None, list[tuple[str, bytes]]]] = []

    async def send(self, topic: str, value: bytes, *, key: bytes | None, headers: Any, **_: Any) -> Any:
        self.sent.append((topic, key, list(headers)))
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
    broker: Partitions, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Partition 1 never gets past offset 2 of 6: exit 1 and one stderr line with partition, offset, end and records replayed."""
    broker.reachable[1] = 2
    producer = FakeProducer()

    async def started_producer(_: str) -> FakeProducer:
        return producer

    monkeypatch.setattr(dlq_module, "started_producer", started_producer)
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
