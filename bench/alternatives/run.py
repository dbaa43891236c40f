"""Alternatives benchmark: this project's worker against the tools users would pick instead.

    .venv/bin/python bench/alternatives/run.py --bootstrap 127.0.0.1:19092            # 500k events
    .venv/bin/python bench/alternatives/run.py --bootstrap 127.0.0.1:19092 --quick    # ~4 minutes

On one broker and one generated workload (``bench/worker_bench.py``'s: 1-2 KB
Stripe-like bodies, 30% duplicates re-sent later in the stream, keyed
``stripe:evt_...``, header ``source: stripe``), one contender after another,
each a subprocess of its own so that its RSS and CPU can be read in /proc:

* ``passthrough``: ``bench/passthrough.py``, aiokafka consume -> produce, no state (the ceiling);
* ``worker``: ``python -m pipeline worker``, exactly once;
* ``faust-alo`` / ``faust-eos``: ``faust_app.py``, an agent and a RocksDB Table, at_least_once / exactly_once;
* ``quix-eos``: ``quix_app.py``, a quixstreams Application with RocksDB state, exactly-once;
* ``kstreams``: ``kstreams/``, a Kafka Streams app (Java, built with Maven by ``kstreams.py``):
  exactly_once_v2, one stream thread, a persistent RocksDB window store holding the TTL;
* ``redis``: ``claim.py``, aiokafka + Redis ``SET NX EX`` claims (a redis-server started here);
* ``postgres``: ``claim.py``, aiokafka + ``INSERT ... ON CONFLICT DO NOTHING`` (``scripts/postgres.sh``).

Per contender, one run over its own input topic (the backlog is produced before it starts):

1. speed: events/s to drain the backlog, from the first handled record to a
   random point between 30% and 70% of it ("handled" means the contender's
   consumer group committed the offset: every contender commits only after
   its outputs are acknowledged or inside their transaction), CPU seconds per
   100k events over that span and peak RSS (VmHWM, the larger of the two
   processes);
2. crash: at that point the process gets SIGKILL, is restarted with the same
   group and state and drains the rest (a restart that makes no progress for
   ``--stall-seconds`` is restarted once more, and reported);
3. latency: caught up, records are produced at a fixed moderate rate and a
   read_committed reader times each first copy's command: p50/p99, the
   contender's CPU per event over the phase (its CPU seconds divided by the
   records sent) and its open sockets (socket descriptors in /proc/<pid>/fd,
   the most seen in a sample each half second); for a JVM the notes under the
   table give the share of the drain's and of this phase's CPU that went to its
   JIT compiler threads (a fresh JVM compiles while it is measured);
4. correctness: a read_committed scan of the output counts the commands per
   key: duplicates (commands beyond one per unique key) and missing keys (no
   command). The passthrough does not dedupe: its expectation is one output
   per input record instead.

Faust, quix, Kafka Streams and the passthrough commit on one interval (``--commit-interval-ms``,
default 100 ms; ``--quix-commit-interval-ms`` sets quix's alone, whose own default is
5 s); the worker runs with its own defaults (a caught-up partition commits at once;
under load at 1 s or 10,000 records; ``--worker-commit-interval-ms`` and
``--max-batch`` set them); the claimers commit after every batch. All have a 10 s
session timeout and read read_committed. The table gives each contender's
throughput as a ratio to the passthrough's and to quix's of the same run. The SIGKILL lands up to two of the
contender's commit intervals after the measured point, anywhere in its commit cycle. It prints one table and the machine; all processes, the Redis
and PostgreSQL servers and the topics are removed at the end (also on Ctrl-C
or SIGTERM). Logs stay in ``--work-dir``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the checkout: bench.lib

import psycopg  # noqa: E402
import redis  # noqa: E402
from aiokafka import AIOKafkaConsumer, TopicPartition  # noqa: E402
from aiokafka.errors import KafkaError  # noqa: E402

from bench.alternatives import kstreams  # noqa: E402
from bench.lib import broker, phases, report, topology_file, workload  # noqa: E402
from bench.lib import procs as processes  # noqa: E402
from pipeline import topology  # noqa: E402
from pipeline.kafka.admin import TopicSpec, topic_specs  # noqa: E402
from pipeline.worker.settings import WORKER_DEFAULTS  # noqa: E402

ROOT = HERE.parents[1]
say = report.say
CONTENDERS = (
    "passthrough",
    "worker",
    "faust-alo",
    "faust-eos",
    "quix-eos",
    "kstreams",
    "redis",
    "postgres",
)
LABELS = {
    "passthrough": "passthrough (aiokafka, no state, at least once)",
    "worker": "worker (this project, exactly once)",
    "faust-alo": "faust-streaming RocksDB table, at_least_once",
    "faust-eos": "faust-streaming RocksDB table, exactly_once",
    "quix-eos": "quixstreams RocksDB state, exactly-once",
    "kstreams": "Kafka Streams RocksDB window store, exactly_once_v2",
    "redis": "aiokafka + Redis SET NX EX",
    "postgres": "aiokafka + PostgreSQL ON CONFLICT DO NOTHING",
}


@dataclass
class Crash:
    name: str
    records: int  # input records of the crash pass
    killed_at: int  # committed input records when SIGKILL was sent
    recovery_seconds: float  # restart to first progress (group rejoin, state restore)
    outputs: int = 0
    duplicates: int = 0  # outputs beyond the expected count per key
    missing: int = 0  # expected outputs that never appeared (counted per key)
    keys_duplicated: int = 0
    keys_missing: int = 0
    missing_positions: tuple[int, int] | None = None  # first and last stream position of a missing key
    readable_after_seconds: float = float("nan")  # kill -> read_committed readers see all written before it
    stalls: list[int] = field(default_factory=list)  # committed records when a stalled restart was restarted


@dataclass
class Row:
    name: str
    label: str
    drain: phases.Drain | None = None
    latency: phases.Latency | None = None
    peak_rss_mib: float = float("nan")
    store_cpu_per_100k: float = float("nan")  # the Redis / PostgreSQL server's CPU over the drain
    store_rss_mib: float = float("nan")
    crash: Crash | None = None
    error: str | None = None
    warnings: list[str] = field(default_factory=list)
    transactions_per_second: float = float("nan")  # the worker's commits over the latency phase


# -- the claim stores ----------------------------------------------------------------------------------------


class RedisServer:
    """Debian's redis-server on a free port, no persistence (only the consumer is killed, never Redis)."""

    def __init__(self, work: Path) -> None:
        self.port = processes.free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        binary = shutil.which("redis-server")
        if binary is None:
            raise report.BenchError("redis-server is not installed (apt-get install -y redis-server)")
        log = (work / "redis-server.log").open("ab")
        self.popen = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=work,
            start_new_session=True,
        )
        processes._LIVE.append(self.popen)

    async def ready(self) -> None:
        client = redis.Redis(port=self.port)
        for _ in range(100):
            with contextlib.suppress(redis.ConnectionError):
                if client.ping():
                    client.close()
                    return
            await asyncio.sleep(0.1)
        raise report.BenchError("redis-server did not answer")

    def reset(self) -> None:
        with redis.Redis(port=self.port) as client:
            client.flushall()

    def pids(self) -> list[int]:
        return [self.popen.pid] if self.popen.poll() is None else []

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        say(f"  redis-server on port {self.port} stopped")


