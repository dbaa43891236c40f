"""Which asyncio event loop the ingress runs on: uvloop when it is installed, else asyncio's own.

The ingress spends most of its CPU in the event loop and aiohttp's request handling, one
request at a time; uvloop (libuv, in C) does the loop's part for less
(``docs/benchmarks.md``, Ingress). The worker handles records in batches and measured no
gain, so it stays on asyncio's loop.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable

from pipeline.errors import ConfigError

#: ``auto``: uvloop when it can be imported, else asyncio's; ``uvloop``: uvloop or a
#: ConfigError at start; ``asyncio``: asyncio's own loop.
EVENT_LOOPS = ("auto", "uvloop", "asyncio")

LoopFactory = Callable[[], asyncio.AbstractEventLoop]


def choice_problem(choice: str) -> str | None:
    """What is wrong with ``choice`` as an event loop name, or None."""
    if choice in EVENT_LOOPS:
        return None
    return f"event loop must be one of {', '.join(EVENT_LOOPS)}, got {choice!r}"


def loop_factory(choice: str) -> LoopFactory | None:
    """The loop factory for ``choice`` (None: asyncio's default); ConfigError when it cannot be had."""
    problem = choice_problem(choice)
    if problem is not None:
        raise ConfigError(problem)
    if choice == "asyncio":
        return None
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        if choice == "uvloop":
            raise ConfigError(
                "event loop 'uvloop' is not installed: install uvloop, or use --event-loop asyncio"
            ) from None
        return None
    factory: LoopFactory = uvloop.new_event_loop
    return factory


def running_loop_name() -> str:
    """``uvloop`` or ``asyncio``: the loop this coroutine runs on (for the start line)."""
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.split(".", 1)[0] == "uvloop" else "asyncio"
