"""A deterministic event loop with virtual time, and the processes that run on it.

Every callback the loop runs belongs to a :class:`Process` (a worker incarnation,
found through the context it was scheduled in) or to the world itself (the
broker model, the harness). Callbacks run in the order they were scheduled; time
moves by a few microseconds per callback and, when nothing is ready, straight to
the next timer, so a run costs the work done, not the time simulated. Given the same seed, the same callbacks
run in the same order every time.

A process can be:

- *crashed*: its callbacks are dropped from then on and it never runs again,
  as a process killed with SIGKILL (its memory is gone; what it wrote to disk
  stays);
- *paused*: its callbacks are held and run once it is resumed, as a process
  stopped with SIGSTOP and continued.

While a run is on, ``time.monotonic`` and ``time.time`` read the virtual clock
(:func:`virtual_time`), so the worker's and aiokafka's own timing follow it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import heapq
import itertools
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine, Generator, Iterator
from concurrent.futures import Executor
from enum import Enum
from typing import Any, TypeVar, TypeVarTuple

#: The process the running code belongs to (None: the world).
CURRENT: contextvars.ContextVar[Process | None] = contextvars.ContextVar("sim_process", default=None)

_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")

WATCHDOG_S = 5.0  # real seconds one callback may run
STEP_COST_S = 0.000005  # the virtual time one callback takes
EPOCH_S = 1_767_225_600.0  # 2026-01-01T00:00:00Z: what the virtual wall clock reads at virtual time 0


class LivelockError(BaseException):
    """The run went past its bound of virtual time or of callbacks, or one callback never returned.

    A BaseException, so that no ``except Exception`` in the code under test swallows it.
    """


class ProcessState(Enum):
    RUNNING = "running"
    PAUSED = "paused"
    DEAD = "dead"


class Process:
    """One process's worth of callbacks: crash or pause them all at once."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.state = ProcessState.RUNNING
        self.held: deque[asyncio.Handle] = deque()
        self.steps = 0  # callbacks run so far
        self.on_crash: list[Callable[[], None]] = []  # what the OS releases when it dies (locks)
        self.context = contextvars.copy_context()
        self.context.run(CURRENT.set, self)

    @property
    def alive(self) -> bool:
        return self.state is not ProcessState.DEAD

    def __repr__(self) -> str:
        return f"<Process {self.name} {self.state.value}>"


