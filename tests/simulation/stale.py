"""A store is wiped as stale only when it is beyond its changelog's end.

A store is a cache of its changelog. One whose position lies beyond the changelog's end caches
another log (the topic deleted and made again, another cluster's, a copied disk) and is wiped and
rebuilt (``StoreStaleError``): right for such a store, and a whole rebuild for one that is not. A
standby that wipes the store it follows for nothing replays its changelog from the start, and the
promotion it was kept warm for is cold (issue 34, item 3's kind). No command is wrong, so the
other rules never see it.

:class:`StaleCheck` wraps the restore service's position check (``pipeline.state.restore._level``)
while a run lasts: each time it calls a store stale, the store's position is held to the
changelog's end in the broker model at that moment. A position below that end is a store the
changelog has everything of, wiped as if it cached another log.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from aiokafka import TopicPartition

from pipeline.errors import StoreStaleError
from pipeline.state import restore
from pipeline.state.store import PartitionStore
from tests.simulation.loop import CURRENT

if TYPE_CHECKING:
    from tests.simulation.world import World

MAX_PROBLEMS = 5


class StaleCheck:
    """Holds every store called stale in a run to its changelog's end (see the module)."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.stale = 0  # stores called stale (a count for the run's report)
        self.problems: list[str] = []

    @contextmanager
    def installed(self) -> Iterator[None]:
        """``restore._level`` judged while the block runs."""
        original = restore._level  # the one seam this rule watches
        check = self

        def level(store: PartitionStore, changelog: TopicPartition, end: int) -> bool:
            try:
                return original(store, changelog, end)
            except StoreStaleError:
                check.judge(store, changelog, end)
                raise

        restore._level = level
        try:
            yield
        finally:
            restore._level = original

    def judge(self, store: PartitionStore, changelog: TopicPartition, end: int) -> None:
        self.stale += 1
        log = self.world.broker.log(changelog.topic, changelog.partition)
        if log is None or store.changelog_offset >= log.end:
            return
        process = CURRENT.get()
        who = process.name if process is not None else "?"
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(
                f"{who} called its store of {changelog.topic}-{changelog.partition} at changelog offset "
                f"{store.changelog_offset} stale against an end of {end}, but the changelog ends at "
                f"{log.end}: a store the changelog has everything of, wiped as if it cached another log"
            )
