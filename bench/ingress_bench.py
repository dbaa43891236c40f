"""Benchmark the HTTP ingress against a bare aiohttp handler (run by hand, not a test).

    python bench/ingress_bench.py --bootstrap 127.0.0.1:19092 --requests 20000 --concurrency 64
    python bench/ingress_bench.py --bootstrap 127.0.0.1:19092 --rounds 5   # interleaved, then medians

The servers run in this process, one after the other, each on its own event loop: a bare
aiohttp app whose handler reads the body and answers 200 (on asyncio's loop, as aiohttp
comes, which is every ratio's baseline; and on uvloop), and the real ingress (Stripe
signature check, key extraction, idempotent ``acks=all`` produce, 202 after the broker's
ack) writing to fresh topics on the given broker, on uvloop (its default) and on asyncio's
loop. The load generator runs in a second process (this
script with ``--load``): an aiohttp client with N concurrent connections to 127.0.0.1
only, a bounded request count and a time limit. Every request carries a distinct,
validly signed Stripe event, pre-signed before the clock starts. The table gives
requests/s, p50 and p99 latency, and each row's throughput relative to bare aiohttp.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.lib.report import machine_info  # noqa: E402
from bench.lib.topology_file import write_topology  # noqa: E402
from pipeline import topology  # noqa: E402
from pipeline.ingress.event_loop import loop_factory  # noqa: E402
from pipeline.ingress.server import Ingress, IngressSettings  # noqa: E402
from pipeline.kafka.admin import admin_client, ensure_topics, topic_specs  # noqa: E402
from pipeline.providers.signing import sign  # noqa: E402

SECRET = "whsec_bench_secret_0123456789abcdef"
SECRET_ENV = "PIPELINE_BENCH_STRIPE_SECRET"


# -- the load generator (second process) -------------------------------------------------
def _requests(count: int, prefix: str, timestamp: float) -> list[tuple[bytes, dict[str, str]]]:
    out = []
    for i in range(count):
        body = json.dumps(
            {
                "id": f"evt_{prefix}_{i}",
                "object": "event",
                "type": "invoice.paid",
                "created": int(timestamp),
                "data": {"object": {"id": f"in_{i}", "object": "invoice", "amount_paid": 4200}},
            }
        ).encode()
        headers = sign("stripe", body, SECRET, timestamp=timestamp)
        headers["Content-Type"] = "application/json"
        out.append((body, headers))
    return out


async def _load(url: str, count: int, concurrency: int, max_seconds: float, warmup: int) -> dict[str, object]:
    if not url.startswith("http://127.0.0.1:"):
        raise SystemExit("the load generator only targets 127.0.0.1")
    prefix = uuid.uuid4().hex[:8]
    batch = _requests(count + warmup, prefix, time.time())
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    errors = 0
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(body: bytes, headers: dict[str, str], record: bool) -> None:
            nonlocal errors
            started = time.perf_counter()
            try:
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
                    status = response.status
            except (aiohttp.ClientError, TimeoutError):
                errors += 1
                return
            if record:
                latencies.append(time.perf_counter() - started)
                statuses[status] = statuses.get(status, 0) + 1

        await asyncio.gather(*(one(b, h, False) for b, h in batch[:warmup]))
        work = iter(batch[warmup:])
        deadline = time.monotonic() + max_seconds

        async def worker() -> None:
            for body, headers in work:
                if time.monotonic() > deadline:
                    return
                await one(body, headers, True)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    latencies.sort()

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000 if latencies else 0.0

    return {
        "done": len(latencies),
        "elapsed": elapsed,
        "rps": len(latencies) / elapsed if elapsed else 0.0,
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "statuses": statuses,
        "errors": errors,
    }


def _run_load(url: str, args: argparse.Namespace) -> dict[str, object]:
    """Run the load generator in a second process and return its result."""
    command = [
        sys.executable,
        __file__,
        "--load",
        url,
        "--requests",
        str(args.requests),
        "--concurrency",
        str(args.concurrency),
        "--max-seconds",
        str(args.max_seconds),
        "--warmup",
        str(args.warmup),
    ]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# -- the servers (this process) -------------------------------------------------------------
async def _bare_server() -> tuple[web.AppRunner, int]:
    async def handler(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/webhooks/{source}", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, int(runner.addresses[0][1])


async def _run_in_background(url: str, args: argparse.Namespace) -> dict[str, object]:
    """The load against ``url``, and the server's CPU per request (this process serves; the load is another)."""
    cpu = time.process_time()
    result = await asyncio.to_thread(_run_load, url, args)
    served = int(result["done"]) + args.warmup  # type: ignore[call-overload]
    result["cpu_us"] = (time.process_time() - cpu) / max(served, 1) * 1e6
    return result


async def _bare(args: argparse.Namespace) -> dict[str, object]:
    runner, port = await _bare_server()
    try:
        return await _run_in_background(f"http://127.0.0.1:{port}/webhooks/stripe", args)
    finally:
        await runner.cleanup()