class PostgresServer:
    """``scripts/postgres.sh`` on a free port, data under the work dir."""

    def __init__(self, work: Path) -> None:
        self.port = processes.free_port()
        self.env = dict(os.environ, PG_RUN_DIR=str(work / "postgres"))
        (work / "postgres").mkdir(exist_ok=True)
        work.chmod(0o755)  # the server runs as another user: it must reach its directory
        self.started = False
        out = subprocess.run(
            ["bash", str(ROOT / "scripts/postgres.sh"), "start", str(self.port)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if out.returncode != 0:
            raise report.BenchError(f"postgres.sh start failed: {out.stderr.strip()[-500:]}")
        self.started = True
        self.url = out.stdout.strip().splitlines()[-1]
        self.data = work / "postgres" / str(self.port) / "data"

    async def ready(self) -> None:
        return None

    def reset(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("DROP TABLE IF EXISTS seen")

    def pids(self) -> list[int]:
        """The postmaster and its children (backends, checkpointer, WAL writer, ...)."""
        with contextlib.suppress(OSError, ValueError):
            main = int((self.data / "postmaster.pid").read_text().split()[0])
            pids = [main]
            for entry in Path("/proc").iterdir():
                if entry.name.isdigit():
                    with contextlib.suppress(OSError, ValueError, IndexError):
                        stat = (entry / "stat").read_text()
                        if int(stat[stat.rindex(")") + 2 :].split()[1]) == main:
                            pids.append(int(entry.name))
            return pids
        return []

    def stop(self) -> None:
        if self.started:
            subprocess.run(
                ["bash", str(ROOT / "scripts/postgres.sh"), "stop", str(self.port)],
                env=self.env,
                capture_output=True,
                timeout=120,
                check=False,
            )
            self.started = False
            say(f"  PostgreSQL on port {self.port} stopped")


def cpu_of(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += report.pid_cpu_seconds(pid)
    return total


def rss_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total / 1024


# -- the bench -----------------------------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.run_id = f"alt{time.strftime('%m%d%H%M%S')}{random.randrange(16**3):03x}"
        self.work = Path(args.work_dir or tempfile.mkdtemp(prefix="alternatives-bench-"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.broker = broker.Broker(args.bootstrap)
        self.broker_pid = report.find_broker_pid(args.bootstrap)
        self.procs: list[processes.Proc] = []
        self.rows: list[Row] = []
        self.stores: list[RedisServer | PostgresServer] = []
        self.rng = random.Random(args.seed + 7)
        self.stream: workload.Stream | None = None
        self.latency_stream: workload.Stream | None = None
        self.hw_consumer: AIOKafkaConsumer | None = None
        self.kstreams_classpath: str | None = None
        self.worker_metrics_port = 0

    # -- processes ------------------------------------------------------------------------------------------
    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> processes.Proc:
        proc = processes.Proc(name, argv, self.work / f"{name}.log", env)
        self.procs.append(proc)
        say(f"  started {name} (pid {proc.pid}); log {proc.log_path}")
        return proc

    async def stop_all(self) -> None:
        for proc in self.procs:
            if proc.alive():
                await proc.stop()

    def interval_ms(self, name: str) -> int:
        """The longest a contender's transaction or commit cycle lasts under load, in ms."""
        args = self.args
        if name == "worker":
            if args.worker_commit_interval_ms is not None:
                return int(args.worker_commit_interval_ms)
            return round(float(WORKER_DEFAULTS["commit_interval"]) * 1000)
        if name == "quix-eos" and args.quix_commit_interval_ms is not None:
            return int(args.quix_commit_interval_ms)
        return int(args.commit_interval_ms)

    def command_for(
        self, name: str, *, input_topic: str, output: str, group: str, state: Path
    ) -> tuple[list[str], dict[str, str] | None]:
        """(argv, env) of a contender reading ``input_topic``."""
        args = self.args
        py = sys.executable
        commit_ms = args.commit_interval_ms
        common = ["--bootstrap", args.bootstrap, "--input", input_topic, "--output", output, "--group", group]
        if name == "passthrough":
            argv = [py, str(processes.PASSTHROUGH), *common, "--commit-interval-ms", str(commit_ms)]
            return argv, None
        if name == "worker":
            topo = state.with_suffix(".toml")
            self.worker_metrics_port = processes.free_port()
            return [
                py,
                "-m",
                "pipeline",
                "worker",
                "--bootstrap",
                args.bootstrap,
                "--topology",
                str(topo),
                "--state-dir",
                str(state),
                "--group",
                group,
                "--metrics-port",
                str(self.worker_metrics_port),
                *processes.worker_bounds(args.worker_commit_interval_ms, args.max_batch),
            ], None
        if name.startswith("faust"):
            env = {
                "FAUST_BENCH_BOOTSTRAP": args.bootstrap,
                "FAUST_BENCH_INPUT": input_topic,
                "FAUST_BENCH_OUTPUT": output,
                "FAUST_BENCH_APP": group,
                "FAUST_BENCH_DATADIR": str(state),
                "FAUST_BENCH_GUARANTEE": "exactly_once" if name == "faust-eos" else "at_least_once",
                "FAUST_BENCH_PARTITIONS": str(args.partitions),
                "FAUST_BENCH_COMMIT_S": str(commit_ms / 1000),
            }
            return [py, str(HERE / "faust_app.py"), "worker", "-l", "info", "--without-web"], env
        if name == "quix-eos":
            argv = [py, str(HERE / "quix_app.py"), *common, "--state-dir", str(state)]
            quix_ms = commit_ms if args.quix_commit_interval_ms is None else args.quix_commit_interval_ms
            return [*argv, "--commit-interval", str(quix_ms / 1000)], None
        if name == "kstreams":
            return kstreams.argv(
                self.kstreams_classpath or kstreams.build(),
                bootstrap=args.bootstrap,
                input_topic=input_topic,
                output=output,
                group=group,
                state=state,
                commit_ms=commit_ms,
            ), None
        store = self.stores[-1]
        kind = "redis" if name == "redis" else "pg"
        return [py, str(HERE / "claim.py"), "--store", kind, "--url", store.url, *common], None

    async def prepare(self, name: str, app: str, input_topic: str, state: Path) -> str:
        """Create the contender's topics (and topology); return its output topic."""
        args = self.args
        if name == "worker":
            topo_path = topology_file.write_topology(state.with_suffix(".toml"), app, args.partitions)
            text = topo_path.read_text().replace(f'input = "{app}.raw"', f'input = "{input_topic}"')
            topo_path.write_text(text)
            topo = topology.load(topo_path)
            await self.broker.create(topic_specs(topo, args.partitions))
            return topo.topics.commands
        output = f"{app}.out"
        await self.broker.create([TopicSpec(output, args.partitions)])
        return output

    async def progress(self, group: str, topic: str) -> int:
        committed = await self.broker.committed(group, topic)
        return sum(max(v, 0) for v in committed.values())

    # -- one contender --------------------------------------------------------------------------------------
    async def run_contender(self, row: Row) -> None:
        """Backlog; drain (measured) until a random point; SIGKILL; restart; finish; latency; count outputs."""
        args, stream = self.args, self.require(self.stream)
        name = row.name
        app = f"{self.run_id}-{name}"
        input_topic = f"{app}.raw"
        if name == "kstreams":  # before the backlog: a failed build costs nothing more
            self.kstreams_classpath = self.kstreams_classpath or kstreams.build()
        await self.broker.create([TopicSpec(input_topic, args.partitions)])
        await broker.produce_backlog(
            args.bootstrap, input_topic, args.partitions, stream.records(), len(stream), f"{name} backlog"
        )
        if name in ("redis", "postgres"):
            server = RedisServer(self.work) if name == "redis" else PostgresServer(self.work)
            self.stores.append(server)
            await server.ready()
            say(f"  {name} server at {server.url}")
        state = self.work / f"{name}-state"
        output = await self.prepare(name, app, input_topic, state)
        group = f"{app}-group"
        argv, env = self.command_for(name, input_topic=input_topic, output=output, group=group, state=state)
        total = len(stream)
        kill_at = int(total * self.rng.uniform(0.3, 0.7))
        proc = self.start(name, argv, env)
        store = self.stores[-1] if name in ("redis", "postgres") else None
        store_cpu0 = {pid: cpu_of([pid]) for pid in store.pids()} if store else {}

        async def handled() -> int:
            return await self.progress(group, input_topic)

        # the speed measurement: from the first committed record to the kill point
        row.drain = await phases.drain(
            proc, handled, kill_at, timeout=args.drain_timeout, label=name, broker_pid=self.broker_pid
        )
        # the kill lands anywhere in the commit cycle, not just after the commit that crossed the mark
        await asyncio.sleep(self.rng.uniform(0, 2 * self.interval_ms(name) / 1000))
        row.peak_rss_mib = proc.status_kib("VmHWM") / 1024
        if store:  # before the kill: the contender's PostgreSQL backend exits with its connection
            pids = store.pids()
            used = sum(cpu_of([pid]) - store_cpu0.get(pid, 0.0) for pid in pids)
            row.store_cpu_per_100k = used / max(row.drain.events, 1) * 100_000
            row.store_rss_mib = rss_mib(pids)
        members_before = await self.broker.group_members(group)
        os.kill(proc.pid, signal.SIGKILL)
        proc.popen.wait()
        done = await handled()
        high = await self.high_watermarks(output)
        blocked = asyncio.create_task(self.readable_after(output, high, time.monotonic()))
        d = row.drain
        say(
            f"  {name}: {d.events:,} events in {d.seconds:.1f}s = {d.rate:,.0f} events/s "
            f"(startup {d.startup_seconds:.1f}s), CPU {d.cpu_per_100k:.1f} s/100k, all CPUs {d.machine_busy:.0%} busy"
        )
        say(f"  {name}: SIGKILL at {done:,}/{total:,} committed input records; restarting")
        row.crash = Crash(name=name, records=total, killed_at=done, recovery_seconds=float("nan"))
        proc = self.start(f"{name}-restart", argv, env)
        began = time.monotonic()
        if done >= total:
            # nothing left to make progress on: wait until the restart alone owns the partitions
            # (the killed member stays until its session times out), or the latency phase would
            # time the group's rejoin instead of the contender
            while not (members := await self.broker.group_members(group)) or members & members_before:
                proc.check()
                if time.monotonic() - began > args.drain_timeout:
                    raise report.BenchError(f"{name} did not rejoin its group after the restart")
                await asyncio.sleep(0.1)
            row.crash.recovery_seconds = float("nan")
            say(
                f"  {name}: the backlog was all committed before the kill; group stable again "
                f"{time.monotonic() - began:.1f}s after the restart"
            )
        else:
            while await handled() <= done:
                proc.check()
                if time.monotonic() - began > args.drain_timeout:
                    raise report.BenchError(f"{name} made no progress after the restart")
                await asyncio.sleep(0.1)
            row.crash.recovery_seconds = time.monotonic() - began
            say(f"  {name}: first progress {row.crash.recovery_seconds:.1f}s after the restart")
        proc = await self.finish_crash_pass(row.crash, proc, handled, argv, env)
        row.crash.readable_after_seconds = await blocked
        await self.wait_stable(output)  # the latency phase measures the steady state
        if self.latency_stream is not None:
            commits_before, latency_began = await self.worker_commits(name), time.monotonic()
            row.latency = await phases.latency_phase(
                args.bootstrap,
                self.broker,
                proc,
                input_topic=input_topic,
                partitions=args.partitions,
                watch_topic=output,
                stream=self.latency_stream,
                rate=args.latency_rate,
                label=name,
            )
            lat = row.latency
            if commits_before is not None and (commits_after := await self.worker_commits(name)) is not None:
                row.transactions_per_second = (commits_after - commits_before) / (
                    time.monotonic() - latency_began
                )
                say(f"  {name}: {row.transactions_per_second:.1f} transactions/s over the latency phase")
            say(
                f"  {name}: latency p50 {lat.p50_ms:.0f} ms, p99 {lat.p99_ms:.0f} ms "
                f"({lat.seen:,}/{lat.firsts:,} seen, sent at {lat.achieved_rate:,.0f}/s); "
                f"CPU {lat.cpu_us_per_event:.0f} µs per event and {lat.sockets} open sockets meanwhile"
            )
            total += len(self.latency_stream)
            await phases.drain(proc, handled, total, timeout=120, label=f"{name} (catching up)")
        row.peak_rss_mib = max(row.peak_rss_mib, proc.status_kib("VmHWM") / 1024)
        code = await proc.stop()
        row.warnings = report.log_findings(proc.log_path)
        say(f"  {name} stopped (exit {code}); peak RSS {row.peak_rss_mib:.0f} MiB")
        shutil.rmtree(state, ignore_errors=True)
        await self.count_outputs(row.crash, name, output)

    async def worker_commits(self, name: str) -> float | None:
        """The worker's transactions committed so far (its /metrics), or None for another contender."""
        if name != "worker":
            return None
        scraped = await asyncio.to_thread(processes.scrape_transactions, self.worker_metrics_port)
        return scraped.get("pipeline_transaction_commit_seconds_count")

    async def finish_crash_pass(
        self, crash: Crash, proc: processes.Proc, handled: Any, argv: list[str], env: dict[str, str] | None
    ) -> processes.Proc:
        """Drain to the end after the restart; a contender stalled for ``--stall-seconds`` is restarted again."""
        args, name = self.args, crash.name
        deadline = time.monotonic() + args.drain_timeout
        done, last_change, last_report = await handled(), time.monotonic(), time.monotonic()
        while done < crash.records:
            proc.check()
            await asyncio.sleep(0.2)
            now, count = time.monotonic(), await handled()
            if count != done:
                done, last_change = count, now
            if now - last_report >= 10:
                last_report = now
                say(f"  {name} (after restart): {done:,}/{crash.records:,} committed")
            if now > deadline:
                raise report.BenchError(f"{name}: {done:,}/{crash.records:,} after the restart; giving up")
            if now - last_change > args.stall_seconds:
                if len(crash.stalls) >= 2:
                    raise report.BenchError(f"{name}: stalled at {done:,}/{crash.records:,} after restarts")
                crash.stalls.append(done)
                say(
                    f"  {name}: STALLED at {done:,}/{crash.records:,} for {args.stall_seconds:.0f}s; restarting it"
                )
                await proc.stop()
                proc = self.start(f"{name}-restart{len(crash.stalls) + 1}", argv, env)
                last_change = time.monotonic()
        return proc

    async def count_outputs(self, crash: Crash, name: str, output: str) -> None:
        stream, extra = self.require(self.stream), self.latency_stream
        expected: Counter[bytes] = Counter()
        for s in (stream, extra):
            if s is not None:
                expected.update(key for key, _ in s.records())
        if name != "passthrough":  # a deduper owes one command per unique key
            expected = Counter(dict.fromkeys(expected, 1))
        await self.wait_stable(output)
        seen: Counter[bytes] = Counter()
        parts = dict.fromkeys(range(self.args.partitions), 0)
        crash.outputs = await broker.scan(
            self.args.bootstrap, output, parts, on_record=lambda r: seen.update((r.key,)), timeout=600
        )
        for key in expected.keys() | seen.keys():
            have, want = seen.get(key, 0), expected.get(key, 0)
            if have > want:
                crash.duplicates += have - want
                crash.keys_duplicated += 1
            elif have < want:
                crash.missing += want - have
                crash.keys_missing += 1
        missing = [k for k in expected if seen.get(k, 0) < expected[k]]
        if missing:
            first_at = self.first_positions()
            spots = sorted(first_at[k] for k in missing if k in first_at)
            if spots:
                crash.missing_positions = (spots[0], spots[-1])
        say(
            f"  {name}: after the kill: {crash.outputs:,} outputs, {crash.duplicates:,} duplicates "
            f"({crash.keys_duplicated:,} keys), {crash.missing:,} missing ({crash.keys_missing:,} keys)"
        )

    async def high_watermarks(self, topic: str) -> dict[int, int]:
        if self.hw_consumer is None:
            self.hw_consumer = AIOKafkaConsumer(
                bootstrap_servers=self.args.bootstrap, enable_auto_commit=False
            )
            await self.hw_consumer.start()
        tps = [TopicPartition(topic, p) for p in range(self.args.partitions)]
        high = await self.hw_consumer.end_offsets(tps)
        return {tp.partition: high[tp] for tp in tps}

    async def readable_after(
        self, topic: str, high: dict[int, int], since: float, timeout: float = 600
    ) -> float:
        """Seconds until a read_committed reader can read everything written before the kill (LSO >= HW)."""
        while time.monotonic() - since < timeout:
            stable = await self.broker.end_offsets(topic)
            if all(stable[p] >= h for p, h in high.items()):
                return time.monotonic() - since
            await asyncio.sleep(0.25)
        return float("nan")

    def first_positions(self) -> dict[bytes, int]:
        """Each key's position of first sending in the input topic's order (backlog, then latency records)."""
        positions: dict[bytes, int] = {}
        n = 0
        for s in (self.stream, self.latency_stream):
            if s is not None:
                for key, _ in s.records():
                    positions.setdefault(key, n)
                    n += 1
        return positions

    async def wait_stable(self, topic: str, timeout: float = 120) -> None:
        """Wait until no transaction is open on ``topic`` (LSO == high watermark), so a scan sees it all."""
        deadline = time.monotonic() + timeout
        while True:
            high = await self.high_watermarks(topic)
            stable = await self.broker.end_offsets(topic)
            if all(stable[p] >= h for p, h in high.items()):
                return
            if time.monotonic() > deadline:
                say(
                    f"  {topic}: a transaction is still open after {timeout:.0f}s; scanning what is committed"
                )
                return
            await asyncio.sleep(0.5)

    @staticmethod
    def require(value: workload.Stream | None) -> workload.Stream:
        if value is None:
            raise report.BenchError("no data generated")
        return value

    # -- the run --------------------------------------------------------------------------------------------
    async def run(self) -> list[Row]:
        args = self.args
        task = asyncio.current_task()
        if task is not None:
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        info = report.machine_info()
        say(
            f"alternatives bench {self.run_id}: {args.events:,} events, {args.partitions} partitions, "
            f"{args.dup_ratio:.0%} duplicates, latency {args.latency_rate:,.0f}/s for {args.latency_seconds:g}s, "
            f"commit interval {args.commit_interval_ms} ms; load average {report.loadavg()}; work dir {self.work}"
        )
        say("machine: " + "; ".join(f"{k} {v}" for k, v in info.items()))
        began = time.monotonic()
        self.stream = workload.make_stream(
            random.Random(args.seed), args.events, args.dup_ratio, min_size=1024, max_size=2048
        )
        latency_total = int(args.latency_rate * args.latency_seconds)
        if latency_total > 0:
            self.latency_stream = workload.make_stream(
                random.Random(args.seed + 2), latency_total, args.dup_ratio, min_size=1024, max_size=2048
            )
        say(
            f"generated {len(self.stream):,} records ({self.stream.unique:,} unique) "
            f"and {latency_total:,} latency records in {time.monotonic() - began:.1f}s"
        )
        await self.broker.start()
        try:
            for name in args.only:
                row = Row(name, LABELS[name])
                self.rows.append(row)
                say(f"== {row.label}")
                try:
                    await self.run_contender(row)
                except (report.BenchError, KafkaError, OSError, subprocess.SubprocessError) as exc:
                    row.error = str(exc) or repr(exc)
                    say(f"  {name} FAILED: {row.error}")
                finally:
                    await self.stop_all()
                    while self.stores:
                        self.stores.pop().stop()
                for line in row.warnings:
                    say(f"  log: {line}")
        finally:
            await self.stop_all()
            while self.stores:
                self.stores.pop().stop()
            if self.hw_consumer is not None:
                await self.hw_consumer.stop()
            await self.delete_topics()
            await self.broker.stop()
            for path in self.work.glob("*-state"):
                shutil.rmtree(path, ignore_errors=True)
        self.print_table(info, time.monotonic() - began)
        if args.json:
            Path(args.json).write_text(
                json.dumps(
                    {
                        "run": self.run_id,
                        "argv": sys.argv,
                        "machine": info,
                        "rows": [asdict(r) for r in self.rows],
                    },
                    indent=2,
                    default=str,
                )
            )
        return self.rows

    async def delete_topics(self) -> None:
        """Every topic of this run: ours, and those faust and quix created (changelogs, assignor topics)."""
        with contextlib.suppress(Exception):
            names = await asyncio.wait_for(self.broker._admin().list_topics(), 30)
            self.broker.created += [t for t in names if self.run_id in t and t not in self.broker.created]
        await self.broker.delete_created()

    def print_table(self, info: dict[str, str], seconds: float) -> None:
        args = self.args
        rate_of = {r.name: r.drain.rate for r in self.rows if r.drain}

        def times(d: phases.Drain | None, base: str) -> str:
            return f"{d.rate / rate_of[base]:.2f}" if d and base in rate_of else "-"

        header = (
            "contender",
            "events/s",
            "vs passthrough",
            "vs quix",
            "p50 ms",
            "p99 ms",
            "CPU µs/event at rate",
            "sockets",
            "RSS MiB",
            "CPU s/100k",
            "dup after kill",
            "missing after kill",
        )
        rows = []
        for r in self.rows:
            d, lat, c = r.drain, r.latency, r.crash
            finished = c if c is not None and c.outputs > 0 else None
            rows.append(
                (
                    r.label + (" (FAILED)" if r.error else ""),
                    f"{d.rate:,.0f}" if d else "-",
                    times(d, "passthrough"),
                    times(d, "quix-eos"),
                    f"{lat.p50_ms:,.0f}" if lat else "-",
                    f"{lat.p99_ms:,.0f}" if lat else "-",
                    f"{lat.cpu_us_per_event:,.0f}" if lat else "-",
                    f"{lat.sockets}" if lat else "-",
                    f"{r.peak_rss_mib:.0f}" if r.peak_rss_mib == r.peak_rss_mib else "-",
                    f"{d.cpu_per_100k:.1f}" if d else "-",
                    f"{finished.duplicates:,}" if finished else "-",
                    f"{finished.missing:,}" if finished else "-",
                )
            )
        print()
        print(
            f"Alternatives: {args.events:,} events ({args.dup_ratio:.0%} duplicates, 1-2 KB bodies), "
            f"{args.partitions} partitions, commit interval {args.commit_interval_ms} ms"
            f" (worker {self.interval_ms('worker')} ms)"
            + (
                f" (quixstreams {args.quix_commit_interval_ms} ms)"
                if args.quix_commit_interval_ms is not None
                else ""
            )
            + f", latency at {args.latency_rate:,.0f} events/s for {args.latency_seconds:g}s"
            + " (CPU µs/event and open sockets of the contender's process over that phase)"
            + f"; run took {seconds / 60:.1f} min"
        )
        report.print_markdown(header, rows)
        print()
        print(
            f"machine: {info['nproc']} CPUs ({info['cpu']}), {info['ram']} RAM, Python {info['python']}, "
            f"Kafka {info['kafka']} (one local KRaft broker), {info['libraries']}; load average at end {report.loadavg()}"
        )
        print("alternatives: " + alternative_versions())
        for r in self.rows:
            parts = []
            if r.drain:
                d = r.drain
                parts.append(
                    f"startup {d.startup_seconds:.1f}s, drain {d.seconds:.1f}s, process {d.cpu_seconds / d.seconds:.0%} "
                    f"of a CPU, broker {d.broker_cpu_per_100k:.1f} CPU s/100k, all CPUs {d.machine_busy:.0%} busy"
                )
            jit = [
                f"{share:.0%} of the {phase}'s CPU"
                for share, phase in (
                    (
                        r.drain.jit_cpu_seconds / r.drain.cpu_seconds
                        if r.drain and r.drain.cpu_seconds
                        else 0.0,
                        "drain",
                    ),
                    (r.latency.jit_cpu_share if r.latency else 0.0, "latency phase"),
                )
                if share > 0
            ]
            if jit:
                parts.append("JIT compiler threads " + " and ".join(jit))
            if r.transactions_per_second == r.transactions_per_second:
                parts.append(f"{r.transactions_per_second:.1f} transactions/s at rate")
            if r.store_cpu_per_100k == r.store_cpu_per_100k:
                parts.append(
                    f"store server {r.store_cpu_per_100k:.1f} CPU s/100k, {r.store_rss_mib:.0f} MiB RSS at the end"
                )
            if r.crash:
                c = r.crash
                parts.append(
                    f"SIGKILL at {c.killed_at:,}/{c.records:,} committed, "
                    + (
                        f"first progress {c.recovery_seconds:.1f}s after the restart"
                        if c.recovery_seconds == c.recovery_seconds
                        else "nothing left to progress on after the restart"
                    )
                    + ", output fully readable (read_committed) "
                    f"{c.readable_after_seconds:.1f}s after the kill, {c.outputs:,} outputs, "
                    f"{c.keys_duplicated:,} keys duplicated, {c.keys_missing:,} keys missing"
                    + (
                        f" (first sent at stream positions {c.missing_positions[0]:,}..{c.missing_positions[1]:,})"
                        if c.missing_positions
                        else ""
                    )
                    + (
                        f"; STALLED after the restart at {c.stalls} committed: restarted again"
                        if c.stalls
                        else ""
                    )
                )
            if r.error:
                parts.append(f"FAILED: {r.error.splitlines()[0]}")
            print(f"{r.name}: " + "; ".join(parts))
        print(f"logs: {self.work}", flush=True)


def alternative_versions() -> str:
    """The versions of the contenders' libraries and servers."""
    found = []
    for name in ("faust-streaming", "quixstreams", "confluent-kafka", "redis", "psycopg"):
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} ?")
    found.append(kstreams.versions())
    for argv in (["redis-server", "--version"],):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False).stdout
            if out.strip():
                found.append(out.strip().splitlines()[0])
    pg = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"))
    if pg:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            version = subprocess.run(
                [str(pg[-1]), "--version"], capture_output=True, text=True, timeout=10, check=False
            )
            found.append(version.stdout.strip())
    return ", ".join(found)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092"))
    parser.add_argument("--events", type=int, default=500_000, help="backlog records per contender")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--dup-ratio", type=float, default=0.3)
    parser.add_argument("--latency-rate", type=float, default=1000, help="events/s in the latency phase")
    parser.add_argument("--latency-seconds", type=float, default=10, help="0 skips the latency phase")
    parser.add_argument(
        "--commit-interval-ms", type=int, default=100, help="every contender's but the worker's"
    )
    parser.add_argument(
        "--worker-commit-interval-ms",
        type=int,
        default=None,
        help="the worker's (default: its own, 1000: it commits a caught-up partition at once)",
    )
    parser.add_argument("--max-batch", type=int, default=None, help="the worker's (default: its own)")
    parser.add_argument(
        "--quix-commit-interval-ms",
        type=int,
        default=None,
        help="quixstreams' own commit interval (default: --commit-interval-ms; quixstreams' default is 5000)",
    )
    parser.add_argument(
        "--drain-timeout", type=float, default=None, help="seconds per drain (default scales)"
    )
    parser.add_argument("--only", default=",".join(CONTENDERS), help=f"comma-separated, of {CONTENDERS}")
    parser.add_argument(
        "--stall-seconds",
        type=float,
        default=60,
        help="no progress this long after the restart: restart again",
    )
    parser.add_argument("--quick", action="store_true", help="20k events, 3 s of latency")
    parser.add_argument("--seed", type=int, default=20241130)
    parser.add_argument("--work-dir", default=None, help="logs (default: a new temp dir)")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.events, args.latency_seconds = 20_000, 3
    args.only = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = set(args.only) - set(CONTENDERS)
    if unknown:
        parser.error(f"unknown contenders {sorted(unknown)}; choose from {CONTENDERS}")
    if args.drain_timeout is None:
        args.drain_timeout = max(180.0, args.events / 150)
    return args


def main() -> int:
    args = parse_args()
    bench = Bench(args)
    # Ctrl-C cleans up even when started with SIGINT ignored (nohup, a background job)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        rows = asyncio.run(bench.run())
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted: processes stopped, servers stopped, topics deleted", file=sys.stderr)
        return 130
    return 0 if all(r.error is None for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
