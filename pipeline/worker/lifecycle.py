"""A partition's lifecycle: the states and the only transitions between them.

::

    OPENING ──▶ RESTORING ──▶ READY ◀──▶ COMMITTING
       │            │         │ │ │       │    │
       │            │         │ ▼ ▼       ▼    ▼
       │            │         │ BROKEN ◀──┘  FENCED ◀── (READY too)
       ▼            ▼         ▼   │              │
     CLOSED ◀───────┴─────────┴───┴──────────────┘

- OPENING: the store is opened (with bounded retry) and the transactional
  producer started, which fences an older owner and aborts its transaction;
- RESTORING: the changelog is replayed into the store;
- READY: records are handled into the open transaction (or it is idle);
- COMMITTING: a commit is in flight; records fetched meanwhile wait;
- BROKEN: the producer cannot continue, or the store failed: the partition is
  closed and opened again while the group still assigns it to this worker;
- FENCED: another producer took the transactional id: closed, and never opened
  again until the group assigns the partition anew;
- CLOSED: the producer is stopped and the store closed.

A failure while OPENING or RESTORING closes the partition (the loop stops the
worker when it stays unserved); a COMMITTING partition is closed only once its
commit has ended.

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
    """Where one partition is in its life."""

    OPENING = "opening"
    RESTORING = "restoring"
    READY = "ready"
    COMMITTING = "committing"
    BROKEN = "broken"
    FENCED = "fenced"
    CLOSED = "closed"


_S = PartitionState
TRANSITIONS: Mapping[PartitionState, frozenset[PartitionState]] = {
    _S.OPENING: frozenset({_S.RESTORING, _S.CLOSED}),
    _S.RESTORING: frozenset({_S.READY, _S.CLOSED}),
    _S.READY: frozenset({_S.COMMITTING, _S.BROKEN, _S.FENCED, _S.CLOSED}),
    _S.COMMITTING: frozenset({_S.READY, _S.BROKEN, _S.FENCED}),
    _S.BROKEN: frozenset({_S.CLOSED}),
    _S.FENCED: frozenset({_S.CLOSED}),
    _S.CLOSED: frozenset(),
}
SERVING = frozenset({_S.READY, _S.COMMITTING})


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
        """Whether records of the partition are being handled (READY or COMMITTING)."""
        return self.state in SERVING

    @property
    def closed(self) -> bool:
        """Whether it is CLOSED."""
        return self.state.value == "closed"
