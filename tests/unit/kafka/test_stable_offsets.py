"""committed_stable: asked again while a pending transaction holds a partition's offsets, with a deadline."""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable, Coroutine
from io import BytesIO
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import GroupAuthorizationFailedError, KafkaConnectionError

from pipeline.errors import BrokerUnavailableError, UnstableOffsetsError
from pipeline.kafka.requests import UNSTABLE_OFFSET_COMMIT, OffsetFetchResponseV7
from pipeline.kafka.stable_offsets import MAX_BACKOFF_S, committed_stable

A0, A1 = TopicPartition("a", 0), TopicPartition("a", 1)
Answer = Callable[[Any], Any]
T = TypeVar("T")
HANG = object()  # an answer the coordinator never gives: the request waits forever
RUNAWAY = 1_000  # requests after which committed_stable is taken for one that never stops asking


class _VirtualSelector(selectors.DefaultSelector):
    """A selector that never blocks: a wait for the next timer moves the loop's virtual clock there instead."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events = super().select(0)
        if not events:
            if timeout is None:
                raise RuntimeError("nothing scheduled and nothing to wait for: the coroutine would hang")
            self.now += timeout
        return events


class _VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose time moves only when it waits for a timer: sleeps and deadlines take no real time."""

    def __init__(self) -> None:
        self._virtual = _VirtualSelector()
        super().__init__(self._virtual)

    def time(self) -> float:
        return self._virtual.now


def _in_virtual_time(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` to its end under :class:`_VirtualTimeLoop` (its clock starts at 0.0)."""
    with asyncio.Runner(loop_factory=_VirtualTimeLoop) as runner:
        return runner.run(coroutine)


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
        self.times: list[float] = []  # the loop's time at each request
        self.deaths = 0
        self.group_id, self.generation, self.member_id, self._group_instance_id = "g", 1, "m", None

    async def ensure_coordinator_known(self) -> None:
        return None

    async def _send_req(self, request: Any) -> Any:
        if len(self.asked) >= RUNAWAY:
            raise AssertionError(f"asked {RUNAWAY} times: the waits no longer move towards the deadline")
        self.asked.append(request.prepare({9: (1, 9)}))
        self.times.append(asyncio.get_running_loop().time())
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if answer is HANG:
            await asyncio.get_running_loop().create_future()
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


def _held(times: int, then: Any) -> Coordinator:
    """A coordinator answering UNSTABLE_OFFSET_COMMIT for A0 ``times`` times, then ``then``."""
    return Coordinator(*[_answer({A0: (-1, UNSTABLE_OFFSET_COMMIT)})] * times, then)


def _waits(coordinator: Coordinator) -> list[float]:
    """The time between each request and the next."""
    return [later - earlier for earlier, later in zip(coordinator.times, coordinator.times[1:], strict=False)]


def test_the_first_wait_is_10_ms_by_default() -> None:
    """Without a ``backoff_s``, a held partition is asked for again 0.01 s after the first answer."""
    coordinator = _held(1, _answer({A0: (7, 0)}))
    assert _in_virtual_time(committed_stable(_consumer(coordinator), [A0])) == {A0: 7}
    assert _waits(coordinator) == [pytest.approx(0.01)]


def test_the_waits_double_up_to_half_a_second() -> None:
    """The waits between requests go 0.01, 0.02, 0.04, ... doubling until MAX_BACKOFF_S (0.5 s), then stay there."""
    coordinator = _held(9, _answer({A0: (7, 0)}))
    assert _in_virtual_time(committed_stable(_consumer(coordinator), [A0], backoff_s=0.01)) == {A0: 7}
    assert MAX_BACKOFF_S == 0.5
    assert _waits(coordinator) == pytest.approx([0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.5, 0.5, 0.5])


def test_a_wait_that_would_end_at_the_deadline_is_not_started() -> None:
    """0.125 s in, a wait of 0.25 s would end exactly at the 0.375 s deadline: the error comes at once, 0.125 s in."""

    async def held_until_the_deadline() -> float:
        with pytest.raises(UnstableOffsetsError):
            await committed_stable(_consumer(coordinator), [A0], timeout_s=0.375, backoff_s=0.125)
        return asyncio.get_running_loop().time()

    coordinator = Coordinator(_answer({A0: (-1, UNSTABLE_OFFSET_COMMIT)}))
    assert _in_virtual_time(held_until_the_deadline()) == 0.125
    assert coordinator.times == [0.0, 0.125]


def test_a_wait_that_ends_before_the_deadline_is_started() -> None:
    """With a 0.5 s deadline the same 0.25 s wait ends before it: a third request at 0.375 s, then the error."""

    async def held_until_the_deadline() -> float:
        with pytest.raises(UnstableOffsetsError):
            await committed_stable(_consumer(coordinator), [A0], timeout_s=0.5, backoff_s=0.125)
        return asyncio.get_running_loop().time()

    coordinator = Coordinator(_answer({A0: (-1, UNSTABLE_OFFSET_COMMIT)}))
    assert _in_virtual_time(held_until_the_deadline()) == 0.375
    assert coordinator.times == [0.0, 0.125, 0.375]


def test_a_coordinator_request_that_hangs_is_cut_at_the_deadline() -> None:
    """A request the coordinator never answers ends at the deadline with BrokerUnavailableError naming the timeout."""

    async def hung() -> tuple[str, float]:
        with pytest.raises(BrokerUnavailableError) as raised:
            await committed_stable(_consumer(Coordinator(HANG)), [A0], timeout_s=2.0)
        return str(raised.value), asyncio.get_running_loop().time()

    message, when = _in_virtual_time(hung())
    assert when == 2.0
    assert message == "group g: its coordinator gave no committed offsets within 2 s (TimeoutError())"


def test_a_retriable_error_lasting_past_the_deadline_is_broker_unavailable_naming_it() -> None:
    """A retriable KafkaError on every request until the deadline: BrokerUnavailableError carrying that error."""

    async def down() -> str:
        with pytest.raises(BrokerUnavailableError) as raised:
            await committed_stable(
                _consumer(Coordinator(KafkaConnectionError("down"))), [A0], timeout_s=0.375, backoff_s=0.125
            )
        return str(raised.value)

    assert _in_virtual_time(down()) == (
        "group g: its coordinator gave no committed offsets within 0.375 s (KafkaConnectionError('down'))"
    )


def test_the_partitions_still_held_are_all_named() -> None:
    """Two partitions held past the deadline: the message names both, in order, joined by a comma."""

    async def held() -> str:
        with pytest.raises(UnstableOffsetsError) as raised:
            await committed_stable(_consumer(coordinator), [A1, A0], timeout_s=0.375, backoff_s=0.125)
        return str(raised.value)

    coordinator = Coordinator(_answer({A0: (-1, UNSTABLE_OFFSET_COMMIT), A1: (-1, UNSTABLE_OFFSET_COMMIT)}))
    assert _in_virtual_time(held()) == (
        "group g: the committed offsets of a-0, a-1 were still held by a pending transaction after 0.375 s"
    )
