"""One seed's world: the broker model, the workers as processes, the workload, the faults, the verdict.

:func:`run_seed` is the whole of it: a seed draws a :class:`Scenario` (partitions,
workers, settings, topology, broker flavour, workload, faults); the world runs it on
the deterministic loop until every record is handled and committed, stops the
workers, and asks the oracle. The same seed gives the same run, trace and verdict.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import shutil
import tempfile
import uuid
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from random import Random
from typing import Any

from aiokafka import TopicPartition
from aiokafka.coordinator.protocol import ConsumerProtocol

from pipeline import topology as topology_module
from pipeline.errors import BrokerUnavailableError, InstanceIdTakenError, StoreLockedError
from pipeline.kafka.admin import redrive_history_spec, topic_specs
from pipeline.kafka.partitioner import owner_partition
from pipeline.state import directory
from pipeline.state.store import bucket_width
from pipeline.state.store_meta import StoreIdentity
from pipeline.topology_model import Expiry
from pipeline.worker.clients import worker_consumer
from pipeline.worker.io import kafka_io
from pipeline.worker.loop import Worker
from pipeline.worker.settings import WorkerSettings
from tests.simulation import broker as b
from tests.simulation import faults as fault_module
from tests.simulation import handlers, oracle, redrive, timeline, warmth, wire
from tests.simulation.claims import ClaimCheck
from tests.simulation.faults import (
    RECONFIGURE,
    RESCALE,
    REVOKE_MID_OPEN,
    DiskFaults,
    Fault,
    SimStore,
    StoreLedger,
)
from tests.simulation.loop import CURRENT, LivelockError, Process, ProcessState, SimLoop, virtual_time
from tests.simulation.operators import Operators
from tests.simulation.records import decode_produced, plain_batch
from tests.simulation.rereads import RereadCheck
from tests.simulation.scenario import APP, CHANGELOG_LIMIT, GROUP, Scenario
from tests.simulation.stale import StaleCheck

SETTLE_LIMIT_S = 900.0  # after the schedule, the longest the workers may take to catch up
STOP_LIMIT_S = 60.0  # the longest a worker may take to stop when asked
TXNS_END_LIMIT_S = 120.0  # for the coordinator to abort what a stopped zombie left open (timeout + its scan)
OPEN_TXN_STATES = frozenset({"ongoing", "prepare_commit", "prepare_abort"})
RESTART_BACKOFF_S = 1.0
TWIN_GRACE_S = 15.0  # after a twin stops, how long its worker may still be pushed out by it (a session)
# how a worker that shares its instance id with a twin may stop: pushed out of the group, or fenced again and
# again by the twin's producer (FenceCount, pipeline/worker/identity.py), each with a line naming the cause
TWIN_EXITS = (InstanceIdTakenError.__name__, "another process uses transactional id")
CHANGELOG_SEGMENT_BYTES = 2048  # small segments, so that retention has whole segments to delete


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


@dataclass
class Result:
    seed: int
    mix: str
    ok: bool
    problems: list[str]
    trace: list[str]
    scenario: str
    virtual_s: float
    steps: int
    counts: dict[str, int]

    def report(self, *, trace_lines: int = 200) -> str:
        head = (
            f"seed {self.seed} ({self.mix} mix): {'PASS' if self.ok else 'FAIL'} "
            f"({self.virtual_s:.0f}s virtual, {self.steps} steps)"
        )
        parts = [head, self.scenario]
        if not self.ok:
            parts.append("problems:\n  " + "\n  ".join(self.problems))
            parts.append(f"trace (last {trace_lines} lines):\n" + "\n".join(self.trace[-trace_lines:]))
            parts.append(
                f"replay: pytest tests/simulation --mix {self.mix} --seed {self.seed}  "
                f"(or python -m tests.simulation.run --mix {self.mix} --seed {self.seed} --trace)"
            )
        return "\n".join(parts)


class _TraceHandler(logging.Handler):
    def __init__(self, world: World) -> None:
        super().__init__(logging.INFO)
        self.world = world

    def emit(self, record: logging.LogRecord) -> None:
        process = CURRENT.get()
        who = process.name if process is not None else "world"
        try:
            message = record.getMessage()
        except Exception:
            message = str(record.msg)
        if record.exc_info and record.levelno >= logging.ERROR:
            import traceback  # noqa: PLC0415

            lines = traceback.format_exception(*record.exc_info)
            message += " | " + " ".join(line.strip() for line in lines[-30:])
        message = message.replace(str(self.world.root), "<state>")
        name = record.name.removeprefix("pipeline.")
        self.world.note(f"{who} {record.levelname[0]} {name}: {message}")
        if record.exc_info and record.levelno >= logging.ERROR and record.name.startswith("pipeline."):
            self.world.unexpected(who, f"{who} logged an unexpected error in {name}: {message[:600]}")
        elif NO_IDENTITY in message:  # a worker writes a store's identity as it creates it: never legitimate
            self.world.unexpected(who, f"{who} found a store it wrote without its identity: {message[:600]}")


NO_IDENTITY = "has data but no identity"  # pipeline.state.store_meta: a store the world never plants
UNEXPECTED_KEPT = 3  # of one process's unexpected errors, the first few are problems
STEPS = 400_000  # callbacks a run may take before it counts as a livelock
STEPS_PER_OUTAGE_S = 4_000  # and more per second of broker outage, where every client retries all along
# and more with a worker on older code: as leader without the input in its metadata (after an outage) it
# assigns nothing until aiokafka's metadata max age (300 s) makes it rejoin (poison seed 14011: 470k steps)
STEPS_OLDER = 300_000


def step_budget(scenario: Scenario) -> int:
    """The callbacks a run of ``scenario`` may take: a livelock spins past it; a long outage with many
    clients retrying is work (seed 1359: a 92 s outage, four workers with two standbys each, took 424k)."""
    outage = sum(f.duration for f in scenario.faults if f.kind == "outage")
    outage += sum(
        f.steps for f in scenario.faults if f.kind in (redrive.REPLAY, redrive.CONSOLE)
    )  # cut as one reads
    outage += sum(f.duration for f in scenario.faults if f.kind == RESCALE)  # cut off as a rescale reads
    return STEPS + int(STEPS_PER_OUTAGE_S * outage) + (STEPS_OLDER if scenario.older else 0)


def virtual_bound(scenario: Scenario) -> float:
    """The virtual seconds a run of ``scenario`` may last: a silent downtime alone is longer than a day."""
    time = scenario.time
    silent = time.downtime.duration if time is not None and time.silent and time.downtime else 0.0
    return 100_000.0 + silent


class World:
    def __init__(self, scenario: Scenario, root: Path) -> None:
        self.scenario = scenario
        self.root = root
        self.rng = Random(scenario.seed ^ 0x5EED)
        # typeshed declares every AbstractEventLoop method abstract; at run time they raise
        # NotImplementedError, and SimLoop implements the ones asyncio and aiokafka call
        self.loop = SimLoop(max_time=virtual_bound(scenario), max_steps=step_budget(scenario))  # type: ignore[abstract]
        self.trace: deque[str] = deque(maxlen=4000)
        self.broker = b.Broker(self.loop, Random(self.rng.getrandbits(64)), self.note)
        self.network = wire.Network(self.broker, Random(self.rng.getrandbits(64)))
        self.disk = DiskFaults()
        self.ledger = StoreLedger()  # what each store on the disks holds (the claims' truth)
        self.claims = ClaimCheck(self, self.ledger)
        self.stale = StaleCheck(self)  # a store wiped as stale must be beyond its changelog's end
        self.rereads = RereadCheck(self)  # a commit refused for size makes the worker read the limits again
        self.topology_path = root / "topology.toml"
        self.use_topology(fixed=False)
        self.partitions_now = scenario.partitions  # the input's partition count (a rescale raises it)
        self.operators = Operators(self)
        self.slots = [Slot(i, root / f"w{i}") for i in range(scenario.workers)]
        self.problems: list[str] = []
        self.foreign_stores: set[tuple[int, TopicPartition]] = set()  # (slot, partition): another cluster's
        self._unexpected: Counter[str] = Counter()
        self.produced = 0
        self.loop.before_step = self._before_step
        self._crash_in: dict[Process, int] = {}
        self.twins = 0  # second processes started under a worker's instance id (the twin fault)
        self.twin_until: dict[int, float] = {}  # slot index -> until when a twin may push its worker out
        self.twin_processes: list[tuple[Process, Worker]] = []

    def use_topology(self, *, fixed: bool) -> None:
        """Write and load the topology the workers started from now on run (``fixed``: a redrive's fix made)."""
        self.topology_path.write_text(self.scenario.topology_text(fixed=fixed))
        self.topology = topology_module.load(self.topology_path)
        self.handler_fixed = fixed  # and the handler of tests/simulation/handlers.py deployed fixed

    def consumed_topics(self) -> list[str]:
        """The topics the workers consume: the input, and the effects topic with effect routes."""
        topics = self.topology.topics
        return [topics.input] + ([topics.effects] if self.scenario.effects else [])

    def changelog_of(self) -> dict[str, str]:
        """Each consumed topic's changelog."""
        topics = self.topology.topics
        return {topics.input: topics.changelog} | (
            {topics.effects: topics.effects_changelog} if self.scenario.effects else {}
        )

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
                self._crash(process)
                slot.process = None
            elif slot.worker is not None:
                slot.worker.stop()
                self.note(f"{process.name} SIGTERM")
        processes = [s.process for s in down if s.process is not None and s.process.alive]
        await self._stopped(*processes, limit=STOP_LIMIT_S)
        for process in processes:
            if process.alive:
                self.problems.append(f"{process.name} did not stop within {STOP_LIMIT_S:.0f}s of SIGTERM")
                self._crash(process)
        return down

    async def restart(self, slot: Slot, process: Process, delay: float) -> None:
        """SIGTERM ``slot``'s worker and start it again ``delay`` seconds later (a rolling restart)."""
        await self._leave(slot, process, delay)

    async def outage(self, seconds: float) -> None:
        """The broker down for ``seconds`` (overlapping outages: it comes back as the first ends)."""
        self.network.outage()
        await asyncio.sleep(seconds)
        self.network.recover()
        self.note("broker back")

    async def _watch_ownership(self) -> None:
        """Every partition is served only where the group assigns it: once a generation has been stable a
        moment, no member serves a partition the group gave another (a worker that kept one through a
        rebalance would handle its records beside their owner)."""
        while True:  # every quarter second while a worker runs (and every 5 s through a downtime of hours)
            await asyncio.sleep(0.25 if any(slot.running for slot in self.slots) else 5.0)
            group = self.broker.group(GROUP)
            if group.state != "stable" or self.loop.time() - group.stable_since < 1.0:
                continue
            for member in group.members.values():
                slot = next((s for s in self.slots if s.process is member.process and s.running), None)
                if slot is None or slot.worker is None or not member.assignment:
                    continue
                assigned = set(ConsumerProtocol.ASSIGNMENT.decode(member.assignment).partitions())
                for tp, task in slot.worker.tasks.items():
                    if task.serving and tp not in assigned:
                        problem = (
                            f"{member.process.name} serves {tp.topic}-{tp.partition}, which generation "
                            f"{group.generation} does not assign it"
                        )
                        if problem not in self.problems:
                            self.problems.append(problem)

    def unexpected(self, who: str, problem: str) -> None:
        """A worker logged an error with its traceback: the code's catch-all for a bug (a standby's round
        that raised what no retry is for). The worker lives on, so no exit and no count shows it: the run
        fails on the log line itself (each process's first few, not every retry's)."""
        self._unexpected[who] += 1
        if self._unexpected[who] <= UNEXPECTED_KEPT:
            self.problems.append(problem)

    def note(self, line: str) -> None:
        # a worker's transactional id hashes its (temporary) state dir: the trace names it by its slot
        for slot in self.slots:
            if slot.worker is not None and slot.worker.transactional_id in line:
                line = line.replace(slot.worker.transactional_id, f"<{slot.name}'s transactional id>")
        self.trace.append(f"{self.loop.time():9.3f} {line}")

    # -- running ----------------------------------------------------------------------------
    def run(self) -> Result:
        handler = _TraceHandler(self)
        root_logger = logging.getLogger()
        saved_level = root_logger.level
        root_logger.addHandler(handler)
        root_logger.setLevel(logging.INFO)
        logging.getLogger("aiokafka").setLevel(logging.WARNING)
        SimStore.faults = self.disk
        SimStore.ledger = self.ledger
        random.seed(
            self.scenario.seed
        )  # aiokafka shuffles with the module's generator (fetches, node choice)
        asyncio.set_event_loop(self.loop)
        try:
            with (
                virtual_time(self.loop),
                wire.installed(self.network),
                self.claims.installed(),
                self.stale.installed(),
                self.rereads.installed(),
            ):
                try:
                    self.loop.run_until_complete(self._main())
                except LivelockError as exc:
                    self.problems.append(f"livelock: {exc}")
                    self.problems.extend(self._diagnose())
            self.problems.extend(self.claims.problems)
            self.problems.extend(self.stale.problems)
            self.problems.extend(self.rereads.problems)
        finally:
            SimStore.faults = None
            SimStore.ledger = None
            root_logger.removeHandler(handler)
            root_logger.setLevel(saved_level)
            asyncio.set_event_loop(None)
            self._release()
        return Result(
            seed=self.scenario.seed,
            mix=self.scenario.mix,
            ok=not self.problems,
            problems=self.problems,
            trace=list(self.trace),
            scenario=self.scenario.describe(),
            virtual_s=self.loop.time(),
            steps=self.loop.steps,
            counts=self.counts,
        )

    def _txn_of_partition(self, partition: int) -> str | None:
        """The transactional id of the worker the stable group assigns input ``partition`` to (None: none now)."""
        owner = self._owner_of(f"{APP}-{GROUP}-{self.topology.topics.input}-{partition}")
        slot = next((s for s in self.slots if s.process is not None and s.process is owner), None)
        if slot is None or slot.worker is None:
            self.note(f"no worker serves partition {partition} now: the fault has no producer to hit")
            return None
        return slot.worker.transactional_id

    async def _bisecting(self, wait: float = 15.0) -> str | None:
        """The transactional id of a worker bisecting a partition's refused records, once one does (within
        ``wait`` seconds; None if none did): a one-off refusal aimed at a record being judged alone."""
        deadline = self.loop.time() + wait
        while self.loop.time() < deadline:
            for slot in self.slots:
                worker = slot.worker if slot.running else None
                if worker is not None and any(t.poison.limit is not None for t in worker.tasks.values()):
                    self.note(f"{slot.name} is bisecting: the corrupt fault aims at its producer")
                    return worker.transactional_id
            await asyncio.sleep(0.05)
        return None

    def _owner_of(self, txn_id: str) -> Process | None:
        """The process the stable group assigns ``txn_id``'s partition to (None while it rebalances)."""
        group = self.broker.group(GROUP)
        if group.state != "stable":
            return None
        topic, _, partition = txn_id.removeprefix(f"{APP}-{GROUP}-").rpartition("-")
        for member in group.members.values():
            if not member.assignment:
                continue
            assigned = ConsumerProtocol.ASSIGNMENT.decode(member.assignment).partitions()
            if TopicPartition(topic, int(partition)) in assigned:
                return member.process  # type: ignore[no-any-return]
        return None

    def _consumer_of(self, real: Any) -> Any:
        """The worker's consumer, but for the slots on older code: aiokafka's roundrobin assignor alone, what
        workers before standbys offer (their metadata carries no stores; they ignore standby assignments)."""

        def consumer(settings: WorkerSettings, *, assignor: Any = None) -> Any:
            process = CURRENT.get()
            if process is not None and process.name.split(".")[0] in self.scenario.older:
                assignor = None
            return real(settings, assignor=assignor)

        return consumer

    def _release(self) -> None:
        """Close what the run left open (stores of processes still alive), then drop the loop."""
        for slot in self.slots:
            if slot.process is not None and slot.process.alive:
                self.loop.crash(slot.process)
        for process, _ in self.twin_processes:
            if process.alive:
                self.loop.crash(process)
        self.loop.close()
        self.loop.tasks.clear()

    counts: dict[str, int] = {}  # noqa: RUF012

    async def _main(self) -> None:
        self.broker.start()
        self._create_topics()
        for slot in self.slots:
            self.start(slot)
        producer = self.loop.spawn(None, self._produce(), "workload")
        injector = self.loop.spawn(None, self._inject(), "faults")
        self.loop.spawn(None, self._watch_ownership(), "ownership")
        await producer
        await injector
        settled = await self._settle()
        if not settled:
            return
        if self.scenario.redrive is not None:  # what is left in the DLQ of the fixed causes goes through
            if not self.operators.fixed:
                await self.operators.fix()
            await self.operators.last_replay()
            if not await self._settle():
                return
        self.problems.extend(await warmth.standbys_warm(self))
        await self._stop_all()
        await self._transactions_ended()
        if self.problems:
            return
        verdict = oracle.check(self.broker, self.oracle_facts())
        self.counts = {**verdict.counts, "claims": self.claims.claims, "stale": self.stale.stale}
        self.problems.extend(verdict.problems)
        self.problems.extend(self.broker.owner_violations[:5])
        self.problems.extend(self.network.errors[:5])
        for topic in self.broker.topics.values():
            if topic.size_refusals and not topic.reconfigured:
                self.problems.append(
                    f"the broker refused {topic.size_refusals} batches to {topic.name} as larger than its "
                    f"max.message.bytes ({topic.config.max_message_bytes}), which the workers read at start"
                )

    def oracle_facts(self) -> oracle.Facts:
        """What the oracle needs beyond the broker's logs."""
        scenario, topics = self.scenario, self.topology.topics
        offsets = scenario.time.offsets() if scenario.time is not None else (0.0, 0.0)
        operators = self.operators
        last = operators.runs[-1] if operators.runs else None
        cause_keys: set[str] = set()
        if scenario.redrive is not None and last is not None and last.outcome.startswith("exit 0"):
            cause_keys = {d.event_key for d in scenario.workload.deliveries if d.cause is not None}
        return oracle.Facts(
            deliveries=scenario.workload.deliveries,
            input=topics.input,
            effects=topics.effects if scenario.effects else None,
            audit=topics.audit,
            dlq=topics.dlq,
            changelogs=[topics.changelog] + ([topics.effects_changelog] if scenario.effects else []),
            command_topics=self.topology.command_topics(),
            group=GROUP,
            ttl_ms={
                name: int(source.ttl.total_seconds() * 1000) for name, source in self.topology.sources.items()
            },
            sliding=frozenset(
                name for name, source in self.topology.sources.items() if source.expiry is Expiry.SLIDING
            ),
            width=directory.topology_bucket_ms(self.topology),
            skew=int(self.settings(self.slots[0]).max_clock_skew * 1000),
            offsets=(int(offsets[0] * 1000), int(offsets[1] * 1000)),
            refusals=scenario.refusals,
            boundaries=[boundary.committed for boundary in operators.boundaries],
            cause_keys=cause_keys,
        )

    def _create_topics(self) -> None:
        scenario = self.scenario
        for spec in topic_specs(self.topology):
            config = b.TopicConfig()
            if scenario.flavor == "4.x":
                config.timestamp_after_max_ms = 3_600_000  # Kafka 4's default
            raw = spec.configs
            if "max.message.bytes" in raw:
                config.max_message_bytes = int(raw["max.message.bytes"])
            if "message.timestamp.after.max.ms" in raw:
                config.timestamp_after_max_ms = int(raw["message.timestamp.after.max.ms"])
            if "message.timestamp.before.max.ms" in raw:
                config.timestamp_before_max_ms = int(raw["message.timestamp.before.max.ms"])
            if scenario.small_limits and spec.name != self.topology.topics.input:
                config.max_message_bytes = 4096
            if scenario.mix != "classic" and "retention.ms" in raw:  # the changelogs: deleted by time
                config.cleanup_policy = raw.get("cleanup.policy", "delete")
                config.retention_ms = int(raw["retention.ms"])
                config.segment_bytes = CHANGELOG_SEGMENT_BYTES
                if scenario.time is not None and scenario.time.log_append_time:
                    config.timestamp_type = b.LOG_APPEND_TIME
            if scenario.small_changelogs and "retention.ms" in raw:
                config.max_message_bytes = CHANGELOG_LIMIT
            if (
                scenario.redrive is not None
                and redrive.SIZE in scenario.redrive.causes
                and spec.name == self.topology.topics.commands
            ):
                config.max_message_bytes = min(config.max_message_bytes, redrive.COMMAND_LIMIT)
            self.broker.create_topic(spec.name, spec.partitions, config)
        if any(
            f.kind == redrive.CONSOLE for f in scenario.faults
        ):  # the console's history (it never creates it
            history = redrive_history_spec(self.topology)  # here: the model answers no CreateTopics)
            self.broker.create_topic(history.name, 1, b.TopicConfig(cleanup_policy="compact"))

    # -- workers ----------------------------------------------------------------------------
    def settings(self, slot: Slot) -> WorkerSettings:
        return WorkerSettings(
            bootstrap=f"{wire.HOST}:{wire.PORT}",
            topology=self.topology_path,
            state_dir=slot.state_dir,
            group=GROUP,
            instance_id=slot.name if self.scenario.static else None,
            **self.scenario.settings,
        )

    def start(self, slot: Slot) -> None:
        if (
            slot.running or not slot.wanted or self.operators.holding
        ):  # started when the downtime or rescale ends
            return
        slot.incarnations += 1
        process = Process(f"{slot.name}.{slot.incarnations}")
        slot.process = process
        worker = self._worker(slot, self.settings(slot), process)
        slot.worker = worker
        self.note(f"{process.name} starts")
        slot.task = self.loop.spawn(process, self._incarnation(slot, process, worker), process.name)

    def _worker(self, slot: Slot, settings: WorkerSettings, process: Process) -> Worker:
        """A worker of ``slot``'s machine (its clock) with ``settings``, run as ``process``."""
        io = replace(
            kafka_io(open_store=SimStore.open),
            consumer=self._consumer_of(worker_consumer),
            wall=lambda: self.loop.wall() + slot.clock_offset,
        )
        classifier = handlers.faulty(fixed=self.handler_fixed)
        worker = Worker(settings, self.topology, io=io, classifier=classifier)
        process.on_crash.append(worker._dir_lock.release)  # the OS drops a dead process's locks
        return worker

    async def _incarnation(self, slot: Slot, process: Process, worker: Worker) -> None:
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
        self.note(f"{process.name} ended: {outcome}")
        slot.exits.append(outcome)
        if outcome == "exit 1 at start: the broker is down":
            pass
        elif _twin_exit(outcome) and self.loop.time() <= self.twin_until.get(slot.index, -1.0):
            pass  # a twin under its instance id pushed it out: it stops, and is started again
        elif outcome != "exit 0" or slot.wanted:
            self.problems.append(f"{process.name} exited on its own: {outcome}")
        self.loop.crash(process)  # the process is over: whatever it left pending never runs
        if slot.process is process:
            slot.process = None
            if slot.wanted:
                self.loop.call_later(RESTART_BACKOFF_S, self.start, slot, context=_world())

    def _before_step(self, process: Process) -> None:
        left = self._crash_in.get(process)
        if left is None:
            return
        if left <= 0:
            del self._crash_in[process]
            self._crash(process)
        else:
            self._crash_in[process] = left - 1

    def _crash(self, process: Process) -> None:
        if not process.alive:
            return
        self.note(f"{process.name} SIGKILL")
        self.loop.crash(process)

    # -- workload ---------------------------------------------------------------------------
    async def _produce(self) -> None:
        for delivery in self.scenario.workload.deliveries:
            wait = delivery.at - self.loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            while self.broker.down:
                await asyncio.sleep(0.5)
            timestamp = delivery.timestamp_ms
            if timestamp is None:
                timestamp = int(self.loop.wall() * 1000) + delivery.timestamp_skew_ms
            raw = plain_batch([(delivery.key, delivery.value, delivery.headers, timestamp)])
            partition = delivery.partition
            if (
                self.partitions_now != self.scenario.partitions
                and delivery.event_key
                and not delivery.misplaced
            ):
                partition = owner_partition(delivery.event_key.encode(), self.partitions_now)  # the new owner
            log = self.broker.log(self.topology.topics.input, partition)
            if log is None:
                raise RuntimeError("the input topic is gone")
            [produced] = decode_produced(raw)
            error, _ = log.append(
                produced, self.broker.topics[self.topology.topics.input].config, self.broker.now_ms()
            )
            if error:
                self.note(f"workload: {delivery.sim_id} refused by the input topic (error {error})")
                self.scenario.workload.deliveries = [
                    d for d in self.scenario.workload.deliveries if d.sim_id != delivery.sim_id
                ]
                continue
            self.produced += 1

    # -- faults -----------------------------------------------------------------------------
    async def _inject(self) -> None:
        pending: list[asyncio.Task[Any]] = []
        for fault in self.scenario.faults:
            wait = fault.at - self.loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            self.note(f"FAULT {fault.describe()}")
            pending.append(self.loop.spawn(None, self._apply(fault), f"fault-{fault.kind}"))
        for task in pending:
            await task

    async def _apply(self, fault: Fault) -> None:
        kind = fault.kind
        operators = self.operators
        if kind == redrive.FIX:
            await operators.fix()
            return
        if kind == redrive.REPLAY:
            await operators.replays(fault)
            return
        if kind == redrive.CONSOLE:
            await operators.consoles.redrives(fault, operators.cut)
            return
        if kind == RESCALE:
            await operators.rescale(fault)
            return
        if kind == RECONFIGURE:
            operators.reconfigure(fault)
            return
        if kind == timeline.DOWNTIME:
            await operators.downtime(fault)
            return
        if kind == timeline.CLOCK_JUMP:
            if fault.target < len(self.slots):
                await operators.clock_jump(self.slots[fault.target], fault)
            return
        if kind == "join":
            slot = Slot(len(self.slots), self.root / f"w{len(self.slots)}")
            self.slots.append(slot)
            self.start(slot)
            return
        if kind == "outage":
            await self.outage(fault.duration)
            return
        if kind == "fence":
            txn_id = self._txn_of_partition(fault.target)
            if txn_id is not None and txn_id in self.broker.txns:
                while self.broker.init_producer_id(txn_id, 60_000)[0] == b.CONCURRENT_TRANSACTIONS:
                    await asyncio.sleep(0.05)
            return
        if kind == fault_module.STORM:
            self.broker.storm_until = self.loop.time() + fault.duration
            return
        if kind == fault_module.CORRUPT:
            txn_id = await self._bisecting() if fault.detail == "bisecting" else None
            txn_id = txn_id or self._txn_of_partition(fault.target)
            if txn_id is not None:
                self.broker.inject(kind, "produce", txn_id)
            return
        if kind == fault_module.REFUSE_REPLAY:
            self.broker.inject(kind, b.PLAIN_PRODUCE, "")  # no transactional id: any plain producer's
            self.note("the broker will refuse the next produce request of a dlq replay as corrupt")
            return
        if kind == fault_module.LOST_COMMIT:
            txn_id = self._txn_of_partition(fault.target)
            if txn_id is not None:
                self.broker.inject(kind, "end-txn-lost", txn_id)
            return
        if kind in ("producer-fatal", "commit-refused"):
            txn_id = self._txn_of_partition(fault.target)
            if txn_id is not None:
                self.broker.inject(kind, fault.detail, txn_id)
            return
        if kind == "refuse-outputs":
            topics = self.topology.topics
            if fault.detail == "timestamps":
                for name in (topics.audit, topics.dlq, topics.changelog, *self.topology.command_topics()):
                    self.broker.topics[name].config.timestamp_after_max_ms = 3_600_000
                # tighter on the DLQ topic: the DLQ record of a record dated ahead is refused (handlers.AHEAD_MS)
                self.broker.topics[topics.dlq].config.timestamp_after_max_ms = handlers.dlq_after_ms(
                    self.scenario.time
                )
            else:
                self.broker.topics[topics.commands].config.max_message_bytes = 700
                self.broker.topics[topics.commands].reconfigured = True
            return
        if kind == "leader-kill":
            await self._kill_leader_mid_rebalance(fault)
            return
        if fault.target >= len(self.slots):
            return
        slot = self.slots[fault.target]
        if kind == "promote-mid-replay":
            await self._promote_mid_replay(slot, fault)
            return
        if kind == REVOKE_MID_OPEN:
            await self._revoke_mid_open(slot, fault)
            return
        if kind == fault_module.TWIN:
            await self._twin(slot, fault)
            return
        process = slot.process
        if kind == "disk":
            self.disk.arm(slot.name, fault.detail, fault.steps)
            return
        if process is None or not process.alive:
            return
        if kind == "crash":
            self._crash_in[process] = fault.steps
            await asyncio.sleep(1.0)
            self._crash(process)
            await self._restart_later(slot, process, fault.duration)
        elif kind == "pause":
            self.loop.pause(process)
            self.note(f"{process.name} SIGSTOP")
            await asyncio.sleep(fault.duration)
            self.loop.resume(process)
            self.note(f"{process.name} SIGCONT")
        elif kind == "leave":
            await self._leave(slot, process, fault.duration)
        elif kind == "foreign-store":
            self._crash(process)
            self._plant_foreign_store(slot, fault.detail)
            await self._restart_later(slot, process, fault.duration)

    async def _twin(self, slot: Slot, fault: Fault) -> None:
        """A second process under ``slot``'s instance id (its own state dir) for ``fault.duration`` seconds:
        the group takes it in the running worker's place (KIP-345), whose producer it fences too. The one
        pushed out must stop with InstanceIdTakenError (the slot's worker is then started again, as a
        supervisor would, and pushes the twin out in turn); any other exit of the twin is a problem."""
        if not self.scenario.static or not slot.running:
            return
        self.twins += 1
        process = Process(f"{slot.name}.twin{self.twins}")
        settings = replace(
            self.settings(slot), state_dir=slot.state_dir.parent / f"{slot.name}-twin{self.twins}"
        )
        worker = self._worker(slot, settings, process)
        self.twin_until[slot.index] = self.loop.time() + fault.duration + TWIN_GRACE_S
        self.twin_processes.append((process, worker))
        self.note(f"{process.name} starts under {slot.name}'s instance id, for {fault.duration:.1f}s")
        self.loop.spawn(process, self._twin_run(process, worker, fault.duration), process.name)

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
                self.note(f"{process.name} SIGTERM")
            await run
        except BrokerUnavailableError as exc:
            outcome = "exit 1 at start: the broker is down" if not started else f"exit 1: {exc!r}"[:400]
        except Exception as exc:
            outcome = f"exit 1: {exc!r}"[:400]
        self.note(f"{process.name} ended: {outcome}")
        if outcome not in ("exit 0", "exit 1 at start: the broker is down") and not _twin_exit(outcome):
            self.problems.append(f"{process.name} exited on its own: {outcome}")
        self.loop.crash(process)

    async def _kill_leader_mid_rebalance(self, fault: Fault) -> None:
        """A worker joins (a rebalance); the group's leader is SIGKILLed once JoinGroup has answered and
        before its SyncGroup has (while it makes the assignment), and started again later."""
        slot = Slot(len(self.slots), self.root / f"w{len(self.slots)}")
        self.slots.append(slot)
        self.start(slot)
        group = self.broker.group(GROUP)
        deadline = self.loop.time() + 30.0
        while self.loop.time() < deadline:
            leader = group.members.get(group.leader or "")
            if group.state == "completing" and leader is not None and leader.process is not None:
                victim = next((s for s in self.slots if s.process is leader.process), None)
                if victim is not None and victim.process is not None and victim.process.alive:
                    self.note(
                        f"{victim.process.name} is the group's leader, planning generation {group.generation}"
                    )
                    process = victim.process
                    self._crash(process)
                    await self._restart_later(victim, process, fault.duration)
                    return
            await asyncio.sleep(0.0005)
        self.note("leader-kill: no rebalance to kill the leader in")

    async def _promote_mid_replay(self, slot: Slot, fault: Fault) -> None:
        """The slot's standby requests crawl (0.5-3 s each) from now to 15 s past the fault's duration; once a
        round of one of its standbys is in flight (behind, if records came), the owner of that partition leaves
        (SIGTERM, started again 2 s later), so that the rebalance promotes the standby mid-round."""
        process, worker = slot.process, slot.worker
        if process is None or not process.alive or worker is None:
            return
        self.network.slow_standbys[slot.name] = (self.loop.time() + fault.duration + 15.0, (0.5, 3.0))
        await asyncio.sleep(1.0)
        held = sorted(worker.standby_partitions()) if slot.worker is worker else []
        if not held:
            self.note(f"promote-mid-replay: {slot.name} keeps no standby")
            return
        tp = held[0]
        name = f"{tp.topic}-{tp.partition}"
        deadline = self.loop.time() + fault.duration
        while self.loop.time() < deadline and slot.worker is worker and slot.running:
            standby = worker.health()[1].get("standby", {}).get(name, {})
            behind = standby.get("lag_records") or self.loop.time() > deadline - fault.duration / 2
            if standby.get("replaying") and behind:
                break  # a round (with records to replay, if any came) waits on a crawling request
            await asyncio.sleep(0.01)
        owner_process = self._owner_of(f"{APP}-{GROUP}-{tp.topic}-{tp.partition}")
        owner = next((s for s in self.slots if s.process is not None and s.process is owner_process), None)
        if owner is None or owner is slot or owner.worker is None or owner_process is None:
            self.note(f"promote-mid-replay: no owner of {tp.topic}-{tp.partition} to take it from")
            return
        self.note(
            f"promote-mid-replay: {owner_process.name} leaves {tp.topic}-{tp.partition} to {slot.name}'s standby"
        )
        await self._leave(owner, owner_process, 2.0)

    async def _revoke_mid_open(self, slot: Slot, fault: Fault) -> None:
        """The slot's changelog reads crawl (0.5-3 s each) from now to ``fault.duration`` past the next minute; its
        worker restarts (SIGTERM, started again half a second after it stopped; the crawl slows its start too),
        and once one of its partitions is opening or restoring, within a minute, a worker joins: the rebalance
        revokes partitions while they open."""
        process = slot.process
        if process is None or not process.alive or slot.worker is None:
            return
        self.network.slow_standbys[slot.name] = (self.loop.time() + 60.0 + fault.duration, (0.5, 3.0))
        await self._leave(slot, process, 0.5)
        deadline = self.loop.time() + 60.0
        while self.loop.time() < deadline:
            worker, now = slot.worker, slot.process
            if worker is not None and now is not None and now.alive:
                states = worker.health()[1].get("partitions", {})
                opening = sorted(name for name, state in states.items() if state in ("opening", "restoring"))
                if opening:
                    self.note(f"revoke-mid-open: {now.name} opens {', '.join(opening)}; a worker joins")
                    joined = Slot(len(self.slots), self.root / f"w{len(self.slots)}")
                    self.slots.append(joined)
                    self.start(joined)
                    return
            await asyncio.sleep(0.001)
        self.note(f"revoke-mid-open: {slot.name} opened nothing within a minute")

    async def _leave(self, slot: Slot, process: Process, duration: float) -> None:
        """SIGTERM, and a start again ``duration`` later once it has stopped (a rolling restart); unless another
        stop came meanwhile, which then owns the start (two restarts at once, or a rescale stopping every worker
        as this one ends: seed 60247 of the redrive mix)."""
        slot.wanted = False
        slot.stops += 1
        mine = slot.stops
        if slot.worker is not None:
            slot.worker.stop()
        self.note(f"{process.name} SIGTERM")
        await asyncio.sleep(duration)
        if process.alive:  # still stopping: it commits what is open, once the broker answers
            await self._stopped(process, limit=STOP_LIMIT_S)
            if process.alive:
                self.problems.append(
                    f"{process.name} did not stop within {STOP_LIMIT_S:.0f}s of SIGTERM (with the broker up)"
                )
                self.problems.extend(self.loop.stacks(process)[:12])
                self._crash(process)
        if slot.stops != mine:
            return
        slot.wanted = True
        self.start(slot)

    async def _restart_later(self, slot: Slot, process: Process, delay: float) -> None:
        if slot.process is process:
            slot.process = None
        await asyncio.sleep(delay)
        if slot.wanted and not slot.running:
            self.start(slot)

    def _plant_foreign_store(self, slot: Slot, how: str) -> None:
        """Put, where one of ``slot``'s stores lives, a store under the same names but from elsewhere:
        another cluster's (claiming keys this workload sends) or one ahead of the changelog."""
        topics = self.topology.topics
        partition = self.rng.randrange(self.scenario.partitions)
        tp = TopicPartition(topics.input, partition)
        path = directory.store_path(slot.state_dir, self.topology, GROUP, tp)
        shutil.rmtree(path, ignore_errors=True)
        changelog_topic = self.broker.topics[topics.changelog]
        if how == "ahead":  # this cluster's changelog, but a position it never reached
            ids = (self.broker.cluster_id, str(changelog_topic.id))
        else:  # another cluster's store under the same names
            ids = (f"other-{self.rng.getrandbits(32):08x}", str(uuid.UUID(int=self.rng.getrandbits(128))))
        identity = StoreIdentity(APP, GROUP, topics.input, partition, topics.changelog, *ids)
        bucket_ms = bucket_width(int(self.topology.max_ttl.total_seconds() * 1000))
        try:
            store = SimStore.open(path, bucket_ms=bucket_ms, identity=identity)
        except (
            StoreLockedError
        ):  # a store of this slot is still open (a standby closing): nothing to plant on
            self.note(f"foreign-store: {tp.topic}-{tp.partition} of {slot.name} is held; not planted")
            return
        try:
            from pipeline.state.decision import Entry  # noqa: PLC0415
            from pipeline.state.store import Change  # noqa: PLC0415

            now = int(self.loop.wall() * 1000)
            keys = [
                d.event_key
                for d in self.scenario.workload.deliveries
                if d.partition == partition and not d.poison
            ]
            changes = {}
            for key in keys[: max(1, len(keys) // 2)]:
                entry = Entry(
                    now, now + 7 * 86_400_000, partition, 0, 0, now, "handle", topics.commands, None, 0
                )
                changes[key.encode()] = Change.of(entry)
            changelog = self.broker.log(topics.changelog, partition)
            end = changelog.end if changelog is not None else 0
            offset = end + 1000 if how == "ahead" else max(end - 1, 0)
            store.write(changes, changelog_offset=offset, stream_time=now)
        finally:
            store.close()
        if how != "ahead":
            self.foreign_stores.add((slot.index, tp))
        self.note(f"planted a foreign store ({how}) for {tp.topic}-{tp.partition} in {slot.name}")

    # -- the end ----------------------------------------------------------------------------
    def _settled(self) -> bool:
        if self.produced < len(self.scenario.workload.deliveries):
            return False
        return self.caught_up()

    def caught_up(self) -> bool:
        """Every record produced so far handled and committed, by a stable group of healthy workers."""
        if self.broker.down:
            return False
        if any(slot.wanted and not slot.running for slot in self.slots):
            return False
        if any(slot.process is not None and slot.process.state is ProcessState.PAUSED for slot in self.slots):
            return False
        group = self.broker.group(GROUP)
        if group.state != "stable":
            return False
        for name in self.consumed_topics():
            for log in self.broker.topics[name].partitions:
                if log.open_txns or not log.caught_up(group.committed.get((name, log.partition), 0)):
                    return False
        return all(slot.worker is None or not slot.running or slot.worker.health()[0] for slot in self.slots)

    async def _settle(self) -> bool:
        deadline = self.loop.time() + SETTLE_LIMIT_S
        while not self._settled():
            if self.loop.time() > deadline:
                self.problems.append(
                    f"not settled {SETTLE_LIMIT_S:.0f}s after the schedule (livelock or a stuck partition)"
                )
                self.problems.extend(self._diagnose())
                return False
            await asyncio.sleep(0.25)
        self.note("settled: every record handled and committed")
        return True

    async def _stop_all(self) -> None:
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
        await self._stopped(
            *(s.process for s in running if s.process is not None), *twins, limit=STOP_LIMIT_S
        )
        names = [s.process.name for s in running if s.running and s.process is not None]
        names += [p.name for p in twins if p.alive]
        if names:
            self.problems.append(f"workers did not stop within {STOP_LIMIT_S:.0f}s: {names}")
            for slot in running:
                if slot.running and slot.process is not None:
                    self.problems.extend(self.loop.stacks(slot.process)[:12])

    async def _transactions_ended(self) -> None:
        """Wait until every transaction has ended: a zombie that woke after the run settled may have sent its
        abort (the markers land a moment later), or left one open for the coordinator to abort at its timeout
        (seed 494 of the default mix). The check then reads what a read_committed consumer finally sees."""
        deadline = self.loop.time() + TXNS_END_LIMIT_S
        while any(t.state in OPEN_TXN_STATES for t in self.broker.txns.values()):
            if self.loop.time() > deadline:
                self.problems.append(
                    f"transactions not ended {TXNS_END_LIMIT_S:.0f}s after the workers stopped"
                )
                return
            await asyncio.sleep(0.5)

    async def _stopped(self, *processes: Process, limit: float) -> None:
        """Wait until none of ``processes`` runs, for ``limit`` seconds of the broker being up at most (a stop
        commits what is open, which waits for the broker)."""
        left = limit
        while any(p.alive for p in processes) and left > 0:
            await asyncio.sleep(0.25)
            if not self.broker.down:
                left -= 0.25

    def _diagnose(self) -> list[str]:
        lines = []
        group = self.broker.group(GROUP)
        lines.append(f"group {group.state} generation {group.generation} members {sorted(group.members)}")
        for name in self.consumed_topics():
            topic = self.broker.topics.get(name)
            if topic is None:
                continue
            lines.extend(
                f"{name}-{log.partition}: committed {group.committed.get((name, log.partition), 0)}, "
                f"lso {log.lso()}, end {log.end}, open {log.open_txns}"
                for log in topic.partitions
            )
        for slot in self.slots:
            state = slot.process.state.value if slot.process is not None else "none"
            health = slot.worker.health()[1] if slot.worker is not None and slot.running else {}
            lines.append(
                f"{slot.name}: process {state}, wanted {slot.wanted}, exits {slot.exits[-3:]}, {health}"
            )
        lines.append(f"produced {self.produced} of {len(self.scenario.workload.deliveries)}")
        return lines


def _twin_exit(outcome: str) -> bool:
    """Whether a worker's exit is one a twin under its instance id may cause (:data:`TWIN_EXITS`)."""
    return any(reason in outcome for reason in TWIN_EXITS)


def _world() -> Any:
    import contextvars  # noqa: PLC0415

    return contextvars.Context()


def run_seed(seed: int, mix: str = "default", *, keep: Path | None = None) -> Result:
    """Run one seed of ``mix`` in a fresh temporary directory (kept under ``keep`` if given)."""
    scenario = Scenario.draw(seed, mix)
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    root = Path(tempfile.mkdtemp(prefix=f"sim-{seed}-", dir=keep or base))
    try:
        return World(scenario, root).run()
    finally:
        if keep is None:
            with contextlib.suppress(OSError):
                shutil.rmtree(root)
