"""The workers of a seed's world, as processes on their machines: started, crashed, stopped, restarted.

A :class:`Slot` is one worker machine (a state dir that outlives the processes run on it, its clock);
the :class:`Fleet` starts a worker process on it (the real ``Worker`` with the world's I/O), restarts
it as a supervisor would when it exits while wanted, and holds every exit for the oracle: a worker
that exits on its own (but at start with the broker down, or pushed out by a twin under its instance
id) is a problem. SIGKILL, SIGTERM, a rolling restart and a twin are the fleet's; when each happens is
the faults' (``tests/simulation/injector.py``) and the operator's (``operators.py``).
"""

from __future__ import annotations

import asyncio
import contextvars
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.errors import BrokerUnavailableError, InstanceIdTakenError
from pipeline.worker.clients import worker_consumer
from pipeline.worker.io import kafka_io
from pipeline.worker.loop import Worker
from pipeline.worker.settings import WorkerSettings
from tests.simulation import handlers, wire
from tests.simulation.faults import Fault, SimStore
from tests.simulation.loop import CURRENT, Process
from tests.simulation.scenario import GROUP

if TYPE_CHECKING:
    from tests.simulation.world import World

STOP_LIMIT_S = 60.0  # the longest a worker may take to stop when asked
RESTART_BACKOFF_S = 1.0
TWIN_GRACE_S = 15.0  # after a twin stops, how long its worker may still be pushed out by it (a session)
# how a worker that shares its instance id with a twin may stop: pushed out of the group, or fenced again and
# again by the twin's producer (FenceCount, pipeline/worker/identity.py), each with a line naming the cause
TWIN_EXITS = (InstanceIdTakenError.__name__, "another process uses transactional id")


@dataclass
class Slot:
    """One worker 'machine': a state dir that outlives the processes run on it."""

    index: int
    state_dir: Path
    wanted: bool = True
    process: Process | None = None
    worker: Worker | None = None
    task: asyncio.Task[Any] | None = None
    incarnations: int = 0
    exits: list[str] = field(default_factory=list)
    clock_offset: float = 0.0  # how far this machine's wall clock is off (seconds): a clock jump
    stops: int = 0  # each stop counts: a rolling restart starts the worker again only if none came after it

    @property
    def name(self) -> str:
        return f"w{self.index}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.alive


