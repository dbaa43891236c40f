"""committed_stable: asked again while a pending transaction holds a partition's offsets, with a deadline."""

from __future__ import annotations

from collections.abc import Callable
from io import BytesIO
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import GroupAuthorizationFailedError, KafkaConnectionError

from pipeline.errors import BrokerUnavailableError, UnstableOffsetsError
from pipeline.kafka.requests import UNSTABLE_OFFSET_COMMIT, OffsetFetchResponseV7
from pipeline.kafka.stable_offsets import committed_stable

A0, A1 = TopicPartition("a", 0), TopicPartition("a", 1)
Answer = Callable[[Any], Any]


def _answer(rows: dict[TopicPartition, tuple[int, int]], error: int = 0) -> OffsetFetchResponseV7:
    """An OffsetFetch v7 answer: each partition's (offset, error code)."""
    topics: dict[str, list[Any]] = {}
    for tp, (offset, code) in rows.items():
        topics.setdefault(tp.topic, []).append((tp.partition, offset, -1, "", code, {}))
    response = OffsetFetchResponseV7(0, [(t, p, {}) for t, p in topics.items()], error, {})
    decoded: OffsetFetchResponseV7 = OffsetFetchResponseV7.decode(BytesIO(response.encode()))
    return decoded


class Coordinator:
    """A group coordinator answering each OffsetFetch with the next of ``answers`` (the last one repeats)."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.asked: list[Any] = []
        self.deaths = 0
        self.group_id, self.generation, self.member_id, self._group_instance_id = "g", 1, "m", None

    async def ensure_coordinator_known(self) -> None:
        return None

    async def _send_req(self, request: Any) -> Any:
        self.asked.append(request.prepare({9: (1, 9)}))
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def coordinator_dead(self) -> None:
        self.deaths += 1


def _consumer(coordinator: Coordinator) -> Any:
    return SimpleNamespace(_coordinator=coordinator)


async def test_a_partition_held_by_a_pending_transaction_is_asked_again_until_it_is_stable() -> None:
    """UNSTABLE_OFFSET_COMMIT twice, then the offset: only the held partition is asked again, with require_stable."""
    coordinator = Coordinator(
        _answer({A0: (-1, UNSTABLE_OFFSET_COMMIT), A1: (4, 0)}),
        _answer({A0: (-1, UNSTABLE_OFFSET_COMMIT)}),
        _answer({A0: (12, 0)}),
    )
    assert await committed_stable(_consumer(coordinator), [A1, A0, A0], backoff_s=0.001) == {A0: 12, A1: 4}
    assert [request.topics for request in coordinator.asked] == [
        [("a", [0, 1], {})],
        [("a", [0], {})],
        [("a", [0], {})],
    ]
    assert all(request.require_stable for request in coordinator.asked)


async def test_nothing_committed_is_none() -> None:
    """A partition the group never committed comes back as None."""
    assert await committed_stable(_consumer(Coordinator(_answer({A0: (-1, 0)}))), [A0]) == {A0: None}


async def test_a_partition_still_held_at_the_deadline_is_a_clear_error() -> None:
    """Held past the deadline: UnstableOffsetsError naming the partition."""
    coordinator = Coordinator(_answer({A0: (-1, UNSTABLE_OFFSET_COMMIT)}))
    with pytest.raises(UnstableOffsetsError, match=r"a-0 were still held by a pending transaction"):
        await committed_stable(_consumer(coordinator), [A0], timeout_s=0.1, backoff_s=0.01)
    assert len(coordinator.asked) > 2


async def test_a_coordinator_elsewhere_is_found_again() -> None:
    """NOT_COORDINATOR: the consumer's coordinator is marked dead (found again) and the partitions asked again."""
    coordinator = Coordinator(_answer({}, error=16), _answer({A0: (3, 0)}))
    assert await committed_stable(_consumer(coordinator), [A0], backoff_s=0.001) == {A0: 3}
    assert coordinator.deaths == 1


async def test_a_coordinator_that_never_answers_is_broker_unavailable() -> None:
    """Connection failures until the deadline: BrokerUnavailableError, not a claim about transactions."""
    coordinator = Coordinator(KafkaConnectionError("down"))
    with pytest.raises(BrokerUnavailableError, match="gave no committed offsets"):
        await committed_stable(_consumer(coordinator), [A0], timeout_s=0.05, backoff_s=0.01)


async def test_a_refusal_is_raised_at_once() -> None:
    """GROUP_AUTHORIZATION_FAILED is not asked again."""
    coordinator = Coordinator(_answer({}, error=GroupAuthorizationFailedError.errno))
    with pytest.raises(GroupAuthorizationFailedError):
        await committed_stable(_consumer(coordinator), [A0])
    assert len(coordinator.asked) == 1