class SimLoop(asyncio.AbstractEventLoop):
    """The deterministic loop (see the module docstring)."""

    def __init__(self, *, max_time: float, max_steps: int) -> None:
        self._now = 0.0
        self._ready: deque[tuple[asyncio.Handle, Process | None]] = deque()
        self._timers: list[tuple[float, int, asyncio.TimerHandle, Process | None]] = []
        self._seq = itertools.count()
        self._running = False
        self._stopping = False
        self._closed = False
        self.max_time = max_time
        self.max_steps = max_steps
        self.steps = 0
        self.errors: list[dict[str, Any]] = []  # what reached the exception handler
        self.tasks: list[asyncio.Task[Any]] = []  # kept alive until the run is over (see close)
        self.owners: dict[asyncio.Task[Any], Process | None] = {}
        self.before_step: Callable[[Process], None] | None = None
        self.stuck = False
        self._watched = -1
        self.recent: deque[tuple[asyncio.Handle, Process | None]] = deque(
            maxlen=300
        )  # for a livelock's report

    # -- time ----------------------------------------------------------------------
    def time(self) -> float:
        return self._now

    def wall(self) -> float:
        """The virtual wall clock (seconds since 1970)."""
        return EPOCH_S + self._now

    # -- scheduling ---------------------------------------------------------------
    def call_soon(
        self,
        callback: Callable[[*_Ts], object],
        *args: *_Ts,
        context: contextvars.Context | None = None,
    ) -> asyncio.Handle:
        ctx = context if context is not None else contextvars.copy_context()
        handle = asyncio.Handle(callback, args, self, ctx)
        self._ready.append((handle, ctx.get(CURRENT)))
        return handle

    def call_soon_threadsafe(
        self,
        callback: Callable[[*_Ts], object],
        *args: *_Ts,
        context: contextvars.Context | None = None,
    ) -> asyncio.Handle:
        return self.call_soon(callback, *args, context=context)

    def call_later(
        self,
        delay: float,
        callback: Callable[[*_Ts], object],
        *args: *_Ts,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        return self.call_at(self._now + max(delay, 0.0), callback, *args, context=context)

    def call_at(
        self,
        when: float,
        callback: Callable[[*_Ts], object],
        *args: *_Ts,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        ctx = context if context is not None else contextvars.copy_context()
        handle = asyncio.TimerHandle(when, callback, args, self, ctx)
        heapq.heappush(self._timers, (when, next(self._seq), handle, ctx.get(CURRENT)))
        return handle

    def _timer_handle_cancelled(self, handle: asyncio.TimerHandle) -> None:
        pass  # cancelled timers are skipped when they come up

    def create_future(self) -> asyncio.Future[Any]:
        return asyncio.Future(loop=self)

    def create_task(
        self,
        coro: Generator[Any, None, _T] | Coroutine[Any, Any, _T],  # typeshed's _CoroutineLike before 3.12
        *,
        name: str | None = None,
        context: contextvars.Context | None = None,
    ) -> asyncio.Task[_T]:
        task = asyncio.Task(coro, loop=self, name=name, context=context)
        self.tasks.append(task)
        self.owners[task] = (context if context is not None else contextvars.copy_context()).get(CURRENT)
        return task

    def stacks(self, process: Process) -> list[str]:
        """Where each unfinished task of ``process`` waits (for a report)."""
        return [
            f"{task.get_name()}: {_awaiting(task.get_coro())}"
            for task in self.tasks
            if self.owners.get(task) is process and not task.done()
        ]

    def spawn(self, process: Process | None, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Start ``coro`` as a task of ``process`` (None: of the world)."""
        context = process.context.copy() if process is not None else contextvars.Context()
        return self.create_task(coro, name=name, context=context)

    # -- processes ---------------------------------------------------------------
    def crash(self, process: Process) -> None:
        """Kill ``process``: none of its callbacks runs again; what it held is released."""
        if not process.alive:
            return
        process.state = ProcessState.DEAD
        process.held.clear()
        for release in process.on_crash:
            release()
        process.on_crash.clear()

    def pause(self, process: Process) -> None:
        if process.state is ProcessState.RUNNING:
            process.state = ProcessState.PAUSED

    def resume(self, process: Process) -> None:
        if process.state is ProcessState.PAUSED:
            process.state = ProcessState.RUNNING
            while process.held:
                self._ready.append((process.held.popleft(), process))

    # -- running -----------------------------------------------------------------
    def _run_once(self) -> None:
        if not self._ready:
            self._advance()
        for _ in range(len(self._ready)):
            if not self._ready or self._stopping:
                break
            handle, owner = self._ready.popleft()
            if handle.cancelled():
                continue
            if owner is not None:
                if owner.state is ProcessState.DEAD:
                    continue
                if owner.state is ProcessState.PAUSED:
                    owner.held.append(handle)
                    continue
                owner.steps += 1
                if self.before_step is not None:
                    self.before_step(owner)
                    if not owner.alive:
                        continue
            self.steps += 1
            self.recent.append((handle, owner))
            if self.steps > self.max_steps:
                raise LivelockError(
                    f"more than {self.max_steps} callbacks at t={self._now:.3f}s: {self.hot()}"
                )
            handle._run()  # as asyncio's own loops run a handle
            if self.stuck:
                who = owner.name if owner else "the world"
                raise LivelockError(f"a callback of {who} never yielded: {self.hot()}")
            self._now += STEP_COST_S  # running code takes time: a loop polling the clock sees it move

    def hot(self) -> str:
        """The callbacks that ran most among the last few hundred (what a livelock spins on)."""
        import collections  # noqa: PLC0415

        counts = collections.Counter(
            f"{owner.name if owner else 'world'}:{str(handle)[:160]}" for handle, owner in self.recent
        )
        text = "; ".join(f"{n}x {what}" for what, n in counts.most_common(4))
        for handle, _owner in reversed(self.recent):
            task = getattr(getattr(handle, "_callback", None), "__self__", None)
            if isinstance(task, asyncio.Task):
                frames = task.get_stack(limit=8)
                text += " | spinning task: " + " <- ".join(
                    f"{f.f_code.co_name}@{f.f_code.co_filename.rsplit('/', 1)[-1]}:{f.f_lineno}"
                    for f in frames
                )
                break
        return text

    def _advance(self) -> None:
        """Move time to the next live timer and make every timer due by then ready."""
        while self._timers:
            when, _, handle, owner = self._timers[0]
            if handle.cancelled() or (owner is not None and not owner.alive):
                heapq.heappop(self._timers)
                continue
            break
        else:
            return
        when = self._timers[0][0]
        if when > self.max_time:
            raise LivelockError(f"virtual time passed its bound of {self.max_time:.0f}s")
        self._now = max(self._now, when)
        while self._timers and self._timers[0][0] <= self._now:
            _, _, handle, owner = heapq.heappop(self._timers)
            if not handle.cancelled():
                self._ready.append((handle, owner))

    def _watchdog(self, _signum: int, _frame: Any) -> None:
        """SIGALRM every few real seconds: a callback that has run all that time never yields."""
        if self.steps == self._watched:
            self.stuck = True
            raise LivelockError(f"one callback has run for {WATCHDOG_S:.0f}s of real time without yielding")
        self._watched = self.steps

    def run_forever(self) -> None:
        self._check_not_running()
        self._running = True
        asyncio.events._set_running_loop(self)  # what asyncio's own run_forever does
        watching = threading.current_thread() is threading.main_thread()
        saved: Any = None
        if watching:
            self._watched = -1
            saved = signal.signal(signal.SIGALRM, self._watchdog)
            signal.setitimer(signal.ITIMER_REAL, WATCHDOG_S, WATCHDOG_S)
        try:
            while not self._stopping:
                if not self._ready and not self._timers:
                    raise LivelockError("nothing left to run: every task waits forever")
                self._run_once()
        finally:
            if watching:
                signal.setitimer(signal.ITIMER_REAL, 0, 0)
                signal.signal(signal.SIGALRM, saved)
            self._stopping = False
            self._running = False
            asyncio.events._set_running_loop(None)

    def run_until_complete(self, future: Any) -> Any:
        self._check_not_running()
        task = asyncio.ensure_future(future, loop=self)
        task.add_done_callback(lambda _: self.stop())
        self.run_forever()
        if not task.done():
            raise RuntimeError("the loop stopped before the future completed")
        return task.result()

    def _check_not_running(self) -> None:
        if self._running:
            raise RuntimeError("the loop is already running")

    def stop(self) -> None:
        self._stopping = True

    def is_running(self) -> bool:
        return self._running

    def is_closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True
        self._ready.clear()
        self._timers.clear()
        self.owners.clear()

    async def shutdown_asyncgens(self) -> None:
        return None

    async def shutdown_default_executor(self, timeout: float | None = None) -> None:
        return None

    def get_debug(self) -> bool:
        return False

    def set_debug(self, enabled: bool) -> None:
        return None

    # -- errors ------------------------------------------------------------------
    def call_exception_handler(self, context: dict[str, Any]) -> None:
        self.errors.append(context)

    def default_exception_handler(self, context: dict[str, Any]) -> None:
        self.errors.append(context)

    def get_exception_handler(self) -> Any:
        return None

    def set_exception_handler(self, handler: Any) -> None:
        return None

    def run_in_executor(
        self, executor: Executor | None, func: Callable[[*_Ts], _T], *args: *_Ts
    ) -> asyncio.Future[_T]:
        future: asyncio.Future[_T] = self.create_future()  # no threads: the call runs now, in order
        try:
            future.set_result(func(*args))
        except Exception as exc:
            future.set_exception(exc)
        return future


def _awaiting(coro: Any) -> str:
    """Where a suspended coroutine waits: each frame down its chain of awaits."""
    steps: list[str] = []
    while coro is not None and len(steps) < 20:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            break
        steps.append(f"{frame.f_code.co_name}@{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return " > ".join(steps)


@contextlib.contextmanager
def virtual_time(loop: SimLoop) -> Iterator[None]:
    """Make ``time.monotonic`` and ``time.time`` read ``loop``'s clock for the duration."""
    saved = time.monotonic, time.time, time.time_ns, time.monotonic_ns
    time.monotonic = loop.time
    time.time = loop.wall
    time.time_ns = lambda: int(loop.wall() * 1e9)
    time.monotonic_ns = lambda: int(loop.time() * 1e9)
    try:
        yield
    finally:
        time.monotonic, time.time, time.time_ns, time.monotonic_ns = saved
