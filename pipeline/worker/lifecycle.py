"""A task's lifecycle: the states and the only transitions between them.

An active task (:mod:`pipeline.worker.task`: a partition this worker serves)::

    OPENING ──▶ RESTORING ──▶ READY ──▶ BROKEN
       │            │           │          │
       ▼            ▼           ▼          ▼
     CLOSED ◀───────┴───────────┴──────────┘

- OPENING: the store is opened (with bounded retry), and the group's committed offset read
  stable (a transaction still holding the partition's offsets is waited out);
- RESTORING: the changelog is replayed into the store, to its log end;
- READY: the task's records are handled into the worker's transaction (or it is idle);
- BROKEN: its store failed: the task is closed and opened again while the group still
  assigns the partition to this worker (restore repairs the store);
- CLOSED: the store is closed.

A failure while OPENING or RESTORING closes the task (the table stops the worker when the
partition stays unserved). Fences and refused transactions are the worker's, not a task's:
they abort the worker's transaction and every task in it goes back to its first record in it.

A standby replica (:mod:`pipeline.worker.standby`) has a life of its own::

    OPENING ──▶ FOLLOWING
       ▲  │        │  │
       │  │        │  └──▶ CLOSED (no longer wanted, promoted, or the worker stops)
       └──┼────────┘ (a failure: the store is closed and opened again after a pause)
          └──▶ CLOSED

- OPENING: the store is opened to follow its changelog (a stale one is rebuilt);
- FOLLOWING: rounds of replaying the changelog to its end, then waiting;
- CLOSED: the store is closed; nothing of it runs any more.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from enum import StrEnum
from typing import Generic, TypeVar

from pipeline.errors import IllegalTransitionError


class PartitionState(StrEnum):
    """Where one active task (a served partition) is in its life."""

    OPENING = "opening"
    RESTORING = "restoring"
    READY = "ready"
    BROKEN = "broken"
    CLOSED = "closed"


_S = PartitionState
TRANSITIONS: Mapping[PartitionState, frozenset[PartitionState]] = {
    _S.OPENING: frozenset({_S.RESTORING, _S.CLOSED}),
    _S.RESTORING: frozenset({_S.READY, _S.CLOSED}),
    _S.READY: frozenset({_S.BROKEN, _S.CLOSED}),
    _S.BROKEN: frozenset({_S.CLOSED}),
    _S.CLOSED: frozenset(),
}
SERVING = frozenset({_S.READY})


class StandbyState(StrEnum):
    """Where one standby replica is in its life."""

    OPENING = "opening"
    FOLLOWING = "following"
    CLOSED = "closed"


STANDBY_TRANSITIONS: Mapping[StandbyState, frozenset[StandbyState]] = {
    StandbyState.OPENING: frozenset({StandbyState.FOLLOWING, StandbyState.CLOSED}),
    StandbyState.FOLLOWING: frozenset({StandbyState.OPENING, StandbyState.CLOSED}),
    StandbyState.CLOSED: frozenset(),
}

_State = TypeVar("_State", PartitionState, StandbyState)


class Lifecycle(Generic[_State]):
    """The current state of one partition (or standby); :meth:`move` is the only way to change it."""

    __slots__ = ("name", "since", "state", "transitions")

    def __init__(self, name: str, initial: _State, transitions: Mapping[_State, frozenset[_State]]) -> None:
        self.name = name
        self.state: _State = initial
        self.transitions: Mapping[_State, frozenset[_State]] = transitions
        self.since = time.monotonic()  # when it entered ``state`` (monotonic seconds)

    @staticmethod
    def partition(name: str) -> Lifecycle[PartitionState]:
        """A partition's, OPENING."""
        return Lifecycle(name, PartitionState.OPENING, TRANSITIONS)

    @staticmethod
    def standby(name: str) -> Lifecycle[StandbyState]:
        """A standby's, OPENING."""
        return Lifecycle(name, StandbyState.OPENING, STANDBY_TRANSITIONS)

    def move(self, target: _State) -> None:
        """Go to ``target``; raises :class:`IllegalTransitionError` when the table has no such edge."""
        if target not in self.transitions[self.state]:
            raise IllegalTransitionError(f"{self.name}: no transition from {self.state} to {target}")
        self.state = target
        self.since = time.monotonic()

    @property
    def serving(self) -> bool:
        """Whether records of the partition are being handled (READY)."""
        return self.state in SERVING

    @property
    def closed(self) -> bool:
        """Whether it is CLOSED."""
        return self.state.value == "closed"