class Fleet:
    """The worker processes of a world, on its slots (see the module)."""

    def __init__(self, world: World, slots: list[Slot]) -> None:
        self.world = world
        self.slots = slots
        self._crash_in: dict[Process, int] = {}
        self.twins = 0  # second processes started under a worker's instance id (the twin fault)
        self.twin_until: dict[int, float] = {}  # slot index -> until when a twin may push its worker out
        self.twin_processes: list[tuple[Process, Worker]] = []

    def add(self) -> Slot:
        """A new machine, its worker started (a worker joins the group)."""
        slot = Slot(len(self.slots), self.world.root / f"w{len(self.slots)}")
        self.slots.append(slot)
        self.start(slot)
        return slot

    def settings(self, slot: Slot) -> WorkerSettings:
        """The settings a worker on ``slot`` starts with (the scenario's, over the simulated network)."""
        return WorkerSettings(
            bootstrap=f"{wire.HOST}:{wire.PORT}",
            topology=self.world.topology_path,
            state_dir=slot.state_dir,
            group=GROUP,
            instance_id=slot.name if self.world.scenario.static else None,
            **self.world.scenario.settings,
        )

    def start(self, slot: Slot) -> None:
        """A worker process on ``slot``, unless one runs there, none is wanted, or the operator holds them."""
        if (
            slot.running or not slot.wanted or self.world.operators.holding
        ):  # started when the downtime or rescale ends
            return
        slot.incarnations += 1
        process = Process(f"{slot.name}.{slot.incarnations}")
        slot.process = process
        worker = self._worker(slot, self.settings(slot), process)
        slot.worker = worker
        self.world.note(f"{process.name} starts")
        slot.task = self.world.loop.spawn(process, self._incarnation(slot, process, worker), process.name)

    def _worker(self, slot: Slot, settings: WorkerSettings, process: Process) -> Worker:
        """A worker of ``slot``'s machine (its clock) with ``settings``, run as ``process``."""
        io = replace(
            kafka_io(open_store=SimStore.open),
            consumer=self._consumer_of(worker_consumer),
            wall=lambda: self.world.loop.wall() + slot.clock_offset,
        )
        classifier = handlers.faulty(fixed=self.world.handler_fixed)
        worker = Worker(settings, self.world.topology, io=io, classifier=classifier)
        process.on_crash.append(worker._dir_lock.release)  # the OS drops a dead process's locks
        return worker

    async def _incarnation(self, slot: Slot, process: Process, worker: Worker) -> None:
        """One process of ``slot``'s worker, start to exit; started again after a backoff while wanted."""
        outcome = "exit 0"
        started = False
        try:
            await worker.start()
            started = True
            await worker.run()
        except BrokerUnavailableError as exc:
            outcome = f"exit 1: {exc!r}"[:400]
            if not started:  # started while the broker was down: a supervisor starts it again
                outcome = "exit 1 at start: the broker is down"
        except Exception as exc:
            outcome = f"exit 1: {exc!r}"[:400]
        except asyncio.CancelledError as exc:  # nothing cancels a worker from outside: it escaped from inside
            tb = exc.__traceback__
            where = []
            while tb is not None:
                code = tb.tb_frame.f_code
                where.append(f"{code.co_name}@{code.co_filename.rsplit('/', 1)[-1]}:{tb.tb_lineno}")
                tb = tb.tb_next
            outcome = f"exit 1: CancelledError escaped ({' > '.join(where)})"
        self.world.note(f"{process.name} ended: {outcome}")
        slot.exits.append(outcome)
        if outcome == "exit 1 at start: the broker is down":
            pass
        elif _twin_exit(outcome) and self.world.loop.time() <= self.twin_until.get(slot.index, -1.0):
            pass  # a twin under its instance id pushed it out: it stops, and is started again
        elif outcome != "exit 0" or slot.wanted:
            self.world.problems.append(f"{process.name} exited on its own: {outcome}")
        self.world.loop.crash(process)  # the process is over: whatever it left pending never runs
        if slot.process is process:
            slot.process = None
            if slot.wanted:
                self.world.loop.call_later(RESTART_BACKOFF_S, self.start, slot, context=_fresh_context())

    def crash_after(self, process: Process, steps: int) -> None:
        """SIGKILL ``process`` once it has taken ``steps`` more steps of the loop (a crash mid-operation)."""
        self._crash_in[process] = steps

    def before_step(self, process: Process) -> None:
        """The loop's hook before each step of ``process``: the crash :meth:`crash_after` armed, when due."""
        left = self._crash_in.get(process)
        if left is None:
            return
        if left <= 0:
            del self._crash_in[process]
            self.crash(process)
        else:
            self._crash_in[process] = left - 1

    def crash(self, process: Process) -> None:
        """SIGKILL: the process stops where it is; what it left pending never runs."""
        if not process.alive:
            return
        self.world.note(f"{process.name} SIGKILL")
        self.world.loop.crash(process)

    async def stop_workers(self, *, kill: bool = False) -> list[Slot]:
        """Every wanted worker down (SIGTERM, and SIGKILL if it does not stop; or SIGKILL at once); the slots."""
        down = [slot for slot in self.slots if slot.wanted]
        for slot in down:
            slot.wanted = False
            slot.stops += 1
            process = slot.process
            if process is None or not process.alive:
                continue
            if kill:
                self.crash(process)
                slot.process = None
            elif slot.worker is not None:
                slot.worker.stop()
                self.world.note(f"{process.name} SIGTERM")
        processes = [s.process for s in down if s.process is not None and s.process.alive]
        await self.stopped(*processes, limit=STOP_LIMIT_S)
        for process in processes:
            if process.alive:
                self.world.problems.append(
                    f"{process.name} did not stop within {STOP_LIMIT_S:.0f}s of SIGTERM"
                )
                self.crash(process)
        return down

    async def leave(self, slot: Slot, process: Process, duration: float) -> None:
        """SIGTERM, and a start again ``duration`` later once it has stopped (a rolling restart); unless another
        stop came meanwhile, which then owns the start (two restarts at once, or a rescale stopping every worker
        as this one ends: seed 60247 of the redrive mix)."""
        slot.wanted = False
        slot.stops += 1
        mine = slot.stops
        if slot.worker is not None:
            slot.worker.stop()
        self.world.note(f"{process.name} SIGTERM")
        await asyncio.sleep(duration)
        if process.alive:  # still stopping: it commits what is open, once the broker answers
            await self.stopped(process, limit=STOP_LIMIT_S)
            if process.alive:
                self.world.problems.append(
                    f"{process.name} did not stop within {STOP_LIMIT_S:.0f}s of SIGTERM (with the broker up)"
                )
                self.world.problems.extend(self.world.loop.stacks(process)[:12])
                self.crash(process)
        if slot.stops != mine:
            return
        slot.wanted = True
        self.start(slot)

    async def restart_later(self, slot: Slot, process: Process, delay: float) -> None:
        """After ``process`` was killed: ``slot``'s worker started again ``delay`` seconds later, if still wanted."""
        if slot.process is process:
            slot.process = None
        await asyncio.sleep(delay)
        if slot.wanted and not slot.running:
            self.start(slot)

    async def stopped(self, *processes: Process, limit: float) -> None:
        """Wait until none of ``processes`` runs, for ``limit`` seconds of the broker being up at most (a stop
        commits what is open, which waits for the broker)."""
        left = limit
        while any(p.alive for p in processes) and left > 0:
            await asyncio.sleep(0.25)
            if not self.world.broker.down:
                left -= 0.25

    async def stop_all(self) -> None:
        """SIGTERM to every worker and twin as the run ends; a problem if any has not stopped in time."""
        twins = [process for process, _ in self.twin_processes if process.alive]
        for process, worker in self.twin_processes:
            if process.alive:
                worker.stop()
        running = [s for s in self.slots if s.running]
        for slot in running:
            slot.wanted = False
            slot.stops += 1
            if slot.worker is not None:
                slot.worker.stop()
        await self.stopped(*(s.process for s in running if s.process is not None), *twins, limit=STOP_LIMIT_S)
        names = [s.process.name for s in running if s.running and s.process is not None]
        names += [p.name for p in twins if p.alive]
        if names:
            self.world.problems.append(f"workers did not stop within {STOP_LIMIT_S:.0f}s: {names}")
            for slot in running:
                if slot.running and slot.process is not None:
                    self.world.problems.extend(self.world.loop.stacks(slot.process)[:12])

    def _consumer_of(self, real: Any) -> Any:
        """The worker's consumer, but for the slots on older code: aiokafka's roundrobin assignor alone, what
        workers before standbys offer (their metadata carries no stores; they ignore standby assignments)."""

        def consumer(settings: WorkerSettings, *, assignor: Any = None) -> Any:
            process = CURRENT.get()
            if process is not None and process.name.split(".")[0] in self.world.scenario.older:
                assignor = None
            return real(settings, assignor=assignor)

        return consumer

    async def twin(self, slot: Slot, fault: Fault) -> None:
        """A second process under ``slot``'s instance id (its own state dir) for ``fault.duration`` seconds:
        the group takes it in the running worker's place (KIP-345), whose producer it fences too. The one
        pushed out must stop with InstanceIdTakenError (the slot's worker is then started again, as a
        supervisor would, and pushes the twin out in turn); any other exit of the twin is a problem."""
        if not self.world.scenario.static or not slot.running:
            return
        self.twins += 1
        process = Process(f"{slot.name}.twin{self.twins}")
        settings = replace(
            self.settings(slot), state_dir=slot.state_dir.parent / f"{slot.name}-twin{self.twins}"
        )
        worker = self._worker(slot, settings, process)
        self.twin_until[slot.index] = self.world.loop.time() + fault.duration + TWIN_GRACE_S
        self.twin_processes.append((process, worker))
        self.world.note(f"{process.name} starts under {slot.name}'s instance id, for {fault.duration:.1f}s")
        self.world.loop.spawn(process, self._twin_run(process, worker, fault.duration), process.name)

    async def _twin_run(self, process: Process, worker: Worker, duration: float) -> None:
        outcome = "exit 0"
        started = False
        try:
            await worker.start()
            started = True
            run = asyncio.ensure_future(worker.run())
            done, _ = await asyncio.wait({run}, timeout=duration)
            if not done:
                worker.stop()
                self.world.note(f"{process.name} SIGTERM")
            await run
        except BrokerUnavailableError as exc:
            outcome = "exit 1 at start: the broker is down" if not started else f"exit 1: {exc!r}"[:400]
        except Exception as exc:
            outcome = f"exit 1: {exc!r}"[:400]
        self.world.note(f"{process.name} ended: {outcome}")
        if outcome not in ("exit 0", "exit 1 at start: the broker is down") and not _twin_exit(outcome):
            self.world.problems.append(f"{process.name} exited on its own: {outcome}")
        self.world.loop.crash(process)

    def release(self) -> None:
        """Crash every process still alive as the run ends: what it holds open (stores, locks) is closed."""
        for slot in self.slots:
            if slot.process is not None and slot.process.alive:
                self.world.loop.crash(slot.process)
        for process, _ in self.twin_processes:
            if process.alive:
                self.world.loop.crash(process)


def _twin_exit(outcome: str) -> bool:
    """Whether a worker's exit is one a twin under its instance id may cause (:data:`TWIN_EXITS`)."""
    return any(reason in outcome for reason in TWIN_EXITS)


def _fresh_context() -> contextvars.Context:
    """A context of no process: what the loop calls in it belongs to the world, not to the one that ended."""
    return contextvars.Context()
