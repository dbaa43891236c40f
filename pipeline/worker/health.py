"""What ``/healthz`` and ``/readyz`` say: alive (nothing stuck or failed), and ready (every partition served).

A worker opening or restoring its partitions is alive but not ready: a restart would only
begin the restore again. A stuck partition (work waiting, no commit for ``stuck_after``) or
a failed worker is not alive: a restart is what helps. A worker that stays unable to serve a
partition exits by itself (``--open-timeout``), so liveness needs no clock of its own.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from aiokafka import TopicPartition

from pipeline.worker.task import ActiveTask


class Health(NamedTuple):
    """A worker's answer: ``ready`` for ``/readyz``, ``detail`` for either body, ``live`` for ``/healthz``."""

    ready: bool
    detail: dict[str, Any]
    live: bool


STOPPED = Health(False, {"status": "stopped"}, False)


def partition_health(
    assigned: Iterable[TopicPartition],
    partitions: Mapping[TopicPartition, ActiveTask],
    *,
    failed: bool,
    stopping: bool = False,
    standbys: Mapping[str, Mapping[str, object]] | None = None,
    warnings: Sequence[str] = (),
) -> Health:
    """Ready while every assigned partition is READY, none is stuck, and the worker neither failed
    nor stops; alive unless it failed or a partition is stuck.

    ``detail`` has ``status`` (``ok``, ``not ready`` or ``unhealthy``), each assigned partition's
    state, the ``problems`` if any, and the standbys this worker keeps (``standby``: state,
    position, lag in records and seconds); a standby never makes a worker unready or unhealthy:
    a copy behind is slower failover, not a partition unserved. Nor do the ``warnings`` (a topic config
    the worker would refuse to start on, changed under it: pipeline/worker/topic_watch.py)."""
    now = time.monotonic()
    states = {}
    problems = []
    stuck = False
    for tp in sorted(assigned, key=lambda t: (t.topic, t.partition)):
        part = partitions.get(tp)
        name = f"{tp.topic}-{tp.partition}"
        state = part.state.value if part is not None else "unowned"
        if part is not None and part.stuck(now):
            state = "stuck"
            stuck = True
        states[name] = state
        if state != "ready":
            problems.append(f"{name} is {state}")
    if failed:
        problems.append("the worker failed and is stopping")
    elif stopping:
        problems.append("the worker is stopping")
    live = not failed and not stuck
    ready = live and not problems
    status = "ok" if ready else "not ready" if live else "unhealthy"
    detail: dict[str, Any] = {"status": status, "partitions": states}
    if problems:
        detail["problems"] = problems
    if warnings:
        detail["warnings"] = list(warnings)
    if standbys:
        detail["standby"] = {name: dict(info) for name, info in standbys.items()}
    return Health(ready, detail, live)
