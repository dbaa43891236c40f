"""What the operator does in a seed's world: fixes a cause, runs ``pipeline dlq replay`` and ``pipeline rescale``
(the real code, each as a process of the world over the simulated network, as the workers are), takes every
worker down for hours, jumps one worker's clock, and changes topic configurations under load.

What a replay must do is checked here, as it ends: a run that exits 0 has replayed every DLQ
record its filter takes that was committed before it started (``dlq replay`` reads to the end
offsets it read first, through outages, never stopping at a silence), and none its filter
leaves. Once everything else in a run is over, the operator looks with ``--dry-run --since``
(:meth:`Operators.look_since`). What its replays become is the oracle's
(``tests/simulation/oracle.py``).
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Iterator
from dataclasses import dataclass, field
from random import Random
from typing import TYPE_CHECKING, Any

import orjson

from pipeline.errors import PipelineError
from pipeline.headers import REPLAYED_FROM_HEADER
from pipeline.ops.dlq import replay
from pipeline.ops.rescale import rescale
from pipeline.records.dlq import DlqFilter
from tests.simulation import logs, wire
from tests.simulation.console import Consoles
from tests.simulation.faults import Fault
from tests.simulation.loop import Process
from tests.simulation.redrive import COMMAND_LIMIT, SIZE
from tests.simulation.scenario import GROUP

if TYPE_CHECKING:
    from tests.simulation.fleet import Slot
    from tests.simulation.world import World

BOOTSTRAP = f"{wire.HOST}:{wire.PORT}"
REPLAY_TIMEOUT_S = 60.0  # dlq replay's --timeout (its default)
LAST_REPLAY_TRIES = 5
QUIET_LIMIT_S = 300.0  # how long a silent downtime waits for the workers to catch up before it begins
RESCALE_RETRY_S = 900.0  # how long the operator keeps running a failing rescale again


@dataclass
class ReplayRun:
    """One ``dlq replay`` run: when it began, what it had to cover, what it replayed, how it ended."""

    name: str
    started: float
    fixed: bool  # began once the fix was complete
    snapshot: dict[int, int]  # each DLQ partition's last stable offset just before it began
    replayed: set[str] = field(default_factory=set)  # "<dlq>:<partition>:<offset>" of each record sent
    outcome: str = "running"
    since_ms: int | None = None  # --since: only DLQ records stamped at or after it


@dataclass
class Boundary:
    """A rescale: each consumed partition's committed offset once every worker had stopped."""

    committed: dict[tuple[str, int], int]
    partitions: int  # the count after it


