"""What ``/healthz`` says: every assigned partition served, none stuck."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from aiokafka import TopicPartition

from pipeline.worker.partition import Partition


def partition_health(
    assigned: Iterable[TopicPartition],
    partitions: Mapping[TopicPartition, Partition],
    *,
    failed: bool,
    standbys: Mapping[str, Mapping[str, object]] | None = None,
) -> tuple[bool, dict[str, Any]]:
    """(healthy, details): unhealthy while an assigned partition is not READY/COMMITTING, or is stuck.

    The standbys this worker keeps are in the details (``standby``: state, position, lag in
    records and seconds); they never make it unhealthy: a copy behind is slower failover, not
    a partition unserved."""
    now = time.monotonic()
    states = {}
    problems = []
    for tp in sorted(assigned, key=lambda t: (t.topic, t.partition)):
        part = partitions.get(tp)
        name = f"{tp.topic}-{tp.partition}"
        state = part.state.value if part is not None else "unowned"
        if part is not None and part.stuck(now):
            state = "stuck"
        states[name] = state
        if state not in ("ready", "committing"):
            problems.append(f"{name} is {state}")
    healthy = not problems and not failed
    detail: dict[str, Any] = {"status": "ok" if healthy else "unhealthy", "partitions": states}
    if problems:
        detail["problems"] = problems
    if standbys:
        detail["standby"] = {name: dict(info) for name, info in standbys.items()}
    return healthy, detail
