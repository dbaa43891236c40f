"""How long a step of opening is retried: the backoff, the partition's deadline, the wait for a store's lock.

The retries run on a clock of the test's (``opening``'s ``time.monotonic`` and ``asyncio.sleep``), so each
attempt's time is exact: the first at 0, then after 0.5, 1, 2, 4, 8, 10, 10... seconds.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from aiokafka.errors import KafkaConnectionError

from pipeline.errors import StoreIdentityError, StoreLockedError
from pipeline.worker import opening


class Clock:
    """Monotonic seconds that move only when the retry sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """``opening``'s clock, in the test's hands."""
    made = Clock()
    monkeypatch.setattr(opening, "time", SimpleNamespace(monotonic=made.monotonic))
    monkeypatch.setattr(opening, "asyncio", SimpleNamespace(sleep=made.sleep))
    return made


class Step:
    """A step that raises each of ``errors`` in turn, then passes; it notes when each attempt ran."""

    def __init__(self, clock: Clock, *errors: BaseException) -> None:
        self.clock = clock
        self.errors = list(errors)
        self.attempts: list[float] = []

    async def __call__(self) -> None:
        self.attempts.append(self.clock.now)
        if self.errors:
            raise self.errors.pop(0)


def _broker_away() -> KafkaConnectionError:
    return KafkaConnectionError("broker away")


async def test_a_step_that_passes_runs_once_and_never_waits(clock: Clock) -> None:
    """No failure: one attempt, no backoff."""
    step = Step(clock)
    await opening.retry(step, 100.0, "p0: step", 30.0)
    assert (step.attempts, clock.sleeps) == ([0.0], [])


async def test_the_backoff_doubles_from_half_a_second_up_to_ten(clock: Clock) -> None:
    """A retriable failure is retried after 0.5 s, then twice as long each time, never more than 10 s apart."""
    step = Step(clock, *(_broker_away() for _ in range(7)))
    await opening.retry(step, 1_000.0, "p0: step", 30.0)
    assert clock.sleeps == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert step.attempts == [0.0, 0.5, 1.5, 3.5, 7.5, 15.5, 25.5, 35.5]


async def test_a_failure_not_worth_retrying_is_raised_at_once(clock: Clock) -> None:
    """A pipeline error that says it is final (a store of another partition) is not retried."""
    step = Step(clock, StoreIdentityError("another partition's store"))
    with pytest.raises(StoreIdentityError):
        await opening.retry(step, 1_000.0, "p0: step", 30.0)
    assert step.attempts == [0.0]


async def test_retries_stop_at_the_last_attempt_the_deadline_leaves_room_for(clock: Clock) -> None:
    """An attempt is retried only when the next one starts by the deadline (one landing on it exactly still runs)."""
    step = Step(clock, *(_broker_away() for _ in range(9)))
    with pytest.raises(KafkaConnectionError):
        await opening.retry(step, 3.5, "p0: step", 30.0)
    assert step.attempts == [0.0, 0.5, 1.5, 3.5]
    exact = Step(clock, _broker_away(), _broker_away())
    clock.now = 0.0
    with pytest.raises(KafkaConnectionError):
        await opening.retry(exact, 0.5, "p0: step", 30.0)
    assert exact.attempts == [0.0, 0.5]


async def test_a_store_locked_by_another_process_is_waited_for_lock_wait_only(clock: Clock) -> None:
    """A lock held elsewhere is retried while the next attempt falls within lock_wait of the first refusal, even
    far from the partition's deadline; then the lock error is raised."""
    step = Step(clock, *(StoreLockedError("held by pid 7") for _ in range(9)))
    with pytest.raises(StoreLockedError):
        await opening.retry(step, 1_000.0, "p0: store", 3.5)
    assert step.attempts == [0.0, 0.5, 1.5, 3.5]
    exact = Step(clock, StoreLockedError("held"), StoreLockedError("held"))
    clock.now = 10.0
    with pytest.raises(StoreLockedError):
        await opening.retry(exact, 1_000.0, "p0: store", 0.5)
    assert exact.attempts == [10.0, 10.5]


async def test_the_lock_wait_counts_from_the_first_refusal_not_from_the_start(clock: Clock) -> None:
    """The broker away first, then the store locked: the lock is waited for lock_wait from when it was first met."""
    step = Step(clock, _broker_away(), _broker_away(), *(StoreLockedError("held") for _ in range(9)))
    with pytest.raises(StoreLockedError):
        await opening.retry(step, 1_000.0, "p0: store", 2.5)
    assert step.attempts == [0.0, 0.5, 1.5, 3.5]  # locked first at 1.5: 3.5 is within 2.5 s, 7.5 is not