class Operators:
    """The operator's steps in one world."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.fixed = False  # every worker runs with the causes fixed
        self.fixing = False
        self.runs: list[ReplayRun] = []
        self.boundaries: list[Boundary] = []
        self.down = False  # every worker is down for hours: none starts until it is over
        self.rescaling = False  # pipeline rescale runs: no worker starts until it is over (its procedure)
        self._count = 0
        self._alone = asyncio.Lock()  # a fix, a rescale and a downtime each stop workers: one at a time
        self.consoles = Consoles(
            world, self._replays_landed
        )  # console redrives (tests/simulation/console.py)

    @property
    def holding(self) -> bool:
        """Whether no worker may start now (a downtime, or a rescale, whose procedure is that none runs)."""
        return self.down or self.rescaling

    # -- a fix, and the replays -----------------------------------------------------------
    async def fix(self) -> None:
        """Fix the causes: the topology with the source, the command topics' limit back; restart every worker."""
        world = self.world
        plan = world.scenario.redrive
        if plan is None:
            return
        async with self._alone:
            await self._fix(plan.causes)

    async def _fix(self, causes: tuple[str, ...]) -> None:
        world = self.world
        self.fixing = True
        world.use_topology(fixed=True)
        if SIZE in causes:
            for name in world.topology.command_topics():
                world.broker.topics[name].config.max_message_bytes = logs.TopicConfig().max_message_bytes
        world.note("fix: the causes are fixed; restarting the workers one by one")
        for slot in list(world.slots):
            process = slot.process
            if process is not None and process.alive and slot.wanted:
                await world.fleet.leave(slot, process, 0.5)
        self.fixed = True
        world.note("fix: every worker runs with the fix")

    async def replays(self, fault: Fault) -> None:
        """``fault.target`` replay runs at once, each SIGKILLed after ``fault.duration`` seconds if that is set."""
        runs = [self._replay() for _ in range(max(fault.target, 1))]
        if fault.steps:  # the broker goes away as the first run begins to read the DLQ
            self.world.network.on_fetch = (runs[0][1], lambda: self.cut(float(fault.steps)))
        await asyncio.gather(*(self._watch(run, fault.duration) for run in runs))

    def cut(self, seconds: float, who: str = "a replay") -> None:
        world = self.world
        world.note(f"the broker goes away for {seconds:.0f}s as {who} begins to read")
        world.loop.spawn(None, world.outage(seconds), "outage")

    async def last_replay(self) -> None:
        """The replay an operator runs once everything is over, after a look with ``--dry-run``: again until
        it exits 0."""
        await self._dry_run()
        for _ in range(LAST_REPLAY_TRIES):
            run = self._replay()
            await self._watch(run, 0.0)
            if self.runs[-1].outcome.startswith("exit 0"):
                return
            await asyncio.sleep(5.0)
        self.world.problems.append(f"the last dlq replay never exited 0 in {LAST_REPLAY_TRIES} tries")

    async def _dry_run(self) -> None:
        """``pipeline dlq replay --dry-run``, as an operator looks before replaying: it must send nothing (and,
        exiting 0, list every record the DLQ held, as a replay must replay them)."""
        run = self._replay(dry_run=True)
        await self._watch(run, 0.0)
        # by its own producer: a replay SIGKILLed just before may still have produce requests on the wire,
        # which the broker appends while the dry run runs (redrive seed 167)
        sent = sum(1 for _ in self._replayed_records(by=run[1]))
        if sent:
            self.world.problems.append(
                f"dlq replay --dry-run sent {sent} records (a dry run must send nothing)"
            )

    async def look_since(self) -> None:
        """``pipeline dlq replay --dry-run --since T`` once the run is over, ``T`` the timestamp of a DLQ record
        the run's filter takes (drawn apart from the world's draws): exiting 0, it lists exactly the records the
        filter takes stamped at or after ``T`` (that one included), and it sends nothing."""
        world = self.world
        plan = world.scenario.redrive
        reasons = plan.reasons if plan is not None else frozenset()
        dlq = world.broker.topics[world.topology.topics.dlq]
        stamps = [
            record.timestamp
            for log in dlq.partitions
            for record in log.committed_records()
            if not reasons or orjson.loads(record.value).get("reason") in reasons
        ]
        if not stamps:
            return
        since = sorted(stamps)[Random(world.scenario.seed).randrange(len(stamps))]
        run = self._replay(dry_run=True, since_ms=since)
        await self._watch(run, 0.0)
        if any(True for _ in self._replayed_records(by=run[1])):
            world.problems.append(f"{run[0].name}: dlq replay --dry-run --since sent records")

    def _replays_landed(self) -> set[str]:
        """The DLQ records (``<dlq>:<partition>:<offset>``) some replay's record in Kafka says it came from."""
        return {value.decode() for value in self._replayed_records()}

    def _replayed_records(self, *, by: Process | None = None) -> Iterator[bytes]:
        """The ``replayed-from`` header of every record replays (or the one process ``by``) wrote to the topics
        they send to, read from the log itself: a replay is not transactional, so its records are there once
        written, even behind a worker's open transaction that holds a read_committed reader back."""
        topics = self.world.topology.topics
        names = [topics.input] + ([topics.effects] if self.world.scenario.effects else [])
        producers = self.world.broker.transactions.process_of
        for name in names:
            for log in self.world.broker.topics[name].partitions:
                for batch in log.batches:
                    if batch.control is not None or batch.transactional:
                        continue
                    if by is not None and producers.get(batch.producer_id) is not by:
                        continue
                    for record in batch.records:
                        value = record.header(REPLAYED_FROM_HEADER)
                        if value is not None:
                            yield value

    def _replay(
        self, *, dry_run: bool = False, since_ms: int | None = None
    ) -> tuple[ReplayRun, Process, asyncio.Task[Any]]:
        world = self.world
        plan = world.scenario.redrive
        reasons = plan.reasons if plan is not None else frozenset()
        self._count += 1
        name = f"replay{self._count}"
        dlq = world.broker.topics[world.topology.topics.dlq]
        snapshot = {log.partition: log.lso() for log in dlq.partitions}
        run = ReplayRun(name, world.loop.time(), self.fixed, snapshot, since_ms=since_ms)
        self.runs.append(run)
        process = Process(name)
        flags = (" --dry-run" if dry_run else "") + (f" --since {since_ms}" if since_ms is not None else "")
        flags += f" --reason {','.join(sorted(reasons))}" if reasons else ""
        world.note(f"{name}: pipeline dlq replay{flags}")
        task = world.loop.spawn(process, self._run_replay(run, reasons, dry_run=dry_run), name)
        return run, process, task

    async def _run_replay(self, run: ReplayRun, reasons: frozenset[str], *, dry_run: bool) -> None:
        world = self.world
        try:
            report = await replay(
                BOOTSTRAP,
                world.topology,
                DlqFilter(reasons=reasons, since_ms=run.since_ms),
                dry_run=dry_run,
                out=io.StringIO(),
                timeout=REPLAY_TIMEOUT_S,
            )
            run.replayed = {record.where for record in report.records}
            # as the command: a record it could not rebuild (a truncated body) makes it exit 1
            run.outcome = (
                f"exit {1 if report.skipped else 0}: {report.count} replayed, skipped {report.skipped[:3]}"
            )
        except PipelineError as exc:
            run.outcome = f"exit 1: {exc}"
        except Exception as exc:  # the command would end in a traceback, not one readable line
            run.outcome = f"crashed: {exc!r}"
            world.problems.append(f"{run.name}: dlq replay failed with {exc!r}, not one readable line")
        world.note(f"{run.name} ended: {run.outcome[:300]}")
        if run.outcome.startswith("exit 0"):
            self._check_covered(run, dry_run=dry_run)

    def _check_covered(self, run: ReplayRun, *, dry_run: bool) -> None:
        """A run that exits 0 replayed every record its filter takes that the DLQ held when it began, and
        none its filter leaves (another reason, stamped before ``--since``); and (unless a dry run) each
        record it says it replayed is in Kafka."""
        world = self.world
        plan = world.scenario.redrive
        reasons = plan.reasons if plan is not None else frozenset()
        dlq = world.topology.topics.dlq
        since = run.since_ms if run.since_ms is not None else -1
        for log in world.broker.topics[dlq].partitions:
            for record in log.committed_records():
                reason = orjson.loads(record.value).get("reason")
                where = f"{dlq}:{log.partition}:{record.offset}"
                taken = (not reasons or reason in reasons) and record.timestamp >= since
                if not taken and where in run.replayed:
                    world.problems.append(
                        f"{run.name} replayed {where} ({reason}, stamped {record.timestamp}), which its filter "
                        f"leaves (--reason {','.join(sorted(reasons))}, --since {run.since_ms})"
                    )
                    return
                if record.offset >= run.snapshot.get(log.partition, 0):
                    continue
                if taken and where not in run.replayed:
                    world.problems.append(
                        f"{run.name} exited 0 without replaying {where} ({reason}), which the DLQ held when it began"
                    )
                    return
        if dry_run:
            return
        missing = sorted(run.replayed - self._replays_landed())
        if missing:
            world.problems.append(
                f"{run.name} exited 0 saying it replayed {missing[0]}, but no record replayed from it is in "
                f"Kafka ({len(missing)} such)"
            )

    async def _watch(self, started: tuple[ReplayRun, Process, asyncio.Task[Any]], kill_after: float) -> None:
        run, process, task = started
        if kill_after:
            await asyncio.wait({task}, timeout=kill_after)
            if not task.done():
                world = self.world
                world.note(f"{run.name} SIGKILL")
                world.loop.crash(process)
                run.outcome = "killed"
                return
        while not task.done() and process.alive:
            await asyncio.sleep(0.25)

    # -- rescale ----------------------------------------------------------------------------
    async def rescale(self, fault: Fault) -> None:
        """Every worker stopped (SIGTERM), ``pipeline rescale --partitions N``, the workers started again."""
        async with self._alone:
            await self._rescale(fault)

    async def _rescale(self, fault: Fault) -> None:
        world = self.world
        self.rescaling = True
        try:
            await self._rescale_stopped(fault, await world.fleet.stop_workers())
        finally:
            self.rescaling = False
        for slot in world.slots:  # those stopped for it, and any that joined meanwhile
            world.fleet.start(slot)

    async def _rescale_stopped(self, fault: Fault, wanted: list[Slot]) -> None:
        world = self.world
        await self._transactions_ended()
        group = world.broker.group(GROUP)
        consumed = [t for t in world.consumed_topics() if t in world.broker.topics]
        committed = {
            (name, log.partition): group.committed.get((name, log.partition), 0)
            for name in consumed
            for log in world.broker.topics[name].partitions
        }
        process = Process("rescale")
        if fault.duration:  # the broker goes away as the rescale begins to move the changelogs
            world.network.on_fetch = (process, lambda: self.cut(fault.duration, "the rescale"))
        lines: list[str] = []
        task = world.loop.spawn(process, self._run_rescale(fault.target, lines), "rescale")
        while not task.done():
            await asyncio.sleep(0.25)
        world.note(f"rescale ended: {lines[-1] if lines else '?'}")
        if lines and lines[-1].startswith("rescaled"):
            self.boundaries.append(Boundary(committed, fault.target))
            world.partitions_now = fault.target
        for slot in wanted:
            slot.wanted = True

    async def _run_rescale(self, partitions: int, lines: list[str]) -> None:
        """``pipeline rescale``, run again after each failure as the operator would, for up to
        RESCALE_RETRY_S (an outage outlasts twenty quick tries: seed 5616 of the default mix)."""
        world = self.world
        deadline = asyncio.get_running_loop().time() + RESCALE_RETRY_S
        while asyncio.get_running_loop().time() < deadline:
            try:
                await rescale(
                    BOOTSTRAP,
                    world.topology,
                    partitions=partitions,
                    group=GROUP,
                    state_file=world.root / "rescale.json",
                    progress=lines.append,
                )
                return
            except PipelineError as exc:  # the broker away, a member not gone yet: an operator tries again
                lines.append(f"failed: {exc}")
                await asyncio.sleep(2.0)
            except Exception as exc:  # the command would end in a traceback, not one readable line
                lines.append(f"crashed: {exc!r}")
                world.problems.append(f"pipeline rescale failed with {exc!r}, not one readable line")
                return

    async def _transactions_ended(self) -> None:
        """Wait until no consumed partition holds an open transaction (a killed worker's is aborted by its
        timeout), so the group's committed offsets say what was handled before the rescale."""
        world = self.world
        while any(
            log.open_txns
            for name in world.consumed_topics()
            if name in world.broker.topics
            for log in world.broker.topics[name].partitions
        ) or any(
            t.state in ("prepare_commit", "prepare_abort") for t in world.broker.transactions.txns.values()
        ):
            await asyncio.sleep(0.5)

    # -- time, and configurations --------------------------------------------------------------
    async def downtime(self, fault: Fault) -> None:
        """Every worker down (SIGTERM or SIGKILL) for ``fault.duration`` seconds, then started again."""
        world = self.world
        async with self._alone:
            if world.scenario.time is not None and world.scenario.time.silent:
                await self._quiet()
            self.down = (
                True  # before the stop: a rolling restart finishing meanwhile starts nobody (seed 3356)
            )
            down = await world.fleet.stop_workers(kill=fault.detail == "kill")
            world.note(f"downtime: every worker down for {fault.duration / 3600:.1f}h")
            await asyncio.sleep(fault.duration)
            self.down = False
            world.note("downtime over: the workers start again")
            for slot in world.slots:
                slot.wanted = slot.wanted or slot in down
                world.fleet.start(slot)

    async def _quiet(self) -> None:
        """Before a silent downtime: wait (up to :data:`QUIET_LIMIT_S`) until the workers have handled every
        record so far. A record left behind would be handled after the downtime, its stream time more than
        the changelog's margin behind the clock, against claims the broker's retention deleted meanwhile:
        what docs/operations.md ("Expiry and disk") tells the operator to cover with ``retention.ms``."""
        world = self.world
        deadline = world.loop.time() + QUIET_LIMIT_S
        while not world.caught_up():
            if world.loop.time() > deadline:
                world.note(f"downtime: not caught up after {QUIET_LIMIT_S:.0f}s; going down anyway")
                return
            await asyncio.sleep(0.25)
        world.note("downtime: every record so far handled")

    async def clock_jump(self, slot: Slot, fault: Fault) -> None:
        """``slot``'s wall clock steps by ``fault.detail`` seconds, and back after ``fault.duration`` (if set)."""
        slot.clock_offset = float(fault.detail)
        self.world.note(f"{slot.name}'s clock is now {slot.clock_offset:+.0f}s off")
        if fault.duration:
            await asyncio.sleep(fault.duration)
            slot.clock_offset = 0.0
            self.world.note(f"{slot.name}'s clock is right again")

    def reconfigure(self, fault: Fault) -> None:
        """A topic configuration changed while the workers run."""
        world = self.world
        topics = world.topology.topics
        changelogs = [topics.changelog] + ([topics.effects_changelog] if world.scenario.effects else [])
        if fault.detail in ("log-append-time", "create-time"):
            kind = logs.LOG_APPEND_TIME if fault.detail == "log-append-time" else "CreateTime"
            for name in changelogs:
                world.broker.topics[name].config.timestamp_type = kind
        elif fault.detail == "limits-up":
            for name in world.topology.command_topics():
                config = world.broker.topics[name].config
                config.max_message_bytes = max(config.max_message_bytes, logs.TopicConfig().max_message_bytes)
        elif fault.detail == "limits-down":  # the workers learn it from the broker's refusals
            for name in world.topology.command_topics():
                world.broker.topics[name].config.max_message_bytes = COMMAND_LIMIT
                world.broker.topics[name].reconfigured = True
        world.note(f"reconfigure: {fault.detail}")
