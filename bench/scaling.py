"""How the worker scales: partitions per process, worker processes, and a 10-million-key store.

    .venv/bin/python bench/scaling.py --bootstrap 127.0.0.1:19092 --events 200000
    .venv/bin/python bench/scaling.py --bootstrap 127.0.0.1:19092 --quick          # a few minutes

One run, one broker, the workload of ``bench/worker_bench.py`` (1-2 KB
Stripe-like bodies, 30% duplicates, the same records for every row), each row
on fresh topics with a backlog produced before the contender starts:

- ``passthrough``: the aiokafka consume -> produce ceiling at 4 partitions
  (``bench/passthrough.py``), the denominator of "ratio";
- ``1 process x P partitions`` for P = 1, 2, 4: one worker process owning P
  partitions (partitions per process);
- ``N processes x 6 partitions`` for N = 1, 2, 3: N worker processes in one
  consumer group sharing 6 partitions (6, 3 and 2 partitions per process);
  this is how the worker scales on one machine: one process per core;
- ``--processes 2 x 6 partitions``: the same two processes started by one
  ``pipeline worker --processes 2`` (its supervisor, ``pipeline/worker/supervisor.py``),
  next to ``1 process x 6 partitions``; CPU is the supervisor's and its children's;
- ``10,000,000 keys in store``: 1 process x 4 partitions whose RocksDB stores
  already hold ``--store-keys`` keys, written straight into each partition's
  store (with the owning partition, a live expiry and the store's recorded
  changelog offset left at "nothing to restore"), against the same row with
  an empty store. The stream's keys are all new to that store, so every first
  copy is a lookup that misses among 10M keys: the Bloom filters' case.

Every row's processes start on an empty input topic; the backlog is produced
once the group has given each process its share of the partitions, so a row
measures the steady state, not the start-up rebalances. Throughput is the
backlog drain as the group's committed offsets show it
(what a read_committed reader can act on); CPU s/100k is summed over the
worker processes; peak RSS is the largest process's. Every worker row is
checked afterwards: one command per unique key and exact audit counts.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import shutil
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: bench.lib
from bench.lib import broker, phases, report, topology_file, worker_runs, worker_table, workload
from bench.lib import procs as processes
from pipeline import topology
from pipeline.kafka.admin import topic_specs
from pipeline.kafka.partitioner import owner_partition
from pipeline.state.decision import Entry
from pipeline.state.store import Change, PartitionStore, bucket_width

TTL_MS = 7 * 86_400_000  # worker_bench's topology: ttl = "7d"
WRITE_BATCH = 50_000


@dataclass(frozen=True)
class Row:
    name: str
    label: str
    processes: int = 1
    partitions: int = 4
    store_keys: int = 0
    supervised: bool = False  # one ``pipeline worker --processes N`` instead of N commands


def child_pids(parent: int) -> list[int]:
    """The live child processes of ``parent`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == parent and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return sorted(found)


class Supervised:
    """``pipeline worker --processes N`` seen by ``bench.lib.phases.drain``: CPU of the supervisor and its children."""

    def __init__(self, proc: processes.Proc) -> None:
        self.proc = proc
        self.started = proc.started

    def check(self) -> None:
        self.proc.check()

    def cpu_seconds(self) -> float:
        total = self.proc.cpu_seconds()
        for pid in child_pids(self.proc.pid):
            try:
                total += report.pid_cpu_seconds(pid)
            except OSError:  # exited in between
                continue
        return total

    def peak_rss_kib(self) -> int:
        """The largest child's VmHWM."""
        peaks = [0]
        for pid in child_pids(self.proc.pid):
            try:
                text = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            peaks += [int(line.split()[1]) for line in text.splitlines() if line.startswith("VmHWM:")]
        return max(peaks)


class Procs:
    """Several worker processes seen as one by ``bench.lib.phases.drain`` (CPU summed)."""

    def __init__(self, procs: list[processes.Proc]) -> None:
        self.procs = procs
        self.started = min(p.started for p in procs)

    def check(self) -> None:
        for proc in self.procs:
            proc.check()

    def cpu_seconds(self) -> float:
        return sum(p.cpu_seconds() for p in self.procs)


def assigned_partitions(port: int) -> int:
    """``pipeline_assigned_partitions`` from a worker's /metrics (0 while it is not serving yet)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return 0
    found = re.search(r"^pipeline_assigned_partitions (\S+)$", text, re.MULTILINE)
    return int(float(found.group(1))) if found else 0


async def wait_for_spread(procs: Procs, ports: list[int], partitions: int, *, timeout: float) -> None:
    """Until every process owns a share of the partitions and together they own all of them."""
    deadline = time.monotonic() + timeout
    while True:
        procs.check()
        counts = [await asyncio.to_thread(assigned_partitions, port) for port in ports]
        if sum(counts) == partitions and all(counts):
            report.say(f"  partitions per process: {counts}")
            return
        if time.monotonic() > deadline:
            raise report.BenchError(
                f"the group did not spread {partitions} partitions in {timeout:.0f}s: {counts}"
            )
        await asyncio.sleep(0.5)


def fill_stores(state: Path, input_topic: str, partitions: int, keys: int, *, now_ms: int) -> float:
    """Write ``keys`` live entries into the partitions' stores as the worker lays them out; returns seconds."""
    began = time.monotonic()
    width = bucket_width(TTL_MS)
    stores = [PartitionStore.open(state / f"{input_topic}-{p}", bucket_ms=width) for p in range(partitions)]
    pending: list[dict[bytes, Change]] = [{} for _ in range(partitions)]
    last_report = began
    try:
        for n in range(keys):
            key = f"stripe:evt_pre{n:012d}".encode()  # never one of the stream's keys (evt_ + random)
            seen = now_ms - 86_400_000 + n % 86_400_000  # first seen within the last day: alive for days
            entry = Entry(
                first_seen=seen,
                expires_at=seen + TTL_MS,
                partition=0,
                offset=n,
                last_seen=seen,
                command="handle",
            )
            part = owner_partition(key, partitions)
            batch = pending[part]
            batch[key] = Change.of(entry)
            if len(batch) >= WRITE_BATCH:
                stores[part].write(batch, changelog_offset=None, stream_time=now_ms - 86_400_000)
                pending[part] = {}
            if time.monotonic() - last_report >= 10:
                last_report = time.monotonic()
                report.say(f"  store fill: {n:,}/{keys:,} keys ({n / (last_report - began):,.0f}/s)")
        for part, batch in enumerate(pending):
            if batch:
                stores[part].write(batch, changelog_offset=None, stream_time=now_ms - 86_400_000)
        counts = [store.key_count() for store in stores]
    finally:
        for store in stores:
            store.close()
    report.say(f"  store fill: {keys:,} keys written (estimated per partition: {counts})")
    return time.monotonic() - began


class Scaling:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.bench = worker_runs.Bench(args)

    async def run_worker_row(self, row: Row, result: phases.Result) -> None:
        bench, args = self.bench, self.args
        stream = bench.require(bench.stream)
        app = bench.app(row.name)
        topo_path = topology_file.write_topology(bench.work / f"{app}.toml", app, row.partitions)
        topo = topology.load(topo_path)
        topics = topo.topics
        group, state = f"{app}-group", bench.work / f"{row.name}-state"
        await bench.broker.create(topic_specs(topo, row.partitions))
        if row.store_keys:
            seconds = fill_stores(
                state, topics.input, row.partitions, row.store_keys, now_ms=int(time.time() * 1000)
            )
            result.preload = {
                "keys": row.store_keys,
                "seconds": round(seconds, 1),
                "store_disk_mib": round(report.dir_bytes(state) / 2**20, 1),
            }
        commands_start = await bench.broker.end_offsets(topics.commands)
        audit_start = await bench.broker.end_offsets(topics.audit)
        if row.supervised:
            await self.run_supervised_row(row, result, topo_path, state, group)
            await bench.check_worker(result, topics.commands, commands_start, topics.audit, audit_start)
            return
        ports = [processes.free_port() for _ in range(row.processes)]
        procs = [
            bench.start(
                f"{row.name}-{i}",
                [
                    *bench.worker_argv(topo_path, state, group),
                    "--metrics-port",
                    str(port),
                    "--instance-id",
                    f"{app}-{i}",
                ],
            )
            for i, port in enumerate(ports)
        ]
        result.log = str(procs[0].log_path)
        # The drain is timed once the group has spread the partitions: the start-up rebalances of
        # several processes joining one after another are not what this row measures.
        await wait_for_spread(Procs(procs), ports, row.partitions, timeout=60)
        await broker.produce_backlog(
            args.bootstrap, topics.input, row.partitions, stream.records(), len(stream), f"{row.name} backlog"
        )
        start = dict.fromkeys(range(row.partitions), 0)

        async def handled() -> int:
            return await bench.committed_progress(group, topics.input, start)

        result.drain = await phases.drain(
            Procs(procs),  # type: ignore[arg-type]
            handled,
            len(stream),
            timeout=args.drain_timeout,
            label=row.name,
            broker_pid=bench.broker_pid,
        )
        worker_table.report_drain(result)
        result.peak_rss_mib = max(p.status_kib("VmHWM") for p in procs) / 1024
        for proc in procs:
            code = await proc.stop()
            result.warnings += report.log_findings(proc.log_path)
            if code not in (0, None):
                result.warnings.append(f"{proc.name}: exit status {code}")
        await bench.check_worker(result, topics.commands, commands_start, topics.audit, audit_start)

    async def run_supervised_row(
        self, row: Row, result: phases.Result, topo_path: Path, state: Path, group: str
    ) -> None:
        """One ``pipeline worker --processes N``; its children take metrics ports base + i."""
        bench, args = self.bench, self.args
        stream = bench.require(bench.stream)
        topics = topology.load(topo_path).topics
        base = processes.free_port_pair() if row.processes == 2 else processes.free_port()
        sup = bench.start(
            row.name,
            [
                *bench.worker_argv(topo_path, state, group),
                "--processes",
                str(row.processes),
                "--metrics-port",
                str(base),
                "--instance-id",
                bench.app(row.name),
            ],
        )
        result.log = str(sup.log_path)
        supervised = Supervised(sup)
        ports = [base + i for i in range(row.processes)]
        await wait_for_spread(supervised, ports, row.partitions, timeout=90)  # type: ignore[arg-type]
        await broker.produce_backlog(
            args.bootstrap, topics.input, row.partitions, stream.records(), len(stream), f"{row.name} backlog"
        )
        start = dict.fromkeys(range(row.partitions), 0)

        async def handled() -> int:
            return await bench.committed_progress(group, topics.input, start)

        result.drain = await phases.drain(
            supervised,  # type: ignore[arg-type]
            handled,
            len(stream),
            timeout=args.drain_timeout,
            label=row.name,
            broker_pid=bench.broker_pid,
        )
        worker_table.report_drain(result)
        result.peak_rss_mib = supervised.peak_rss_kib() / 1024
        code = await sup.stop(timeout=45)
        result.warnings += report.log_findings(sup.log_path)
        if code != 0:
            result.warnings.append(f"{sup.name}: exit status {code}")

    def rows(self) -> list[Row]:
        keys = self.args.store_keys
        rows = [
            Row("worker-1x1", "1 process x 1 partition", 1, 1),
            Row("worker-1x2", "1 process x 2 partitions", 1, 2),
            Row("worker-1x4", "1 process x 4 partitions (empty store)", 1, 4),
            Row("worker-1x6", "1 process x 6 partitions", 1, 6),
            Row("worker-2x6", "2 processes x 6 partitions (3 each)", 2, 6),
            Row("worker-3x6", "3 processes x 6 partitions (2 each)", 3, 6),
            Row("worker-sup2x6", "--processes 2 x 6 partitions (one command)", 2, 6, supervised=True),
            Row("worker-keys", f"1 process x 4 partitions, {keys:,} keys in store", 1, 4, keys),
        ]
        return [r for r in rows if not self.args.only or r.name in self.args.only]

    async def run(self) -> int:
        bench, args = self.bench, self.args
        info = report.machine_info()
        report.say(f"scaling bench {bench.run_id}: {args.events:,} events; work dir {bench.work}")
        report.say("machine: " + "; ".join(f"{k} {v}" for k, v in info.items()))
        bench.stream = workload.make_stream(
            random.Random(args.seed), args.events, args.dup_ratio, min_size=1024, max_size=2048
        )
        await bench.broker.start()
        try:
            if not args.only or "passthrough" in args.only:
                result = phases.Result("passthrough", "passthrough (aiokafka, at least once), 4 partitions")
                bench.results.append(result)
                report.say(f"== {result.label}")
                await self.guarded(result, bench.run_passthrough(result))
            for row in self.rows():
                result = phases.Result(row.name, row.label)
                bench.results.append(result)
                report.say(f"== {row.label}")
                await self.guarded(result, self.run_worker_row(row, result))
                if result.checks:
                    report.say(
                        f"  output check {'ok' if result.checks.get('ok') else 'MISMATCH'}: {result.checks}"
                    )
                for line in result.warnings:
                    report.say(f"  log: {line}")
                shutil.rmtree(bench.work / f"{row.name}-state", ignore_errors=True)
        finally:
            await bench.stop_all()
            await bench.broker.delete_created()
            await bench.broker.stop()
        self.print_table(info)
        return 0 if all(r.error is None and r.checks.get("ok", True) for r in bench.results) else 1

    async def guarded(self, result: phases.Result, work: object) -> None:
        try:
            await work  # type: ignore[misc]
        except (report.BenchError, OSError) as exc:
            result.error = str(exc) or repr(exc)
            report.say(f"  {result.name} FAILED: {result.error}")
        finally:
            await self.bench.stop_all()

    def print_table(self, info: dict[str, str]) -> None:
        results = self.bench.results
        base = next((r.drain for r in results if r.name == "passthrough" and r.drain), None)
        header = ("contender", "events/s", "ratio", "CPU s/100k", "CPU ratio", "peak RSS MiB", "checks")
        rows = []
        for r in results:
            d = r.drain
            rows.append(
                (
                    r.label + (" (FAILED)" if r.error else ""),
                    f"{d.rate:,.0f}" if d else "-",
                    f"{d.rate / base.rate:.2f}" if d and base else "-",
                    f"{d.cpu_per_100k:.1f}" if d else "-",
                    f"{base.cpu_per_100k / d.cpu_per_100k:.2f}" if d and base else "-",
                    f"{r.peak_rss_mib:.0f}",
                    "-" if not r.checks else ("ok" if r.checks.get("ok") else "MISMATCH"),
                )
            )
        print()
        print(f"Worker scaling: {self.args.events:,} events (30% duplicates, 1-2 KB bodies) per row")
        report.print_markdown(header, rows)
        one = next((r.drain for r in results if r.name == "worker-1x6" and r.drain), None)
        sup = next((r.drain for r in results if r.name == "worker-sup2x6" and r.drain), None)
        if one and sup:
            print(
                f"--processes 2: {sup.rate:,.0f} events/s against {one.rate:,.0f} for one process "
                f"x 6 partitions ({sup.rate / one.rate:.2f}x)"
            )
        print(
            "ratio: events/s over the passthrough's; CPU ratio: its CPU s/100k over the row's (summed over processes)"
        )
        print(
            f"machine: {info['nproc']} CPUs ({info['cpu']}), {info['ram']} RAM, Python {info['python']}, "
            f"Kafka {info['kafka']}, {info['libraries']}; load average at end {report.loadavg()}"
        )
        for r in results:
            if r.drain:
                d = r.drain
                print(
                    f"{r.name}: drain {d.seconds:.1f}s, processes {d.cpu_seconds / d.seconds:.0%} of a CPU, "
                    f"broker {d.broker_cpu_seconds / d.seconds:.0%}, all CPUs {d.machine_busy:.0%} busy"
                    + (f"; store {r.preload}" if r.preload else "")
                )
        print(f"logs: {self.bench.work}", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    parser.add_argument("--events", type=int, default=200_000, help="backlog records per row")
    parser.add_argument(
        "--store-keys", type=int, default=10_000_000, help="keys in the store of the last row"
    )
    parser.add_argument(
        "--only", type=lambda s: s.split(","), default=None, help="rows by name, comma-separated"
    )
    parser.add_argument("--quick", action="store_true", help="40k events per row, 1M keys in store")
    parser.add_argument("--seed", type=int, default=20241130)
    parser.add_argument("--work-dir", default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.events, args.store_keys = 40_000, 1_000_000
    # what worker_bench's helpers read
    base = worker_runs.parse_args(
        ["--bootstrap", args.bootstrap, "--partitions", "4", "--latency-seconds", "0"]
    )
    for name, value in vars(base).items():
        if not hasattr(args, name):
            setattr(args, name, value)
    return args


def main() -> int:
    args = parse_args()
    try:
        return asyncio.run(Scaling(args).run())
    except KeyboardInterrupt:
        print("interrupted: processes stopped, topics deleted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
