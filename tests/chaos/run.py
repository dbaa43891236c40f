"""Chaos run: exactly-once through worker crashes, zombies, broker restarts and rebalances.

    .venv/bin/python -m tests.chaos.run                 # full: 200,000 events, 3 workers, 6 partitions
    .venv/bin/python -m tests.chaos.run --quick         # ~2 minutes: 15,000 events, 2 workers, 3 faults

It starts a private broker (``deploy/kafka/kafka.sh`` on free ports, in a temporary
directory), creates unique topics, produces a realistic webhook workload continuously
(signed Stripe-, GitHub- and Shopify-shaped bodies, 30% duplicates, some held back until
after a fault, a few malformed and a few misplaced records), runs worker processes in one
group and injects seeded random faults:

- ``sigkill``: SIGKILL a worker mid-stream, then start it again on the same state dir;
- ``sigstop``: SIGSTOP a worker for longer than the session timeout (its partitions move),
  then SIGCONT it: a zombie with an open transaction that must be fenced;
- ``broker``: ``kafka.sh restart`` (stop and start, keeping the data);
- ``outage``: the broker stopped for 90 s (longer than a transaction may stay open), then started;
- ``join``: start one more worker in the group;
- ``leave``: SIGTERM a worker (it must commit and exit 0).

Recovery time of a fault: from the fault's injection until (a) every input partition's
committed offset has moved past where it stood when the fault completed (the broker back
up, the leaving worker exited, the joining worker assigned partitions; for SIGKILL and
SIGSTOP the injection itself) and (b) the group's committed offsets reached the
input's end offsets as of the injection (everything produced before the fault is processed
and committed), or nothing a read_committed reader gets lies between them (an aborted
transaction's records and its marker at a partition's end: ``tests/chaos/settled.py``). "Max stall" is the longest time one input partition's committed offset
stood still in that window. Both come from the group's committed offsets, sampled every
250 ms.

At the end an independent consumer (confluent-kafka, read_committed, a fresh group) reads
the input, commands, audit and DLQ topics and checks exactly one command per unique valid
key, no key missing, one audit record per input record, every malformed record in the DLQ
with its reason. Exits 0 on PASS, 1 on FAIL, 2 on a harness error or timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from pipeline import topology
from pipeline.kafka.admin import ensure_topics, topic_specs
from pipeline.kafka.partitioner import owner_partition
from tests.chaos.checker import check
from tests.chaos.cluster import Broker, InputProducer, Monitor, Sample, Workers
from tests.chaos.settled import Settled
from tests.chaos.workload import SOURCES, Materializer, plan

FAULT_KINDS = ("sigkill", "sigstop", "broker", "outage", "join", "leave")
OUTAGE_S = 90.0  # an ``outage`` keeps the broker down this long: longer than a transaction may stay open


class HarnessError(RuntimeError):
    """The run itself could not go on (not a verdict on the pipeline)."""


@dataclass
class Fault:
    number: int
    kind: str
    at: float  # seconds since the run's start
    target: str = ""
    recovery: float | None = None
    stall: float | None = None
    note: str = ""


@dataclass
class Run:
    args: argparse.Namespace
    seed: int
    began: float = field(default_factory=time.monotonic)
    faults: list[Fault] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # harness errors and exactly-once violations
    liveness: list[str] = field(default_factory=list)  # crashes, hangs, no recovery: not a safety violation
    # the input partitions found with nothing readable left (made once the topics exist)
    settled: Settled | None = None

    def now(self) -> float:
        return time.monotonic() - self.began

    def say(self, message: str) -> None:
        print(f"[{self.now():7.1f}s] {message}", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--events", type=int, help="input records to produce (default 200000; quick 15000)")
    parser.add_argument("--workers", type=int, help="worker processes (default 3; quick 2)")
    parser.add_argument("--partitions", type=int, default=6, help="input partitions (default 6)")
    parser.add_argument(
        "--faults",
        help=f"comma-separated fault kinds, shuffled by the seed ({', '.join(FAULT_KINDS)}); "
        "default sigkill,sigkill,sigstop,sigstop,broker,join,leave (quick: sigkill,sigstop,broker)",
    )
    parser.add_argument(
        "--duration",
        type=float,
        help="seconds over which the workload is produced and the faults spread (default events/rate)",
    )
    parser.add_argument("--rate", type=float, default=None, help="input records per second (default 450)")
    parser.add_argument("--seed", type=int, help="random seed (default: from the clock; printed)")
    parser.add_argument("--session-timeout-ms", type=int, default=3000, help="workers' session timeout")
    parser.add_argument("--timeout", type=float, help="give up after this many seconds (default scales)")
    parser.add_argument("--keep", action="store_true", help="keep the worker logs (always kept on FAIL)")
    parser.add_argument("--quick", action="store_true", help="the short CI version (~2 minutes)")
    args = parser.parse_args(argv)
    if args.quick:
        args.events = args.events or 15_000
        args.workers = args.workers or 2
        args.faults = args.faults or "sigkill,sigstop,broker"
        args.rate = args.rate or 250.0
    args.events = args.events or 200_000
    args.workers = args.workers or 3
    args.faults = args.faults or "sigkill,sigkill,sigstop,sigstop,broker,join,leave"
    kinds = [k.strip() for k in args.faults.split(",") if k.strip()]
    unknown = sorted(set(kinds) - set(FAULT_KINDS))
    if unknown:
        parser.error(f"unknown fault kinds: {unknown}")
    if kinds.count("leave") > kinds.count("join") + args.workers - 1:
        parser.error("too many 'leave' faults for the workers there are")
    args.fault_kinds = kinds
    args.rate = args.rate or 450.0
    args.duration = args.duration or args.events / args.rate
    args.timeout = args.timeout or max(240.0, args.duration * 2.5 + 120)
    return args


def schedule(kinds: list[str], rng: random.Random) -> list[str]:
    """A seeded order of the faults in which no worker leaves before one has joined beyond the base."""
    while True:
        order = kinds[:]
        rng.shuffle(order)
        extra = 0
        ok = True
        for kind in order:
            extra += kind == "join"
            if kind == "leave":
                if extra == 0 and "join" in kinds:
                    ok = False
                extra -= 1
        if ok:
            return order


def write_topology(path: Path, app: str, partitions: int) -> Path:
    sources = "".join(f'[sources.{s}]\nprovider = "{s}"\nverify = "none"\nttl = "7d"\n' for s in SOURCES)
    path.write_text(
        f"""[app]
