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

One under-claim is checked too: the stores a worker finds on its disk at start are checked against
their changelogs' ends (``StandbyReplicas.scan``, through ``_ends``), and each that lies inside its
changelog as the ends are read (below the log end in the broker model) is claimed in the worker's
first claim, unless the ends could not be read. A store held to the stable end alone claims nothing
while its last commit's markers are on their way, and the leader places the partition on a colder
copy: a longer restore, no wrong command.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
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
        # process -> the stores its start-up scan found inside their changelogs: {input partition: offset}
        self._scanned: dict[str, dict[TopicPartition, int]] = {}

    @contextmanager
    def installed(self) -> Iterator[None]:
        """``StandbyReplicas.claim`` judged while the block runs (workers built in it bind the wrapper)."""
        original, ends = StandbyReplicas.claim, StandbyReplicas._ends
        check = self

        def claim(replicas: StandbyReplicas) -> Held:
            held = original(replicas)
            check.judge(replicas, held)
            return held

        async def scanned(
            replicas: StandbyReplicas, positions: Mapping[TopicPartition, int]
        ) -> dict[TopicPartition, int]:
            inside = check.inside(positions)
            answer = await ends(replicas, positions)  # raises when the ends cannot be read: nothing expected
            check._scanned[_who()] = inside
            return answer

        StandbyReplicas.claim = claim  # type: ignore[method-assign,assignment]
        StandbyReplicas._ends = scanned  # type: ignore[method-assign,assignment]
        try:
            yield
        finally:
            StandbyReplicas.claim = original  # type: ignore[method-assign]
            StandbyReplicas._ends = ends  # type: ignore[method-assign]

    def inside(self, positions: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        """Of the stores at ``positions`` (by changelog partition), those inside their changelog in the broker
        model now, by input partition."""
        consumed = {changelog: topic for topic, changelog in self.world.changelog_of().items()}
        found: dict[TopicPartition, int] = {}
        for changelog, offset in positions.items():
            log = self.world.broker.log(changelog.topic, changelog.partition)
            if changelog.topic in consumed and log is not None and offset < log.end:
                found[TopicPartition(consumed[changelog.topic], changelog.partition)] = offset
        return found

    def judge(self, replicas: StandbyReplicas, held: Held) -> None:
        who = _who()
        settings, topology = replicas.settings, replicas.context.topology
        for tp, offset in sorted(self._scanned.pop(who, {}).items()):
            path = directory.store_path(settings.state_dir, topology, settings.group, tp)
            holds = self.ledger.holds(path)
            if held.positions.get(tp, -1) < offset and holds is not None and holds >= offset:
                self._problem(
                    f"{who} found its store of {_name(tp)} at changelog offset {offset} at start, inside its "
                    f"changelog, but claims {held.positions.get(tp, -1)} (-1: nothing): the leader ranks a "
                    "colder copy first"
                )
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


def _who() -> str:
    process = CURRENT.get()
    return process.name if process is not None else "?"


def _name(tp: TopicPartition) -> str:
    return f"{tp.topic}-{tp.partition}"
