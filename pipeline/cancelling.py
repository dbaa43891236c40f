"""Stopping a background task for good, even when a cancellation is lost on the way.

On Python 3.11, ``asyncio.wait_for`` returns its inner result and drops a
cancellation that arrives as that result comes in (fixed in 3.12). A loop
that runs ``while True`` and meets such a race (an admin client's start, a
connection aiokafka opens with ``wait_for``) goes on as if never cancelled,
and a stop that cancels it once and awaits it waits forever (the likely cause
of ``pipeline up`` hanging on SIGTERM in some test runs: its console's redrive
follower opens an admin client with ``wait_for`` as it stops).
"""

from __future__ import annotations

import asyncio
from typing import Any

#: How long a stop waits for a cancelled task before it cancels it again.
AGAIN_AFTER_S = 1.0


async def cancel_and_wait(task: asyncio.Task[Any], *, again_after: float = AGAIN_AFTER_S) -> None:
    """Cancel ``task`` and wait until it has ended, cancelling it again every ``again_after``
    seconds while it runs. An error it ended with is raised here, as ``await task`` would; its
    cancellation is not."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=again_after)
    if not task.cancelled():
        task.result()