name = "{app}"
[topics]
input = "{app}.raw"
commands = "{app}.events"
audit = "{app}.deliveries"
dlq = "{app}.dlq"
changelog = "{app}-seen-changelog"
partitions = {partitions}
{sources}""",
        encoding="utf-8",
    )
    return path


# -- recovery ----------------------------------------------------------------------------------------


def recovered_at(
    samples: list[Sample], t0: float, baseline: Sample, completed: float, settled: Settled | None = None
) -> tuple[float | None, float | None]:
    """When the group recovered from a fault injected at ``t0`` (see the module docstring), and the max stall.

    ``completed`` is when the fault's action was over (the broker answering again, the leaving
    worker gone, the joining one assigned): progress counts from the first sample after it, so a
    leaving worker's final commit or a commit squeezed in while the broker shuts down is not
    mistaken for recovery. A partition ``settled`` found with nothing readable between its committed
    offset and its end (an aborted transaction's records and markers only) counts as caught up.
    """

    def nothing_left(s: Sample, p: int) -> bool:
        return settled is not None and settled.holds(p, s.committed[p], s.ends[p])

    caught = None
    moving: dict[int, float] = {}
    start: dict[int, int] | None = None
    start_ends: dict[int, int] = {}
    for s in samples:
        if s.at < t0:
            continue
        if caught is None and all(
            s.committed[p] >= baseline.ends[p] or nothing_left(s, p) for p in baseline.ends
        ):
            caught = s.at
        if start is None:
            if s.at >= completed:
                start = dict(s.committed)  # the first sample after the fault completed
                start_ends = dict(s.ends)
            continue
        for p, offset in s.committed.items():
            if p in moving:
                continue
            # it moved; or no record came for it since the fault completed and it holds them all
            # (once the planned stream has ended, only the held-back duplicates, which are
            # released after the recovery, would make it move: waiting for them never ends)
            # (the end may sit one past the committed offset: a transaction marker of a reroute)
            idle = s.ends[p] == start_ends.get(p) and s.ends[p] - offset <= 1
            if offset > start[p] or idle or nothing_left(s, p):
                moving[p] = s.at
        if caught is not None and len(moving) == len(baseline.ends):
            done = max(caught, *moving.values())
            return done - t0, _max_stall(samples, t0, done)
    return None, None


def _max_stall(samples: list[Sample], t0: float, until: float) -> float:
    window = [s for s in samples if t0 <= s.at <= until]
    if not window:
        return 0.0
    stall = 0.0
    for p in window[0].committed:
        last_offset, last_move = window[0].committed[p], t0
        for s in window[1:]:
            if s.committed[p] != last_offset:
                stall = max(stall, s.at - last_move)
                last_offset, last_move = s.committed[p], s.at
    return stall


def wait_recovered(
    run: Run,
    monitor: Monitor,
    workers: Workers,
    fault: Fault,
    t0: float,
    baseline: Sample,
    completed: float,
    timeout: float,
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fault.recovery, fault.stall = recovered_at(
            monitor.since(t0 - 1), t0, baseline, completed, run.settled
        )
        if fault.recovery is not None:
            return
        check_alive(run, workers)
        latest = monitor.latest()
        if run.settled is not None and latest is not None and time.monotonic() - t0 > 10:
            run.settled.check(latest, [p for p in latest.ends if latest.committed[p] < baseline.ends[p]])
        time.sleep(0.25)
    run.liveness.append(
        f"fault {fault.number} ({fault.kind}): no recovery within {timeout:.0f}s; "
        + partition_states(monitor.latest(), baseline)
    )


def partition_states(s: Sample | None, baseline: Sample | None = None) -> str:
    """Each input partition's committed offset and end (and end at the fault), for a failure's line."""
    if s is None:
        return "no sample of the group's offsets"
    return "; ".join(
        f"p{p} committed {s.committed[p]} end {s.ends[p]}"
        + (f" (end at the fault {baseline.ends[p]})" if baseline is not None else "")
        for p in sorted(s.ends)
    )


def fresh_sample(monitor: Monitor, timeout: float = 30.0) -> Sample:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = monitor.sample()
        if s is not None:
            return s
        time.sleep(0.2)
    raise HarnessError("cannot read the group's offsets from the broker")


# -- faults ------------------------------------------------------------------------------------------


def inject(
    run: Run, fault: Fault, rng: random.Random, workers: Workers, broker: Broker, monitor: Monitor
) -> None:
    """Inject one fault and wait until the group has recovered from it."""
    session = run.args.session_timeout_ms / 1000
    baseline = fresh_sample(monitor)
    t0 = time.monotonic()
    fault.at = t0 - run.began
    completed = t0
    running = sorted(p.name for p in workers.running())
    if fault.kind == "sigkill":
        fault.target = rng.choice(running)
        run.say(f"fault {fault.number}: SIGKILL {fault.target}")
        workers.kill(fault.target)
        workers.start(fault.target)
        fault.note = "killed mid-transaction, restarted on its state dir"
    elif fault.kind == "sigstop":
        fault.target = rng.choice(running)
        pause = 2 * session + rng.uniform(1.0, 3.0)
        proc = workers.procs[fault.target]
        run.say(f"fault {fault.number}: SIGSTOP {fault.target} for {pause:.1f}s (session {session:.1f}s)")
        before = proc.log.stat().st_size
        proc.process.send_signal(signal.SIGSTOP)
        time.sleep(pause)
        proc.process.send_signal(signal.SIGCONT)
        run.say(f"fault {fault.number}: SIGCONT {fault.target}")
        woke_at = time.monotonic()
        # the zombie must notice it lost its partitions, drop them and rejoin the group
        woke = ""
        while time.monotonic() < woke_at + 2 * session + 20:
            woke = proc.log.read_bytes()[before:].decode(errors="replace")
            if "Joined group" in woke:
                break
            time.sleep(0.5)
        rejoined = "Joined group" in woke
        if rejoined:
            run.say(
                f"fault {fault.number}: {fault.target} rejoined {time.monotonic() - woke_at:.1f}s after SIGCONT"
            )
        else:
            run.liveness.append(
                f"zombie {fault.target} did not rejoin the group within {2 * session + 20:.0f}s of SIGCONT "
                f"(stuck after being fenced?); its log after SIGCONT ends with:\n"
                + "\n".join(woke.splitlines()[-8:])
            )
            run.say(
                f"fault {fault.number}: {fault.target} has NOT rejoined the group; SIGKILL and restart it"
            )
            workers.kill(fault.target)  # what a supervisor's liveness probe would do
            workers.start(fault.target)
        fenced = len(re.findall(r"fenced", woke))
        closed = len(re.findall(r"could not commit on close", woke))
        revoked = len(re.findall(r"partitions revoked", woke))
        fault.note = (
            f"stopped {pause:.1f}s; on waking: {fenced} 'fenced', {closed} 'could not commit on close', "
            f"{revoked} revocations; {'rejoined' if rejoined else 'NEVER REJOINED'}"
        )
    elif fault.kind == "broker":
        fault.target = broker.bootstrap
        run.say(f"fault {fault.number}: broker restart")
        took = broker.restart()
        fault.note = f"kafka.sh restart took {took:.1f}s"
        completed = time.monotonic()
        run.say(f"fault {fault.number}: broker back after {took:.1f}s")
    elif fault.kind == "outage":
        fault.target = broker.bootstrap
        run.say(f"fault {fault.number}: broker down for {OUTAGE_S:.0f}s")
        broker.stop()
        time.sleep(OUTAGE_S)
        took = broker.start()
        fault.note = f"broker down {OUTAGE_S:.0f}s (transactions time out after 60s), back in {took:.1f}s"
        completed = time.monotonic()
        run.say(f"fault {fault.number}: broker back")
    elif fault.kind == "join":
        fault.target = f"w{len(workers.procs) + 1}"
        run.say(f"fault {fault.number}: {fault.target} joins")
        proc = workers.start(fault.target)
        waited = time.monotonic() + 60
        while time.monotonic() < waited and "partitions assigned" not in proc.log.read_text(errors="replace"):
            time.sleep(0.2)
        completed = time.monotonic()
        fault.note = f"a worker joins the group; first assignment {completed - t0:.1f}s after its start"
    elif fault.kind == "leave":
        fault.target = rng.choice(running)
        run.say(f"fault {fault.number}: SIGTERM {fault.target} (leaves)")
        code = workers.terminate(fault.target)
        completed = time.monotonic()
        fault.note = f"exit code {code} {completed - t0:.1f}s after SIGTERM"
        if code != 0:
            run.liveness.append(f"{fault.target} exited {code} on SIGTERM (expected 0)")
    wait_recovered(run, monitor, workers, fault, t0, baseline, completed, timeout=180.0)
    if fault.recovery is not None:
        run.say(
            f"fault {fault.number}: recovered in {fault.recovery:.1f}s (max partition stall {fault.stall:.1f}s)"
        )


def check_alive(run: Run, workers: Workers) -> None:
    """A worker that exits on its own is a failure; restart it so the run can go on."""
    for proc in list(workers.procs.values()):
        code = proc.process.poll()
        if code is not None:
            tail = "\n".join(proc.log.read_text(errors="replace").splitlines()[-15:])
            run.liveness.append(f"worker {proc.name} exited on its own with code {code}; log tail:\n{tail}")
            run.say(f"worker {proc.name} died (code {code}); restarting it as a supervisor would")
            workers.start(proc.name)


def wait_drained(run: Run, monitor: Monitor, workers: Workers, deadline: float) -> None:
    """Until every input partition's committed offset is at its end (a trailing commit marker allowed)."""
    stable_since = None
    last = None
    while time.monotonic() < deadline:
        check_alive(run, workers)
        s = monitor.latest()
        if s is not None:
            lagging = [p for p in s.ends if s.ends[p] - s.committed[p] > 1]
            if run.settled is not None and lagging:
                run.settled.check(s, lagging)
            drained = all(
                run.settled is not None and run.settled.holds(p, s.committed[p], s.ends[p]) for p in lagging
            )
            state = (tuple(s.ends.values()), tuple(s.committed.values()))
            if drained and state == last:
                stable_since = stable_since or time.monotonic()
                if time.monotonic() - stable_since > 3:
                    return
            else:
                stable_since = None
            last = state
        time.sleep(0.5)
    raise HarnessError(
        f"the workers did not drain the input in time (lag {monitor.lag()}: "
        f"{partition_states(monitor.latest())})"
    )


def scan_logs(workers: Workers) -> list[str]:
    """Errors and warnings in the workers' logs, grouped with numbers masked."""
    patterns: Counter[str] = Counter()
    tracebacks = 0
    for log in sorted((workers.run_dir / "logs").glob("*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if "Traceback" in line:
                tracebacks += 1
            if " ERROR " in line or " WARNING " in line or "CRITICAL" in line:
                message = re.sub(r"^.*?(ERROR|WARNING|CRITICAL)", r"\1", line)
                message = re.sub(r"key=\S+", "key=K", message)
                message = re.sub(r"\d+", "N", message)[:160]
                patterns[message] += 1
    lines = [f"{n:6d}  {m}" for m, n in patterns.most_common(15)]
    if tracebacks:
        lines.insert(0, f"{tracebacks:6d}  Traceback")
    return lines


# -- the run -----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    seed = args.seed if args.seed is not None else int(time.time()) % 1_000_000
    run = Run(args, seed)
    rng = random.Random(seed)
    order = schedule(args.fault_kinds, rng)
    run_dir = Path(tempfile.mkdtemp(prefix="chaos-"))
    app = f"chaos{uuid.uuid4().hex[:8]}"
    given = argv if argv is not None else sys.argv[1:]
    rerun = " ".join(a for i, a in enumerate(given) if a != "--seed" and (i == 0 or given[i - 1] != "--seed"))
    print(
        f"chaos run: seed {seed}, {args.events} events, {args.workers} workers, {args.partitions} partitions, "
        f"~{args.duration:.0f}s of production at {args.rate:.0f}/s, faults {order}\n"
        f"run dir {run_dir}\nrerun: {sys.executable} -m tests.chaos.run {rerun} --seed {seed}",
        flush=True,
    )

    def on_term(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    # a shell without job control starts background commands with SIGINT ignored: take it back
    signal.signal(signal.SIGINT, signal.default_int_handler)
    broker = Broker(run_dir)
    workers: Workers | None = None
    monitor: Monitor | None = None
    producer: InputProducer | None = None
    report = None
    verdict = 2
    try:
        run.say(f"starting a private broker on {broker.bootstrap}")
        took = broker.start()
        run.say(f"broker ready in {took:.1f}s")
        topo_path = write_topology(run_dir / "topology.toml", app, args.partitions)
        topo = topology.load(topo_path)
        asyncio.run(ensure_topics(broker.bootstrap, topic_specs(topo)))
        topics = {
            "input": topo.topics.input,
            "commands": topo.topics.commands,
            "audit": topo.topics.audit,
            "dlq": topo.topics.dlq,
        }
        workload = plan(args.events, seed=seed)
        run.say(
            f"workload: {workload.unique} unique events, {workload.duplicates} duplicates "
            f"({len(workload.delayed)} held back until after faults), {workload.malformed} malformed, "
            f"{workload.misplaced} misplaced"
        )
        materializer = Materializer(seed, args.partitions, owner_partition)
        group = f"{app}-group"
        workers = Workers(broker.bootstrap, topo_path, run_dir, group, args.session_timeout_ms)
        for i in range(args.workers):
            workers.start(f"w{i + 1}")
        monitor = Monitor(broker.bootstrap, topo.topics.input, group, args.partitions)
        monitor.start()
        run.settled = Settled(broker.bootstrap, topo.topics.input)
        producer = InputProducer(
            broker.bootstrap, topo.topics.input, materializer, workload.stream, args.rate
        )
        producer.start()
        production_began = time.monotonic()
        deadline = run.began + args.timeout
        delayed = list(workload.delayed)
        for index, kind in enumerate(order, start=1):
            share = args.duration * index / (len(order) + 1)
            jitter = rng.uniform(-0.25, 0.25) * args.duration / (len(order) + 1)
            at = production_began + max(8.0, share + jitter)
            while time.monotonic() < at:
                check_alive(run, workers)
                time.sleep(0.2)
            if time.monotonic() > deadline:
                raise HarnessError("out of time before all faults were injected")
            fault = Fault(index, kind, 0.0)
            run.faults.append(fault)
            inject(run, fault, rng, workers, broker, monitor)
            check_alive(run, workers)
            # release held-back duplicates of events already produced: they arrive after a fault
            ready = [d for d in delayed if d.event <= producer.high_event]
            release = ready[: max(1, len(workload.delayed) // (len(order) + 1))]
            released = {d.seq for d in release}
            delayed = [d for d in delayed if d.seq not in released]
            producer.add(release)
            run.say(f"released {len(release)} delayed duplicates; lag {monitor.lag()}")
        while time.monotonic() < production_began + args.duration:
            check_alive(run, workers)
            time.sleep(0.5)
        producer.add(delayed)
        run.say(f"production ends; the last {len(delayed)} delayed duplicates released")
        if not producer.finish(timeout=max(60.0, deadline - time.monotonic())):
            raise HarnessError("the producer could not deliver the workload in time")
        if producer.errors:
            run.say(f"producer: {len(producer.errors)} delivery errors (re-produced): {producer.errors[:3]}")
        if producer.replaced:
            run.say(f"producer: replaced {producer.replaced} time(s) after a fatal error")
        run.say(f"produced {producer.sent} records ({len(producer.acked)} acked); waiting for the workers")
        wait_drained(run, monitor, workers, deadline)
        run.say("drained; stopping the workers with SIGTERM")
        for name, code, took in workers.stop_all(timeout=30.0):
            run.say(f"{name} exited {code} {took:.1f}s after SIGTERM")
            if code != 0:
                run.liveness.append(
                    f"{name} did not exit 0 on the final SIGTERM (code {code} after {took:.0f}s; -9: "
                    "still running after 30s, killed)"
                )
        run.say("checking with an independent read_committed consumer (confluent-kafka)")
        report = check(
            broker.bootstrap,
            topics,
            args.partitions,
            acked_seqs=producer.acked,
            planned_malformed=workload.malformed,
        )
        verdict = 0 if report.ok and not run.problems and not run.liveness else 1
    except KeyboardInterrupt:
        print("\ninterrupted; cleaning up", flush=True)
        verdict = 130
    except (HarnessError, TimeoutError) as exc:
        run.problems.append(f"harness: {exc}")
        run.say(f"harness error: {exc}")
    finally:
        if producer is not None:
            producer.stop.set()
            if producer.thread.ident is not None:
                producer.thread.join(30)
            producer.producer = None  # type: ignore[assignment, unused-ignore]  # frees librdkafka (typed from 2.13)
        if workers is not None:
            workers.stop_all()
        if monitor is not None:
            monitor.close()
        if run.settled is not None:
            run.settled.close()
        log_lines = scan_logs(workers) if workers is not None else []
        broker.stop()
        elapsed = run.now()
        if verdict != 130:
            print_table(run, report, log_lines, verdict, elapsed)
        if args.keep or verdict not in (0, 130):
            shutil.rmtree(run_dir / "kafka" / str(broker.port) / "data", ignore_errors=True)
            shutil.rmtree(run_dir / "state", ignore_errors=True)
            print(f"logs kept in {run_dir}")
        else:
            shutil.rmtree(run_dir, ignore_errors=True)
    return verdict


def print_table(run: Run, report: object, log_lines: list[str], verdict: int, elapsed: float) -> None:
    args = run.args
    print()
    print(
        f"## Chaos run: seed {run.seed}, {args.events} events, {args.workers} workers, "
        f"{args.partitions} partitions, {elapsed:.0f}s"
    )
    print()
    if report is not None:
        print("| count | value |")
        print("|---|---:|")
        for name, value in report.counts.items():  # type: ignore[attr-defined]
            label = name.replace("  ", "&nbsp;&nbsp;") if name.startswith("  ") else name
            print(f"| {label} | {value:,} |")
        print()
    print("| # | fault | at (s) | target | recovery (s) | max partition stall (s) | note |")
    print("|---:|---|---:|---|---:|---:|---|")
    for f in run.faults:
        rec = f"{f.recovery:.1f}" if f.recovery is not None else "none"
        stall = f"{f.stall:.1f}" if f.stall is not None else "-"
        print(f"| {f.number} | {f.kind} | {f.at:.1f} | {f.target} | {rec} | {stall} | {f.note} |")
    print()
    if log_lines:
        print("worker log warnings/errors (count, message with numbers masked):")
        print("\n".join(log_lines))
        print()
    safety = list(run.problems)
    if report is not None:
        safety += report.problems  # type: ignore[attr-defined]
    for problem in safety:
        print(f"FAIL (safety): {problem}")
    for problem in run.liveness:
        print(f"FAIL (liveness): {problem}")
    checked = report is not None and not any(p.startswith("harness") for p in run.problems)
    print(
        f"safety (exactly-once, no loss, DLQ, audit): {'PASS' if checked and not safety else 'FAIL'}; "
        f"liveness (no crash, no hang, recovery, clean exit): {'PASS' if not run.liveness else 'FAIL'}"
    )
    print("PASS" if verdict == 0 else "FAIL")


if __name__ == "__main__":
    sys.exit(main())
