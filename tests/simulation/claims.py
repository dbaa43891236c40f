"""Every position a worker claims in its JoinGroup metadata is one a store on its disk holds.

The group's leader gives a partition to the member whose store is the most current, as the
members claim (``StandbyReplicas.claim``, the assignment's ranking). A claim above what the
store holds ranks a stale or empty store first, and the partition then replays its whole
changelog instead of the tail (issue 34, item 3: a standby that wiped and rebuilt its store
kept claiming its old position); a claim beyond the changelog's end is a store of another log
outranking the sticky owner's copy (item 7). Neither makes a wrong command, so the other rules
never see them.

:class:`ClaimCheck` wraps the claim while a run lasts and holds each one, as it is made, to
what the world's :class:`~tests.simulation.faults.StoreLedger` says the worker's store of
that partition holds at that moment (an open store's changelog offset, a closed one's as it
was closed, -1 once wiped), and to the changelog's end. A claim may be lower than the store
(a store not yet checked against its changelog claims -1); never higher.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from aiokafka import TopicPartition

from pipeline.state import directory
from pipeline.worker.assignor import Held
from pipeline.worker.standbys import StandbyReplicas
from tests.simulation.faults import StoreLedger
from tests.simulation.loop import CURRENT

if TYPE_CHECKING:
    from tests.simulation.world import World

MAX_PROBLEMS = 5


class ClaimCheck:
    """Holds every claim of a run to the stores it claims (see the module)."""

    def __init__(self, world: World, ledger: StoreLedger) -> None:
        self.world = world
        self.ledger = ledger
        self.claims = 0  # positions judged (a count for the run's report)
        self.problems: list[str] = []

    @contextmanager
    def installed(self) -> Iterator[None]:
        """``StandbyReplicas.claim`` judged while the block runs (workers built in it bind the wrapper)."""
        original = StandbyReplicas.claim
        check = self

        def claim(replicas: StandbyReplicas) -> Held:
            held = original(replicas)
            check.judge(replicas, held)
            return held

        StandbyReplicas.claim = claim  # type: ignore[method-assign,assignment]
        try:
            yield
        finally:
            StandbyReplicas.claim = original  # type: ignore[method-assign]

    def judge(self, replicas: StandbyReplicas, held: Held) -> None:
        process = CURRENT.get()
        who = process.name if process is not None else "?"
        settings, topology = replicas.settings, replicas.context.topology
        changelogs = self.world.changelog_of()
        positions: dict[TopicPartition, object] = dict(held.positions)  # as sent: typed int, not checked
        for tp, position in sorted(positions.items()):
            if not isinstance(position, int):  # decode_claim then drops the member's whole claim
                self._problem(f"{who} claims {_name(tp)} at {position!r}, not a changelog offset")
                continue
            if position < 0:
                continue
            self.claims += 1
            path = directory.store_path(settings.state_dir, topology, settings.group, tp)
            holds = self.ledger.holds(path)
            if holds is not None and position > holds:
                self._problem(
                    f"{who} claims {_name(tp)} at changelog offset {position}, but its store there holds "
                    f"{holds} (-1: none): a claim above its store ranks it before a more current copy"
                )
            log = (
                self.world.broker.log(changelogs[tp.topic], tp.partition) if tp.topic in changelogs else None
            )
            if log is not None and position >= log.end:
                self._problem(
                    f"{who} claims {_name(tp)} at changelog offset {position}, beyond its changelog's end "
                    f"{log.end}: a store of another log outranks the sticky owner's copy"
                )

    def _problem(self, text: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(text)


def _name(tp: TopicPartition) -> str:
    return f"{tp.topic}-{tp.partition}"
