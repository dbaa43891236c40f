"""The task lifecycle: the transition table is the whole truth, and nothing else moves a task."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from pipeline.errors import IllegalTransitionError
from pipeline.worker.lifecycle import (
    SERVING,
    STANDBY_TRANSITIONS,
    TRANSITIONS,
    Lifecycle,
    PartitionState,
    StandbyState,
)

from .fakes import INPUT, Harness

S = PartitionState
EDGES = [(a, b) for a in S for b in sorted(TRANSITIONS[a])]
NON_EDGES = [(a, b) for a, b in itertools.product(S, S) if b not in TRANSITIONS[a]]


def _at(state: PartitionState) -> Lifecycle[PartitionState]:
    """A lifecycle in ``state`` (set directly: reaching it is what the other tests check)."""
    life = Lifecycle.partition("raw-0")
    life.state = state
    return life


def test_a_partition_starts_opening() -> None:
    """A new lifecycle is OPENING, not serving and not closed."""
    life = Lifecycle.partition("raw-0")
    assert life.state is S.OPENING
    assert not life.serving
    assert not life.closed


def test_the_table_names_every_state() -> None:
    """Every state has a row, and every target is a state: the table has no holes."""
    assert set(TRANSITIONS) == set(S)
    assert all(targets <= set(S) for targets in TRANSITIONS.values())


@pytest.mark.parametrize(("source", "target"), EDGES, ids=[f"{a}->{b}" for a, b in EDGES])
def test_every_edge_of_the_table_is_allowed(source: PartitionState, target: PartitionState) -> None:
    """Each transition the table lists moves the partition to its target."""
    life = _at(source)
    life.move(target)
    assert life.state is target


@pytest.mark.parametrize(("source", "target"), NON_EDGES, ids=[f"{a}->{b}" for a, b in NON_EDGES])
def test_every_other_transition_raises_and_leaves_the_state(
    source: PartitionState, target: PartitionState
) -> None:
    """A transition the table lacks (self-loops included) raises IllegalTransitionError and changes nothing."""
    life = _at(source)
    with pytest.raises(IllegalTransitionError, match=f"from {source} to {target}"):
        life.move(target)
    assert life.state is source


def test_every_state_may_close_and_closed_is_final() -> None:
    """CLOSED is reachable from every state and leads nowhere."""
    assert all(S.CLOSED in TRANSITIONS[s] for s in S if s is not S.CLOSED)
    assert TRANSITIONS[S.CLOSED] == frozenset()


def test_a_failure_while_opening_or_restoring_closes_and_never_breaks() -> None:
    """OPENING and RESTORING go on or close: BROKEN is a state of a serving task only."""
    for state in (S.OPENING, S.RESTORING):
        assert S.BROKEN not in TRANSITIONS[state]


def test_broken_only_closes() -> None:
    """A BROKEN task never serves again in place: it can only close (and a new task opens)."""
    assert TRANSITIONS[S.BROKEN] == {S.CLOSED}


def test_the_happy_path_opens_restores_serves_and_closes() -> None:
    """OPENING → RESTORING → READY → CLOSED is a legal life (commits are the worker's, not a task's state)."""
    life = Lifecycle.partition("raw-0")
    for target in (S.RESTORING, S.READY, S.CLOSED):
        life.move(target)
    assert life.closed


@pytest.mark.parametrize("state", list(S), ids=str)
def test_serving_is_true_only_when_ready(state: PartitionState) -> None:
    """``serving`` holds in READY and in no other state; ``closed`` only in CLOSED."""
    life = _at(state)
    assert life.serving is (state is S.READY)
    assert life.closed is (state is S.CLOSED)


def test_the_serving_set_is_ready() -> None:
    """SERVING, which the loop and /healthz read, names exactly READY."""
    assert frozenset({S.READY}) == SERVING


def test_each_move_records_when_the_state_was_entered_and_a_refused_move_does_not() -> None:
    """``since`` is the monotonic time of the last transition."""
    life = _at(S.READY)
    life.since = 0.0
    life.move(S.BROKEN)
    entered = life.since
    assert entered > 0.0
    with pytest.raises(IllegalTransitionError):
        life.move(S.RESTORING)
    assert life.since == entered


STANDBY_EDGES = [(a, b) for a in StandbyState for b in sorted(STANDBY_TRANSITIONS[a])]
STANDBY_NON_EDGES = [
    (a, b) for a, b in itertools.product(StandbyState, StandbyState) if b not in STANDBY_TRANSITIONS[a]
]


@pytest.mark.parametrize(("source", "target"), STANDBY_EDGES, ids=[f"{a}->{b}" for a, b in STANDBY_EDGES])
def test_every_edge_of_the_standby_table_is_allowed(source: StandbyState, target: StandbyState) -> None:
    """Each transition of a standby's table moves it to its target."""
    life = Lifecycle.standby("raw-0")
    life.state = source
    life.move(target)
    assert life.state is target


@pytest.mark.parametrize(
    ("source", "target"), STANDBY_NON_EDGES, ids=[f"{a}->{b}" for a, b in STANDBY_NON_EDGES]
)
def test_every_other_standby_transition_raises(source: StandbyState, target: StandbyState) -> None:
    """A standby transition its table lacks raises IllegalTransitionError and changes nothing."""
    life = Lifecycle.standby("raw-0")
    life.state = source
    with pytest.raises(IllegalTransitionError):
        life.move(target)
    assert life.state is source


def test_a_standby_never_serves_and_closed_is_final() -> None:
    """A standby starts OPENING, is never serving in any state, and CLOSED leads nowhere."""
    life = Lifecycle.standby("raw-0")
    assert life.state is StandbyState.OPENING
    assert SERVING.isdisjoint(StandbyState)
    assert STANDBY_TRANSITIONS[StandbyState.CLOSED] == frozenset()


def test_an_illegal_move_names_the_task_or_standby_it_was_asked_of() -> None:
    """The error of an illegal transition starts with the name the lifecycle was made with, for both kinds."""
    task = Lifecycle.partition("raw-0")
    with pytest.raises(IllegalTransitionError, match=r"^raw-0: no transition from opening to ready$"):
        task.move(S.READY)
    standby = Lifecycle.standby("standby raw-1")
    standby.move(StandbyState.CLOSED)
    with pytest.raises(
        IllegalTransitionError, match=r"^standby raw-1: no transition from closed to following$"
    ):
        standby.move(StandbyState.FOLLOWING)


def test_a_tasks_refused_move_names_its_partition(tmp_path: Path) -> None:
    """An active task's lifecycle carries the task's name: a transition it lacks is refused naming the partition."""
    task = Harness(tmp_path).task(2)
    task.close()
    with pytest.raises(IllegalTransitionError, match=f"^{re.escape(INPUT)}-2: no transition from "):
        task.lifecycle.move(S.READY)
