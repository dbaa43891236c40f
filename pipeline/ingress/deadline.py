"""The time limit on each request's wait for the broker's ack, for every request on one timer.

``asyncio.timeout`` arms a timer per wait (a timer handle, pushed onto and taken off the
loop's heap) and bookkeeps the task's cancellation: a measurable share of the ingress's
CPU at thousands of requests a second (``docs/benchmarks.md``, Ingress). Every wait here
has the same length, so waits expire in the order they began: :class:`Deadlines` keeps
them in a queue, and one timer, at most every :data:`TICK` seconds, cancels the tasks
whose wait is over and drops the finished ones. A wait therefore ends between its limit
and ``TICK`` after it, and a cancelled wait raises :class:`TimeoutError` in its task, as
``asyncio.timeout`` would; a cancellation from elsewhere (the server stopping) stays a
cancellation.
"""

from __future__ import annotations

import asyncio
from collections import deque
from types import TracebackType

TICK = 0.05  # seconds: how late a wait may end, and how often finished waits are dropped


class _Wait:
    """One task's limited wait: a context manager for the ``await`` it limits."""

    __slots__ = ("_cancelling", "expired", "task", "when")

    def __init__(self, task: asyncio.Task[object], when: float) -> None:
        self.task: asyncio.Task[object] | None = task
        self.when = when
        self.expired = False
        self._cancelling = task.cancelling()

    def __enter__(self) -> _Wait:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, _tb: TracebackType | None
    ) -> None:
        task, self.task = self.task, None  # finished: the timer skips it and lets the task go
        ours = self.expired and kind is asyncio.CancelledError
        if ours and task is not None and task.uncancel() <= self._cancelling:
            raise TimeoutError from error  # the limit, not someone else, cancelled the wait


class Deadlines:
    """Limits each wait begun with :meth:`wait` to ``seconds``, on one timer for all of them."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._waits: deque[_Wait] = deque()
        self._timer: asyncio.TimerHandle | None = None

    def wait(self) -> _Wait:
        """``with deadlines.wait(): await ...``: TimeoutError once the wait passes its limit."""
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("Deadlines.wait() must be used inside a task")
        loop = task.get_loop()
        wait = _Wait(task, loop.time() + self.seconds)
        self._waits.append(wait)
        if self._timer is None:
            self._timer = loop.call_at(min(wait.when, loop.time() + TICK), self._expire, loop)
        return wait

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        """Cancel the waits past their limit, drop the finished ones, and come back if any are left."""
        self._timer = None
        now = loop.time()
        waits = self._waits
        while waits:
            first = waits[0]
            if first.task is not None:
                if first.when > now:
                    break
                first.expired = True
                first.task.cancel()
            waits.popleft()
        if waits:
            self._timer = loop.call_at(min(waits[0].when, now + TICK), self._expire, loop)
