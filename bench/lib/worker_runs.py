"""``bench/worker_bench.py``'s run: the passthrough, the worker and the preloaded worker, each drained, timed, checked and tabled."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import orjson
from aiokafka.errors import KafkaError

from bench.lib.broker import Broker, produce_backlog, scan
from bench.lib.phases import Result, drain, latency_phase
from bench.lib.procs import PASSTHROUGH, Proc, free_port, scrape_transactions, worker_bounds
from bench.lib.report import (
    BenchError,
    dir_bytes,
    find_broker_pid,
    loadavg,
    log_findings,
    machine_info,
    say,
)
from bench.lib.topology_file import write_topology
from bench.lib.worker_table import print_table, report_drain, report_latency, summary, transaction_stats
from bench.lib.workload import Stream, make_stream, preload_records
from pipeline import topology
from pipeline.kafka.admin import TopicSpec, topic_specs

ROOT = Path(__file__).resolve().parents[2]


CONTENDERS = ("passthrough", "worker", "worker-preloaded")


DEFAULT_CONTENDERS = CONTENDERS[:3]


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.run_id = f"wb{time.strftime('%m%d%H%M%S')}{random.randrange(16**3):03x}"
        self.work = Path(args.work_dir or tempfile.mkdtemp(prefix="worker-bench-"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.broker = Broker(args.bootstrap)
        self.procs: list[Proc] = []
        self.results: list[Result] = []
        self.stream: Stream | None = None
        self.latency_stream: Stream | None = None
        self.broker_pid = find_broker_pid(args.bootstrap)

    # -- helpers ------------------------------------------------------------------------------------------
    def app(self, name: str) -> str:
        return f"{self.run_id}-{name.replace('worker-', 'w')}"

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        proc = Proc(name, argv, self.work / f"{name}.log", env)
        self.procs.append(proc)
        say(f"  started {name} (pid {proc.pid}); log {proc.log_path}")
        return proc

    async def stop_all(self) -> None:
        for proc in self.procs:
            if proc.alive():
                await proc.stop()

    def worker_argv(
        self, topo_path: Path, state: Path, group: str, *, profile: Path | None = None
    ) -> list[str]:
        args = self.args
        prefix = [sys.executable]
        if profile is not None:
            prefix += ["-m", "pyinstrument", "--renderer", "pyisession", "--outfile", str(profile)]
        prefix += ["-m", "pipeline"]
        return [
            *prefix,
            "worker",
            "--bootstrap",
            args.bootstrap,
            "--topology",
            str(topo_path),
            "--state-dir",
            str(state),
            "--group",
            group,
            *worker_bounds(args.commit_interval_ms, args.max_batch),
        ]

    async def committed_progress(self, group: str, topic: str, start: dict[int, int]) -> int:
        committed = await self.broker.committed(group, topic)
        return sum(max(committed[p], start[p]) - start[p] for p in start)

    async def finish(self, proc: Proc, result: Result) -> None:
        result.peak_rss_mib = proc.status_kib("VmHWM") / 1024
        code = await proc.stop()
        result.warnings = log_findings(proc.log_path)
        if code not in (0, None):
            result.warnings.append(f"exit status {code}")
        say(f"  {proc.name} stopped (exit {code}); peak RSS {result.peak_rss_mib:.1f} MiB")

    # -- the passthrough ----------------------------------------------------------------------------------
    async def run_passthrough(self, result: Result) -> None:
        args, stream = self.args, self.require(self.stream)
        app = self.app("passthrough")
        source, output, group = f"{app}.raw", f"{app}.out", f"{app}-group"
        await self.broker.create([TopicSpec(source, args.partitions), TopicSpec(output, args.partitions)])
        await produce_backlog(
            args.bootstrap, source, args.partitions, stream.records(), len(stream), "passthrough backlog"
        )
        base = await self.broker.end_offsets(output)
        proc = self.start(
            "passthrough",
            [
                sys.executable,
                str(PASSTHROUGH),
                "--bootstrap",
                args.bootstrap,
                "--input",
                source,
                "--output",
                output,
                "--group",
                group,
                "--commit-interval-ms",
                str(args.passthrough_commit_ms),
            ],
        )
        result.log = str(proc.log_path)

        async def handled() -> int:
            ends = await self.broker.end_offsets(output)
            return sum(ends[p] - base[p] for p in ends)

        result.drain = await drain(
            proc,
            handled,
            len(stream),
            timeout=args.drain_timeout,
            label="passthrough",
            broker_pid=self.broker_pid,
        )
        report_drain(result)
        if self.latency_stream is not None:
            result.latency = await latency_phase(
                args.bootstrap,
                self.broker,
                proc,
                input_topic=source,
                partitions=args.partitions,
                watch_topic=output,
                stream=self.latency_stream,
                rate=args.latency_rate,
                label="passthrough",
            )
            report_latency(result)
        total = len(stream) + (len(self.latency_stream) if self.latency_stream else 0)
        await drain(proc, handled, total, timeout=120, label="passthrough (catching up)")
        await self.finish(proc, result)
        keys: Counter[bytes] = Counter()
        count = await scan(
            args.bootstrap, output, base, on_record=lambda r: keys.update((r.key,)), timeout=300
        )
        result.checks = {"output records": count, "expected": total, "ok": count >= total}

    # -- the worker ---------------------------------------------------------------------------------------
    async def run_worker(self, result: Result, *, preload: int = 0) -> None:
        args, stream = self.args, self.require(self.stream)
        name = result.name
        app = self.app(name)
        topo_path = write_topology(self.work / f"{app}.toml", app, args.partitions)
        topo = topology.load(topo_path)
        topics = topo.topics
        group = f"{app}-group"
        state = self.work / f"{name}-state"
        await self.broker.create(topic_specs(topo, args.partitions))
        input_start = dict.fromkeys(range(args.partitions), 0)
        if preload:
            await self.preload(result, topo_path, topics.input, group, state, preload)
            input_start = await self.broker.end_offsets(topics.input)
        commands_start = await self.broker.end_offsets(topics.commands)
        audit_start = await self.broker.end_offsets(topics.audit)
        await produce_backlog(
            args.bootstrap, topics.input, args.partitions, stream.records(), len(stream), f"{name} backlog"
        )
        profile = self.work / f"{name}.pyisession" if args.profile_worker else None
        port = free_port()
        proc = self.start(
            name,
            [
                *self.worker_argv(topo_path, state, group, profile=profile),
                "--metrics-port",
                str(port),
            ],
        )
        result.log = str(proc.log_path)

        async def handled() -> int:
            return await self.committed_progress(group, topics.input, input_start)

        result.drain = await drain(
            proc, handled, len(stream), timeout=args.drain_timeout, label=name, broker_pid=self.broker_pid
        )
        report_drain(result)
        try:
            result.transactions = transaction_stats(await asyncio.to_thread(scrape_transactions, port))
            say(f"  {name}: transactions during the backlog: {result.transactions}")
        except OSError as exc:
            say(f"  {name}: could not read the worker's metrics: {exc!r}")
        if self.latency_stream is not None:
            result.latency = await latency_phase(
                args.bootstrap,
                self.broker,
                proc,
                input_topic=topics.input,
                partitions=args.partitions,
                watch_topic=topics.commands,
                stream=self.latency_stream,
                rate=args.latency_rate,
                label=name,
            )
            report_latency(result)
        total = len(stream) + (len(self.latency_stream) if self.latency_stream else 0)
        await drain(proc, handled, total, timeout=120, label=f"{name} (catching up)")
        await self.finish(proc, result)
        if profile is not None:
            say(
                f"  profile: {profile} (render: {sys.executable} -m pyinstrument --load {profile} "
                "-r text | -r pstats -o FILE | -r html -o FILE)"
            )
        await self.check_worker(result, topics.commands, commands_start, topics.audit, audit_start)

    async def preload(
        self, result: Result, topo_path: Path, input_topic: str, group: str, state: Path, count: int
    ) -> None:
        """Run the worker over ``count`` unique small events so that its store holds ``count`` keys."""
        args = self.args
        say(f"  preloading the store with {count:,} keys")
        began = time.monotonic()
        await produce_backlog(
            args.bootstrap,
            input_topic,
            args.partitions,
            preload_records(args.seed + 1, count),
            count,
            "preload",
        )
        proc = self.start(f"{result.name}-preload", self.worker_argv(topo_path, state, group))
        start = dict.fromkeys(range(args.partitions), 0)

        async def handled() -> int:
            return await self.committed_progress(group, input_topic, start)

        timeout = max(args.drain_timeout, count / 300)
        done = await drain(proc, handled, count, timeout=timeout, label="preload")
        rss = proc.status_kib("VmHWM") / 1024
        await proc.stop()
        result.preload = {
            "keys": count,
            "events_per_s": round(done.rate),
            "peak_rss_mib": round(rss, 1),
            "seconds": round(time.monotonic() - began, 1),
            "store_disk_mib": round(dir_bytes(state) / 2**20, 1),
            "warnings": log_findings(proc.log_path),
        }
        say(
            f"  preload done: {count:,} keys in {time.monotonic() - began:.0f}s "
            f"(worker {done.rate:,.0f} events/s, peak RSS {rss:.0f} MiB, "
            f"store {result.preload['store_disk_mib']} MiB on disk)"
        )

    async def check_worker(
        self,
        result: Result,
        commands: str,
        commands_start: dict[int, int],
        audit: str,
        audit_start: dict[int, int],
    ) -> None:
        stream, extra = self.require(self.stream), self.latency_stream
        firsts = stream.unique + (extra.unique if extra else 0)
        duplicates = stream.duplicates + (extra.duplicates if extra else 0)
        command_keys: Counter[bytes] = Counter()
        outcomes: Counter[str] = Counter()
        args = self.args
        await scan(
            args.bootstrap,
            commands,
            commands_start,
            on_record=lambda r: command_keys.update((r.key,)),
            timeout=300,
        )
        await scan(
            args.bootstrap,
            audit,
            audit_start,
            on_record=lambda r: outcomes.update((orjson.loads(r.value)["outcome"],)),
            timeout=300,
        )
        repeated = sum(1 for c in command_keys.values() if c > 1)
        result.checks = {
            "commands": sum(command_keys.values()),
            "distinct command keys": len(command_keys),
            "keys with >1 command": repeated,
            "audit outcomes": dict(outcomes),
            "expected firsts": firsts,
            "expected duplicates": duplicates,
            "ok": (
                sum(command_keys.values()) == firsts
                and repeated == 0
                and outcomes.get("first", 0) == firsts
                and outcomes.get("duplicate", 0) == duplicates
                and sum(outcomes.values()) == firsts + duplicates
            ),
        }

    @staticmethod
    def require(value: Stream | None) -> Stream:
        if value is None:
            raise BenchError("no data generated")
        return value

    # -- the run ------------------------------------------------------------------------------------------
    async def run(self) -> list[Result]:
        args = self.args
        task = asyncio.current_task()
        if task is not None:  # SIGTERM cleans up like Ctrl-C does
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        info = machine_info()
        say(
            f"worker bench {self.run_id}: {args.events:,} events, {args.partitions} partitions, "
            f"{args.dup_ratio:.0%} duplicates, preload {args.preload:,}, latency {args.latency_rate:,.0f}/s "
            f"for {args.latency_seconds:g}s; load average {loadavg()}; work dir {self.work}"
        )
        say("machine: " + "; ".join(f"{k} {v}" for k, v in info.items()))
        rng = random.Random(args.seed)
        began = time.monotonic()
        self.stream = make_stream(rng, args.events, args.dup_ratio, min_size=1024, max_size=2048)
        say(
            f"generated {len(self.stream):,} records ({self.stream.unique:,} unique, "
            f"{self.stream.duplicates:,} re-sent), {self.stream.body_bytes() / 2**20:.0f} MiB of bodies, "
            f"in {time.monotonic() - began:.1f}s"
        )
        latency_total = int(args.latency_rate * args.latency_seconds)
        if latency_total > 0:
            self.latency_stream = make_stream(
                random.Random(args.seed + 2), latency_total, args.dup_ratio, min_size=1024, max_size=2048
            )
        await self.broker.start()
        try:
            for name in args.only:
                label = {
                    "passthrough": "passthrough (aiokafka, at least once)",
                    "worker": "worker (exactly once, empty store)",
                    "worker-preloaded": f"worker, {args.preload:,} keys in store",
                }[name]
                result = Result(name, label)
                self.results.append(result)
                say(f"== {label}")
                try:
                    if name == "passthrough":
                        await self.run_passthrough(result)
                    elif name == "worker":
                        await self.run_worker(result)
                    else:
                        await self.run_worker(result, preload=args.preload)
                except (BenchError, KafkaError, OSError) as exc:
                    result.error = str(exc) or repr(exc)
                    say(f"  {name} FAILED: {result.error}")
                finally:
                    await self.stop_all()
                if result.checks:
                    status = "ok" if result.checks.get("ok") else "MISMATCH"
                    say(f"  output check {status}: {json.dumps(result.checks, default=str)}")
                for line in result.warnings:
                    say(f"  log: {line}")
        finally:
            await self.stop_all()
            await self.broker.delete_created()
            await self.broker.stop()
            for path in self.work.glob("*-state"):
                if not args.keep_state:
                    shutil.rmtree(path, ignore_errors=True)
        print_table(self.args, self.results, info, self.work)
        if args.json:
            Path(args.json).write_text(
                json.dumps(
                    {
                        "run": self.run_id,
                        "argv": sys.argv,
                        "machine": info,
                        "summary": summary(self.results),
                        "results": [asdict(r) for r in self.results],
                    },
                    indent=2,
                    default=str,
                )
            )
            say(f"results written to {args.json}")
        return self.results


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/worker_bench.py",
        description="Worker benchmark: the exactly-once dedupe worker against a plain aiokafka passthrough.",
    )
    parser.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    parser.add_argument("--events", type=int, default=200_000, help="backlog records per contender")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--dup-ratio", type=float, default=0.3, help="share of records that are re-sends")
    parser.add_argument(
        "--preload", type=int, default=1_000_000, help="keys in the store for worker-preloaded"
    )
    parser.add_argument("--latency-rate", type=float, default=2000, help="events/s in the latency phase")
    parser.add_argument("--latency-seconds", type=float, default=10, help="0 skips the latency phase")
    parser.add_argument(
        "--commit-interval-ms", type=int, default=None, help="the worker's (default: its own, 1000)"
    )
    parser.add_argument("--max-batch", type=int, default=None, help="the worker's (default: its own, 10000)")
    parser.add_argument("--passthrough-commit-ms", type=int, default=1000)
    parser.add_argument(
        "--drain-timeout", type=float, default=None, help="seconds per backlog (default scales)"
    )
    parser.add_argument(
        "--only",
        default=",".join(DEFAULT_CONTENDERS),
        help=f"comma-separated, of {CONTENDERS} (default: the first three)",
    )
    parser.add_argument("--quick", action="store_true", help="20k events, 50k preload, 3 s of latency")
    parser.add_argument("--seed", type=int, default=20241130)
    parser.add_argument("--work-dir", default=None, help="logs and stores (default: a new temp dir)")
    parser.add_argument("--keep-state", action="store_true", help="keep the RocksDB stores")
    parser.add_argument(
        "--profile-worker",
        action="store_true",
        help="run the workers under pyinstrument (pip install pyinstrument; profile only, not for the table)",
    )
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.events, args.preload, args.latency_seconds = 20_000, 50_000, 3
    args.only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = set(args.only) - set(CONTENDERS)
    if unknown:
        parser.error(f"unknown contenders {sorted(unknown)}; choose from {CONTENDERS}")
    if args.drain_timeout is None:
        args.drain_timeout = max(120.0, args.events / 200)
    return args
