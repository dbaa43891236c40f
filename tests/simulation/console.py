"""The console's redrive as an operator's step of the world: the real code (``pipeline/console``), no browser.

A redrive seed may have consoles redrive every DLQ record of the plan's reasons (a page's
"redrive all") beside the ``dlq replay`` runs of the same moment, sometimes two consoles at
once, sometimes with the broker going away as the first begins to read the DLQ. Each console
is a process of the world with its own history client, as two operators' browsers on two
consoles would be. What must hold, besides the windows (a redriven record is a copy like any
other, judged by the oracle):

- a run that raised is a 503 page: a :class:`~pipeline.errors.PipelineError` or a Kafka error,
  never another exception;
- the page's read of the records it chose gives every one of them (the model's DLQ deletes
  nothing), or raises;
- every record the run's history says was sent has a record in Kafka replayed from it;
- a run that ended ``sent`` read every record it chose that the DLQ still holds: none is left
  planned, and none is marked "no longer in the DLQ" while the DLQ holds it (a read that took a
  silence for the end did both, and the page then showed those records as not replayable).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson
from aiokafka.errors import KafkaError

from pipeline.console.dlq_read import read_records
from pipeline.console.dlq_view import EventTypes, row_of
from pipeline.console.history import History, Run
from pipeline.console.redrive import Redrives
from pipeline.console.settings import Role, User
from pipeline.errors import PipelineError
from tests.simulation import wire
from tests.simulation.faults import Fault
from tests.simulation.loop import Process

if TYPE_CHECKING:
    from tests.simulation.world import World

BOOTSTRAP = f"{wire.HOST}:{wire.PORT}"
OPERATOR = User("operator", Role.REDRIVE, "sim-token")
GONE = "no longer in the DLQ"  # the skip a run gives a chosen record its read did not find


class Consoles:
    """The world's console redrives (see the module)."""

    def __init__(self, world: World, landed: Callable[[], set[str]]) -> None:
        self.world = world
        self._landed = landed  # the DLQ records some record in Kafka says it was replayed from
        self._count = 0

    async def redrives(self, fault: Fault, cut: Callable[[float, str], None]) -> None:
        """``fault.target`` consoles redrive at once; with ``fault.steps``, the broker goes away for that many seconds
        as the first begins to read the DLQ (``cut``)."""
        started = [self._start() for _ in range(max(fault.target, 1))]
        if fault.steps:
            seconds = float(fault.steps)
            self.world.network.on_fetch = (started[0][0], lambda: cut(seconds, "a console's redrive"))
        await asyncio.gather(*(self._wait(process, task) for process, task in started))

    def _start(self) -> tuple[Process, asyncio.Task[Any]]:
        world = self.world
        self._count += 1
        name = f"console{self._count}"
        process = Process(name)
        world.note(f"{name}: a console redrives every DLQ record of the plan's reasons")
        return process, world.loop.spawn(process, self._run(name), name)

    @staticmethod
    async def _wait(process: Process, task: asyncio.Task[Any]) -> None:
        while not task.done() and process.alive:
            await asyncio.sleep(0.25)

    def _chosen(self) -> set[tuple[int, int]]:
        """The page's choice: every committed DLQ record of the plan's reasons, by the broker model."""
        world = self.world
        plan = world.scenario.redrive
        reasons = plan.reasons if plan is not None else frozenset()
        chosen = set()
        for log in world.broker.topics[world.topology.topics.dlq].partitions:
            for record in log.committed_records():
                if orjson.loads(record.value).get("reason") in reasons:
                    chosen.add((log.partition, record.offset))
        return chosen

    async def _run(self, name: str) -> None:
        world = self.world
        topology = world.topology
        dlq = topology.topics.dlq
        history = History(BOOTSTRAP, topology)
        outcome = "nothing to redrive"
        try:
            chosen = self._chosen()
            rows = [row_of(e, dlq, EventTypes(topology)) async for e in read_records(BOOTSTRAP, dlq, chosen)]
            if len(rows) != len(
                chosen
            ):  # the model's DLQ deletes nothing: a short read was taken for the end
                world.problems.append(
                    f"{name}'s page read {len(rows)} of the {len(chosen)} DLQ records it chose, and said nothing"
                )
            if rows:
                run = await Redrives(BOOTSTRAP, topology, history).run(
                    rows, OPERATOR, "sim", f"{len(rows)} selected"
                )
                outcome = f"{run.state}: {dict(Counter(r.state for r in run.records.values()))} {run.error}"
                self._check(name, run)
        except (PipelineError, KafkaError) as exc:  # the page: 503, one line
            outcome = f"503: {exc!r}"
        except Exception as exc:  # a traceback, not a page
            outcome = f"crashed: {exc!r}"
            world.problems.append(f"{name}: a console redrive failed with {exc!r}, not a 503 page")
        finally:
            try:
                await history.close()
            except (KafkaError, OSError) as exc:
                world.note(f"{name}: its history client did not close cleanly: {exc!r}")
        world.note(f"{name} ended: {outcome[:300]}")

    def _check(self, name: str, run: Run) -> None:
        world = self.world
        dlq = world.topology.topics.dlq
        landed = self._landed()
        logs = {log.partition: log for log in world.broker.topics[dlq].partitions}
        for record in run.records.values():
            where = f"{dlq}:{record.partition}:{record.offset}"
            if record.state == "sent" and where not in landed:
                world.problems.append(
                    f"{name}'s history says it sent {where}, but no record replayed from it is in Kafka"
                )
                return
            if run.state != "sent":
                continue
            log = logs.get(record.partition)
            held = log is not None and log.log_start <= record.offset
            if record.state == "planned" or (record.skip.startswith(GONE) and held):
                world.problems.append(
                    f"{name} ended sent but left {where} {record.state} ({record.skip or 'never read'}) while the DLQ "
                    "holds it: a read stopped short of its end"
                )
                return
