"""Fixtures of the worker's unit tests."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .effect_world import Make, build_world
from .fakes import Harness

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
