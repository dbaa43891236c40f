"""ConsumerGroup: each answer about the group is asked through the group consumer it was made with."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
from aiokafka import TopicPartition

from pipeline.kafka import group, internals
from pipeline.kafka.group import ConsumerGroup
from pipeline.kafka.requests import GroupMetadata

A0, A1 = TopicPartition("a", 0), TopicPartition("a", 1)


class FakeConsumer:
    """A group consumer nothing is asked of directly: the doors of internals are faked instead."""


@pytest.mark.parametrize("current", [True, False, None])
async def test_member_asks_the_coordinator_through_the_groups_consumer(
    monkeypatch: pytest.MonkeyPatch, current: bool | None
) -> None:
    """``member`` hands its consumer to ``internals.generation_current`` and gives its answer as it is."""
    consumer: Any = FakeConsumer()
    asked: list[Any] = []

    async def generation_current(asked_with: Any) -> bool | None:
        asked.append(asked_with)
        return current

    monkeypatch.setattr(internals, "generation_current", generation_current)
    assert await ConsumerGroup(consumer).member() is current
    assert asked == [consumer]


def test_rejoin_makes_the_groups_consumer_rejoin(monkeypatch: pytest.MonkeyPatch) -> None:
    """``rejoin`` hands its consumer to ``internals.request_rejoin``, once."""
    consumer: Any = FakeConsumer()
    rejoined: list[Any] = []
    monkeypatch.setattr(internals, "request_rejoin", rejoined.append)
    ConsumerGroup(consumer).rejoin()
    assert rejoined == [consumer]


def test_metadata_is_what_the_groups_consumer_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    """``metadata`` hands its consumer to ``internals.group_metadata`` and gives its answer."""
    consumer: Any = FakeConsumer()
    held = GroupMetadata("g", 3, "m-1", None)
    asked: list[Any] = []

    def group_metadata(asked_with: Any) -> GroupMetadata:
        asked.append(asked_with)
        return held

    monkeypatch.setattr(internals, "group_metadata", group_metadata)
    assert ConsumerGroup(consumer).metadata() is held
    assert asked == [consumer]


async def test_committed_reads_the_stable_offsets_through_the_groups_consumer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``committed`` hands its consumer and the partitions to ``committed_stable`` and gives its answer."""
    consumer: Any = FakeConsumer()
    answer: dict[TopicPartition, int | None] = {A0: 5, A1: None}
    asked: list[tuple[Any, list[TopicPartition]]] = []

    async def committed_stable(
        asked_with: Any, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, int | None]:
        asked.append((asked_with, list(partitions)))
        return answer

    monkeypatch.setattr(group, "committed_stable", committed_stable)
    assert await ConsumerGroup(consumer).committed([A0, A1]) is answer
    assert asked == [(consumer, [A0, A1])]
