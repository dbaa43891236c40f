"""Running ``pipeline up`` in the foreground: signals and a forced exit.

The first Ctrl-C or SIGTERM stops everything cleanly (while still starting, it
abandons the start and stops what already runs, the broker included); a second
one exits at once, leaving a detached ``kafka.sh stop`` to stop the broker
``up`` started. No signal is ever ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from pipeline.stack.up import Up

FORCED_EXIT = 130


async def run_foreground(up: Up, *, err: TextIO = sys.stderr) -> int:
    """Start ``up`` and run it until a signal; return the exit status (0 after a clean stop)."""
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    state = {"signals": 0, "starting": True}

    def on_signal(signum: int) -> None:
        state["signals"] += 1
        name = signal.Signals(signum).name
        if state["signals"] > 1:
            broker = up.owned_broker
            if broker is not None:
                broker.stop_detached()
            note = f"; the broker on port {broker.port} is being stopped" if broker is not None else ""
            err.write(f"\npipeline: {name} again: exiting now{note}\n")
            err.flush()
            os._exit(FORCED_EXIT)
        err.write(f"\npipeline: {name}: stopping (press Ctrl-C again to exit at once)\n")
        err.flush()
        if state["starting"] and main is not None:
            main.cancel()
        else:
            up.stop()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        try:
            await up.start()
        except (asyncio.CancelledError, Exception):
            if state["signals"] and main is not None:
                main.uncancel()  # the cancel was ours, on the signal: clean up normally
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(up.abandon())
            if state["signals"]:
                return FORCED_EXIT
            raise
        state["starting"] = False
        await up.run()
        return 0
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
