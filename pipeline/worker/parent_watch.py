"""A supervised worker process stops when its supervisor is gone.

A supervisor that is SIGKILLed (the OOM killer, ``systemctl kill -s KILL``, a
container runtime) cannot stop its children. Left running, they would keep
their partitions and their RocksDB stores locked, so the supervisor started in
its place would find every store in use and give up. So the supervisor names
itself to each child (:data:`SUPERVISOR_PID_ENV`), and the child checks its
parent once a second: when the parent is no longer that process, the child
stops exactly as on SIGTERM (commit what is staged, leave the group, exit 0).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping

from pipeline.errors import ConfigError

log = logging.getLogger(__name__)

#: Set by the supervisor in each child's environment: its own pid.
SUPERVISOR_PID_ENV = "PIPELINE_SUPERVISOR_PID"
CHECK_EVERY = 1.0  # seconds between two looks at the parent


def supervisor_pid(environ: Mapping[str, str]) -> int | None:
    """The supervisor's pid this process was started with, or None when it was not started by one."""
    text = environ.get(SUPERVISOR_PID_ENV, "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) < 2:
        raise ConfigError(f"{SUPERVISOR_PID_ENV} must be a process id, got {text!r}")
    return int(text)


async def watch_parent(
    pid: int,
    on_gone: Callable[[], None],
    *,
    every: float = CHECK_EVERY,
    parent: Callable[[], int] = os.getppid,
) -> None:
    """Call ``on_gone`` once, as soon as this process's parent is no longer ``pid``; runs until then."""
    while parent() == pid:  # noqa: ASYNC110  (no event tells of a parent's death: only polling does)
        await asyncio.sleep(every)
    log.warning("supervisor (pid %d) is gone; stopping this worker process", pid)
    on_gone()
