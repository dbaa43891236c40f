"""Signs that another live process runs under this worker's identity, and the line the worker stops with.

Two workers must not share an instance id (or, without one, a host and state dir): they share a
transactional id and a static member id. Either of two things shows it:

- the group coordinator took the other in this one's place (FENCED_INSTANCE_ID, KIP-345):
  :func:`instance_taken`;
- the producer is fenced again and again, each process's new producer fencing the other's:
  :class:`FenceCount`.
"""

from __future__ import annotations

import time

from aiokafka.errors import KafkaError

from pipeline.errors import InstanceIdTakenError, ProducerFencedError
from pipeline.kafka import internals
from pipeline.worker.settings import WorkerSettings

FENCES_ALLOWED, FENCE_WINDOW_S = 5, 60.0  # producer fences in a row, within a window, before the worker stops


class FenceCount:
    """The producer's fences within the last :data:`FENCE_WINDOW_S` seconds."""

    def __init__(self, transactional_id: str) -> None:
        self.transactional_id = transactional_id
        self._fences: list[float] = []

    def fenced(self) -> ProducerFencedError | None:
        """One more fence; the error to stop with once there are :data:`FENCES_ALLOWED` in the window."""
        now = time.monotonic()
        self._fences = [at for at in self._fences if now - at < FENCE_WINDOW_S] + [now]
        if len(self._fences) < FENCES_ALLOWED:
            return None
        return ProducerFencedError(
            f"the producer was fenced {len(self._fences)} times in {FENCE_WINDOW_S:g}s: another process "
            f"uses transactional id {self.transactional_id} (the same --instance-id, or the same host "
            "and state dir)"
        )


def instance_taken(settings: WorkerSettings, exc: KafkaError) -> InstanceIdTakenError | None:
    """The error to stop with when ``exc`` (from the group consumer) says another worker took this one's
    ``--instance-id`` in the group; ``None`` for any other error."""
    if settings.instance_id is None or not internals.fenced_instance(exc):
        return None
    return InstanceIdTakenError(
        f"another worker joined group {settings.group} with --instance-id {settings.instance_id} "
        "and took this one's place; two live workers must not share an instance id"
    )
