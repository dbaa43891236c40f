"""A worker's standby replicas, and what it tells its group about the stores it holds.

:class:`StandbyReplicas` owns the worker's :class:`~pipeline.worker.assignor.StandbyAssignor`
(the consumer is built with it), the positions it reports, and the
:class:`~pipeline.worker.standby.Standby` copies the group's leader gave this worker:

- at start, the stores already on this worker's disk are read once for their
  changelog positions (:func:`pipeline.state.directory.stored_positions`) and
  checked against their changelogs' ends, so a restarted worker claims what it
  still holds, and never a store beyond its changelog's end;
- the position claimed for a partition is what its store on disk holds now, once
  checked against the changelog's end (:meth:`StandbyReplicas.claim`): lowered
  when the store is wiped or rebuilt, dropped when it is no longer on disk;
- on each assignment (:meth:`StandbyReplicas.assigned`, before any partition
  opens) a standby of a partition now served here is closed first: the
  partition then opens the same store, fences the previous owner and replays
  only what the standby had not (a *promotion*); standbys no longer given are
  closed, new ones start;
- all standbys read through the worker's one restore service
  (:class:`~pipeline.state.restore.Restorer`: one reader, one budget), behind any restore.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from pipeline.state import directory
from pipeline.state.store_meta import StoreIdentity
from pipeline.worker.assignor import Held, StandbyAssignor
from pipeline.worker.context import PartitionContext
from pipeline.worker.standby import Standby

log = logging.getLogger(__name__)

Positions = Callable[[], Mapping[TopicPartition, int]]  # the served partitions' store positions now
OBSERVE_EVERY = 1.0  # seconds between two settings of the standby gauges


class StandbyReplicas:
    """The standbys of one worker, and the positions it claims in its JoinGroup metadata."""

    def __init__(
        self,
        context: PartitionContext,
        changelogs: Mapping[str, str],
        served_positions: Positions,
        *,
        unplanned: Callable[[frozenset[str]], None] | None = None,
    ) -> None:
        self.context = context
        self.settings = context.settings.for_topology(context.topology.app)
        self._changelogs = dict(changelogs)  # consumed topic -> its changelog topic
        self._served_positions = served_positions
        self.known: dict[TopicPartition, int] = {}  # last position of every store on this worker's disk
        self.served: frozenset[TopicPartition] = frozenset()  # assigned in the last generation
        self.held: dict[TopicPartition, Standby] = {}
        self.assignor = StandbyAssignor(
            replicas=self.settings.standby_replicas, held=self.claim, unplanned=unplanned
        )
        self._observed: set[TopicPartition] = set()  # standbys whose gauges are set
        self._observed_at = 0.0

    async def scan(self) -> None:
        """Learn the positions of the stores already on disk (once, at start: each is opened and closed), and
        check each against the end its changelog holds it to (``Restorer.held_ends``): a store beyond it caches
        another log and claims nothing (it is rebuilt when opened); when the ends cannot be read, none claims
        anything until opened."""
        topology = self.context.topology
        found = directory.stored_positions(
            self.settings.state_dir,
            topology,
            self.settings.group,
            {topic: self.identity(TopicPartition(topic, 0)) for topic in self._changelogs},
            opener=self.context.open_store,
        )
        if not found:
            return
        changelogs = {tp: TopicPartition(self._changelogs[tp.topic], tp.partition) for tp in found}
        try:
            ends = await self._ends({changelogs[tp]: offset for tp, offset in found.items()})
        except KafkaError as exc:
            log.warning(
                "stores on disk claim nothing until opened: their changelogs' ends cannot be read: %r", exc
            )
            return
        for tp, offset in sorted(found.items()):
            end = ends.get(changelogs[tp])
            if end is not None and offset < end:
                self.known[tp] = offset
            else:
                log.warning(
                    "store %s-%s is at changelog offset %s, beyond the end of %s-%s (%s): it caches another "
                    "log, claims nothing and is rebuilt when opened",
                    tp.topic,
                    tp.partition,
                    offset,
                    changelogs[tp].topic,
                    tp.partition,
                    end,
                )
        if self.known:
            log.info(
                "stores on disk: %s",
                ", ".join(f"{tp.topic}-{tp.partition} at {o}" for tp, o in sorted(self.known.items())),
            )

    async def _ends(self, positions: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        """The end each changelog holds a store at ``positions[changelog]`` to (the last stable offset, or the log
        end for a store past it: its last commit's markers on their way), as a standby's round holds it."""
        return await self.context.require_restorer().held_ends(positions)

    def claim(self) -> Held:
        """What this worker holds, for the assignor's metadata: the position each store on its disk holds now.

        A standby's position is its store's as it is now, lowered when the store was wiped or rebuilt;
        until a round has checked the store against its changelog's end, what was known of it before (-1
        when nothing was). A closed store is claimed only while it is still on disk, and only once checked
        against the changelog's end, so a store ahead of it (a cache of another log, rebuilt when opened)
        never outranks a sticky owner's copy. The stores of partitions served here report their live
        position (``served_positions``); a rebalance closes them all before the worker rejoins.
        """
        positions = {tp: offset for tp, offset in self.known.items() if directory.holds_store(self._path(tp))}
        for tp, standby in self.held.items():
            stored = standby.stored
            positions[tp] = stored if stored is not None else positions.get(tp, -1)
        positions.update(self._served_positions())
        return Held(positions, self.served)

    def identity(self, tp: TopicPartition) -> StoreIdentity:
        """The identity of ``tp``'s store (as a served partition's)."""
        return self.context.identity(tp, TopicPartition(self._changelogs[tp.topic], tp.partition))

    def remember(self, tp: TopicPartition, position: int | None) -> None:
        """A store of ``tp`` (served, or a standby's) was closed, leaving ``position`` on disk (-1: it was
        wiped; None: not known, so the position remembered before stands). A store no longer on disk is
        forgotten: a wiped store never claims what it held."""
        if not directory.holds_store(self._path(tp)):
            self.known.pop(tp, None)
        elif position is not None:
            self.known[tp] = position

    def _path(self, tp: TopicPartition) -> Path:
        return directory.store_path(self.settings.state_dir, self.context.topology, self.settings.group, tp)

    async def assigned(self, assigned: Iterable[TopicPartition]) -> None:
        """Apply a new assignment: promote (close) standbys of partitions now served here, drop the
        standbys no longer given, start the new ones."""
        active = frozenset(assigned)
        self.served = active
        wanted = {tp for tp in self.assignor.standbys - active if tp.topic in self._changelogs}
        for tp in sorted(set(self.held) & active):
            standby = self.held.pop(tp)
            lag = standby.lag_records
            self.remember(tp, await standby.close())
            log.info(
                "%s: promoted from standby at changelog offset %s (%s records behind at its last round)",
                standby.name,
                standby.position,
                "?" if lag is None else lag,
            )
        for tp in sorted(set(self.held) - wanted):
            standby = self.held.pop(tp)
            self.remember(tp, await standby.close())
            log.info("standby %s: no longer held here", standby.name)
        for tp in sorted(wanted - set(self.held)):
            self.held[tp] = self._start(tp)
        if wanted:
            log.info("standbys: %s", [f"{tp.topic}-{tp.partition}" for tp in sorted(wanted)])

    def _start(self, tp: TopicPartition) -> Standby:
        standby = Standby(
            tp,
            changelog=TopicPartition(self._changelogs[tp.topic], tp.partition),
            identity=self.identity(tp),
            path=self._path(tp),
            bucket_ms=directory.topology_bucket_ms(self.context.topology),
            restorer=self.context.require_restorer(),
            opener=self.context.open_store,
            on_applied=self.context.metrics.standby_records.inc,
        )
        standby.start()
        return standby

    def describe(self) -> dict[str, dict[str, object]]:
        """Each standby (``<topic>-<partition>``): its state, position and lag, for ``/healthz`` and ``/partitions``."""
        now = time.monotonic()
        return {standby.name: standby.describe(now) for _tp, standby in sorted(self.held.items())}

    def observe(self) -> None:
        """Set the standby gauges (at most every :data:`OBSERVE_EVERY` seconds): each standby's lag in
        records and seconds; the gauges of a standby no longer held are removed."""
        now = time.monotonic()
        if now - self._observed_at < OBSERVE_EVERY:
            return
        self._observed_at = now
        metrics = self.context.metrics
        metrics.standby_partitions.set(len(self.held))
        for tp in self._observed - set(self.held):
            for gauge in (metrics.standby_lag_records, metrics.standby_lag_seconds):
                with contextlib.suppress(KeyError):
                    gauge.remove(tp.topic, str(tp.partition))
        for tp, standby in self.held.items():
            labels = (tp.topic, str(tp.partition))
            lag = standby.lag_records
            if lag is not None:
                metrics.standby_lag_records.labels(*labels).set(lag)
            metrics.standby_lag_seconds.labels(*labels).set(standby.lag_seconds(now))
        self._observed = set(self.held)

    async def close(self) -> None:
        """Close every standby."""
        held, self.held = self.held, {}
        for tp, standby in held.items():
            self.remember(tp, await standby.close())
