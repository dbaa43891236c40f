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
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from enum import StrEnum

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


class Lifecycle:
    """The current state of one partition; :meth:`move` is the only way to change it."""

    __slots__ = ("name", "since", "state")

    def __init__(self, name: str) -> None:
        self.name = name
        self.state = PartitionState.OPENING
        self.since = time.monotonic()  # when it entered ``state`` (monotonic seconds)

    def move(self, target: PartitionState) -> None:
        """Go to ``target``; raises :class:`IllegalTransitionError` when the table has no such edge."""
        if target not in TRANSITIONS[self.state]:
            raise IllegalTransitionError(f"{self.name}: no transition from {self.state} to {target}")
        self.state = target
        self.since = time.monotonic()

    @property
    def serving(self) -> bool:
        """Whether records of the partition are being handled (READY or COMMITTING)."""
        return self.state in SERVING

    @property
    def closed(self) -> bool:
        """Whether the partition is CLOSED."""
        return self.state is PartitionState.CLOSED