async def _ingress(args: argparse.Namespace, event_loop: str) -> dict[str, object]:
    os.environ[SECRET_ENV] = SECRET
    app = f"bench-ingress-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as tmp:
        path = write_topology(Path(tmp) / f"{app}.toml", app, args.partitions, secret_env=SECRET_ENV)
        specs = topic_specs(topology.load(path))
        await ensure_topics(args.bootstrap, specs)
        try:
            settings = IngressSettings(bootstrap=args.bootstrap, topology=path, port=0, event_loop=event_loop)
            ingress = Ingress(settings)
            await ingress.start()
            serving = asyncio.create_task(ingress.run())
            try:
                return await _run_in_background(f"http://127.0.0.1:{ingress.port}/webhooks/stripe", args)
            finally:
                ingress.stop()
                await serving
        finally:
            async with admin_client(args.bootstrap) as admin:
                await admin.delete_topics([s.name for s in specs])


#: (row, server, event loop): the first row is the baseline of every ratio: aiohttp as it comes.
ROWS = (
    ("bare aiohttp", "bare", "asyncio"),
    ("bare aiohttp, uvloop", "bare", "uvloop"),
    ("ingress (default: uvloop)", "ingress", "uvloop"),
    ("ingress, asyncio loop", "ingress", "asyncio"),
)


def _bench(args: argparse.Namespace) -> list[tuple[str, dict[str, object]]]:
    """Each row's server on its own event loop, one after the other."""
    results: list[tuple[str, dict[str, object]]] = []
    for name, server, event_loop in ROWS:
        if server == "ingress" and args.skip_ingress_asyncio and event_loop == "asyncio":
            continue
        with asyncio.Runner(loop_factory=loop_factory(event_loop)) as runner:
            coro = _bare(args) if server == "bare" else _ingress(args, event_loop)
            results.append((name, runner.run(coro)))
    return results


def _table(results: list[tuple[str, dict[str, object]]]) -> str:
    base = float(results[0][1]["rps"])  # type: ignore[arg-type]
    base_cpu = float(results[0][1]["cpu_us"])  # type: ignore[arg-type]
    lines = [
        "| server | req/s | p50 ms | p99 ms | ratio | server CPU µs/request | CPU ratio | requests | statuses |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, r in results:
        rps = float(r["rps"])  # type: ignore[arg-type]
        statuses = ", ".join(f"{k}: {v}" for k, v in sorted(dict(r["statuses"]).items()))  # type: ignore[call-overload]
        if r["errors"]:
            statuses += f", errors: {r['errors']}"
        lines.append(
            f"| {name} | {rps:,.0f} | {float(r['p50_ms']):.2f} | {float(r['p99_ms']):.2f} "  # type: ignore[arg-type]
            f"| {rps / base if base else 0:.2f} | {float(r['cpu_us']):.0f} "  # type: ignore[arg-type]
            f"| {base_cpu / float(r['cpu_us']):.2f} | {r['done']} | {statuses} |"  # type: ignore[arg-type]
        )
    return "\n".join(lines)


def _summary(rounds: list[list[tuple[str, dict[str, object]]]]) -> str:
    """Per row: each round's ratio to that round's baseline, and the medians (the machine is shared)."""
    lines = [
        "| server | median req/s | median CPU µs/request | ratio per round | median ratio | median CPU ratio |",
        "|---|---:|---:|---|---:|---:|",
    ]
    for index, (name, _) in enumerate(rounds[0]):
        rps = [float(r[index][1]["rps"]) for r in rounds]  # type: ignore[arg-type]
        cpu = [float(r[index][1]["cpu_us"]) for r in rounds]  # type: ignore[arg-type]
        ratios = [float(r[index][1]["rps"]) / float(r[0][1]["rps"]) for r in rounds]  # type: ignore[arg-type]
        cpu_ratios = [float(r[0][1]["cpu_us"]) / float(r[index][1]["cpu_us"]) for r in rounds]  # type: ignore[arg-type]
        lines.append(
            f"| {name} | {statistics.median(rps):,.0f} | {statistics.median(cpu):.0f} "
            f"| {', '.join(f'{x:.2f}' for x in ratios)} | {statistics.median(ratios):.2f} "
            f"| {statistics.median(cpu_ratios):.2f} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    parser.add_argument("--requests", type=int, default=20000, help="measured requests per server")
    parser.add_argument("--concurrency", type=int, default=64, help="concurrent connections")
    parser.add_argument("--max-seconds", type=float, default=120.0, help="time limit per server")
    parser.add_argument("--warmup", type=int, default=500, help="unmeasured requests first")
    parser.add_argument("--partitions", type=int, default=6, help="input partitions of the bench topics")
    parser.add_argument(
        "--skip-ingress-asyncio", action="store_true", help="leave out the ingress row on asyncio's loop"
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="run every row this many times, interleaved; then medians"
    )
    parser.add_argument("--load", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.load:
        result = asyncio.run(_load(args.load, args.requests, args.concurrency, args.max_seconds, args.warmup))
        print(json.dumps(result))
        return 0
    print("machine: " + "; ".join(f"{k} {v}" for k, v in machine_info().items()))
    print(
        f"command: python bench/ingress_bench.py --bootstrap {args.bootstrap} "
        f"--requests {args.requests} --concurrency {args.concurrency} --rounds {args.rounds}"
    )
    rounds: list[list[tuple[str, dict[str, object]]]] = []
    for number in range(1, args.rounds + 1):
        rounds.append(_bench(args))
        if args.rounds > 1:
            print(f"round {number} of {args.rounds}:")
        print(_table(rounds[-1]))
    if args.rounds > 1:
        print(f"over {args.rounds} rounds (each round's ratios against its own bare aiohttp row):")
        print(_summary(rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
