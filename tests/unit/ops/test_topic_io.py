"""``pipeline tail`` (pipeline/ops/topic_io.py) against a fake reader."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import pytest

from pipeline.ops import topic_io


class CancellingReader:
    """A reader with nothing to read whose ``stop()`` lets aiokafka's fetcher ``CancelledError`` out, as
    aiokafka does when its fetcher was sleeping a retry backoff (the broker away)."""

    def __init__(self) -> None:
        self.stopped = False

    def assign(self, _tps: list[Any]) -> None:
        pass

    async def seek_to_beginning(self, *_tps: Any) -> None:
        pass

    async def getmany(self, timeout_ms: int) -> dict[Any, list[Any]]:
        await asyncio.sleep(timeout_ms / 1000)
        return {}

    async def stop(self) -> None:
        self.stopped = True
        raise asyncio.CancelledError


async def test_tail_ends_with_its_count_when_the_readers_stop_lets_a_cancellation_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stop that raises a CancelledError nobody asked for does not end ``tail`` with a traceback."""
    reader = CancellingReader()

    async def count(_bootstrap: str, _topic: str) -> int:
        return 1

    async def started(_bootstrap: str, *, from_beginning: bool) -> CancellingReader:
        return reader

    monkeypatch.setattr(topic_io, "partition_count", count)
    monkeypatch.setattr(topic_io, "started_reader", started)
    out = io.BytesIO()
    assert await topic_io.tail("127.0.0.1:1", "t", from_beginning=True, follow=False, out=out, idle=0.1) == 0
    assert reader.stopped
