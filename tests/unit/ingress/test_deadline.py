"""Every produce wait of the ingress is limited to its time, on one timer (``pipeline.ingress.deadline``)."""

from __future__ import annotations

import asyncio
import time

import pytest

from pipeline.ingress.deadline import TICK, Deadlines


async def test_a_wait_that_ends_in_time_returns_its_value_and_is_never_cancelled() -> None:
    """Well within its limit, the wait gives its result, and the task runs on untouched after the limit."""
    deadlines = Deadlines(0.05)
    with deadlines.wait():
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05 + 2 * TICK)  # past the first wait's limit: nothing cancels this task


async def test_a_wait_past_its_limit_raises_timeout_error_between_the_limit_and_a_tick_after() -> None:
    """The wait ends with TimeoutError no sooner than its limit and at most one tick later."""
    deadlines = Deadlines(0.1)
    started = time.monotonic()
    with pytest.raises(TimeoutError), deadlines.wait():
        await asyncio.sleep(10)
    took = time.monotonic() - started
    assert 0.1 <= took < 0.1 + TICK + 0.1  # the last 0.1: a busy test machine's scheduling


async def test_the_task_goes_on_normally_after_its_wait_timed_out() -> None:
    """The cancellation that ended the wait is taken back: the next await is not cancelled."""
    deadlines = Deadlines(0.02)
    with pytest.raises(TimeoutError), deadlines.wait():
        await asyncio.sleep(10)
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0
    await asyncio.sleep(0.01)


async def test_only_the_waits_past_their_limit_end() -> None:
    """Of many waits begun at different times, each ends at its own limit, the others finish."""
    deadlines = Deadlines(0.5)  # margins of 0.4 s: a loaded machine's loop lags, not the rule

    async def one(delay: float, duration: float) -> str:
        await asyncio.sleep(delay)
        try:
            with deadlines.wait():
                await asyncio.sleep(duration)
        except TimeoutError:
            return "timeout"
        return "done"

    results = await asyncio.gather(one(0, 0.05), one(0, 3), one(0.2, 0.1), one(0.2, 3), one(0.6, 0.01))
    # gather's result is a list; typeshed calls it a tuple of five
    assert list(results) == ["done", "timeout", "done", "timeout", "done"]


async def test_a_cancellation_from_elsewhere_stays_a_cancellation() -> None:
    """A task cancelled by someone else (the server stopping) sees CancelledError, not TimeoutError."""
    deadlines = Deadlines(5)
    entered = asyncio.Event()

    async def waiting() -> None:
        with deadlines.wait():
            entered.set()
            await asyncio.sleep(10)

    task = asyncio.create_task(waiting())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_waiting_outside_a_task_is_refused() -> None:
    """The limit cancels a task, so a wait needs one."""
    deadlines = Deadlines(1)
    loop = asyncio.get_running_loop()
    outside: list[BaseException] = []

    def call() -> None:
        try:
            deadlines.wait()
        except RuntimeError as exc:
            outside.append(exc)

    loop.call_soon(call)
    await asyncio.sleep(0.01)
    assert outside
    assert "inside a task" in str(outside[0])
