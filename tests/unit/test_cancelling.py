"""Stopping a background task that loses its first cancellation, as Python 3.11's ``wait_for`` can."""

from __future__ import annotations

import asyncio
import sys

import pytest

from pipeline.cancelling import cancel_and_wait
from pipeline.console.redrive import Follower

AGAIN = 0.01


async def _lost_cancel_then_loops(ready: asyncio.Future[int], went_on: list[str]) -> None:
    """A loop whose first step is a ``wait_for`` whose result comes in with the cancellation."""
    await asyncio.wait_for(ready, 10)
    while True:  # the cancellation was lost: it goes on as if never asked to stop
        went_on.append("round")
        await asyncio.sleep(3600)


async def _racing() -> tuple[asyncio.Task[None], list[str]]:
    """The loop above, in its ``wait_for``, whose result has just come in: cancel it now and the cancel is lost."""
    ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    went_on: list[str] = []
    task = asyncio.create_task(_lost_cancel_then_loops(ready, went_on))
    await asyncio.sleep(0)
    ready.set_result(1)
    return task, went_on


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="Python 3.12's wait_for keeps the cancellation")
async def test_wait_for_loses_a_cancellation_that_comes_with_its_result() -> None:
    """The race itself (Python 3.11): cancelled once, the loop goes on; a stop that cancels once waits forever."""
    task, went_on = await _racing()
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=0.1)
    assert not done
    assert went_on == ["round"]
    await cancel_and_wait(task, again_after=AGAIN)


async def test_a_task_that_lost_its_cancellation_is_cancelled_again_and_ends() -> None:
    """``cancel_and_wait`` cancels again until the task has ended, and raises no cancellation of the task's."""
    task, went_on = await _racing()
    stopping = asyncio.create_task(cancel_and_wait(task, again_after=AGAIN))
    done, _ = await asyncio.wait({stopping}, timeout=5)
    assert done, "the stop still waits"
    assert task.cancelled()
    assert went_on == ["round"]


async def test_an_error_the_task_ends_with_is_raised_to_the_stop() -> None:
    """A task that fails as it is cancelled raises its error from the stop, as ``await task`` would."""

    async def fails_on_cancel() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            raise ValueError("while stopping") from None

    task = asyncio.create_task(fails_on_cancel())
    await asyncio.sleep(0)
    with pytest.raises(ValueError, match="while stopping"):
        await cancel_and_wait(task, again_after=AGAIN)


async def test_a_task_already_done_is_left_as_it_ended() -> None:
    """A finished task is not cancelled; its result is dropped and nothing is raised."""

    async def done() -> int:
        return 7

    task = asyncio.create_task(done())
    await task
    await cancel_and_wait(task, again_after=AGAIN)
    assert task.result() == 7


class _RacingHistory:
    """A redrive history whose every refresh ends in ``wait_for``, as an admin client's start does."""

    def __init__(self) -> None:
        self.refreshes = 0
        self.pending: asyncio.Future[None] | None = None

    async def refresh(self) -> None:
        self.refreshes += 1
        self.pending = asyncio.get_running_loop().create_future()
        await asyncio.wait_for(self.pending, 10)

    def newest_first(self) -> list[object]:
        return []


class _Redrives:
    def __init__(self) -> None:
        self.history = _RacingHistory()


async def test_the_consoles_redrive_follower_stops_though_its_cancellation_is_lost() -> None:
    """The follower's stop ends (a second later) even when its cancellation meets a refresh that just finished."""
    redrives = _Redrives()
    follower = Follower(redrives, every=3600)  # type: ignore[arg-type]
    follower.start()
    await asyncio.sleep(0)
    pending = redrives.history.pending
    assert pending is not None
    pending.set_result(None)  # the refresh's answer comes in with the stop
    stopping = asyncio.create_task(follower.stop())
    done, _ = await asyncio.wait({stopping}, timeout=5)
    assert done, "the follower's stop still waits"
    assert redrives.history.refreshes == 1
