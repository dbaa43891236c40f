"""The commands that run the pipeline: ``topics create``, ``worker``, ``ingress``, ``rescale``, ``up``."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
from pathlib import Path
from typing import Any

from pipeline.cli.settings import add_ingress_settings, env_default, ingress_settings, worker_settings
from pipeline.errors import PipelineError
from pipeline.service import Service
from pipeline.topology import DEFAULT_TOPOLOGY

# The cyclic GC's first generation runs every 700 allocations by default. A
# worker batch keeps thousands of parsed event trees alive until its commit,
# so each run rescans them (measured with ``bench/hotpath.py``).
# Not much higher than 10,000, though: some of what aiokafka's fetch path
# allocates is freed only by the collector (its fetch buffers, by the look of
# it), and a much higher threshold let a worker's peak RSS triple
# (``bench/worker_bench.py --only worker-preloaded``; docs/benchmarks.md, Worker).
GC_THRESHOLDS = (10_000, 10, 10)


def cmd_topics(args: argparse.Namespace) -> int:
    from aiokafka.errors import KafkaError  # noqa: PLC0415  (no work at import time)

    from pipeline import credentials  # noqa: PLC0415  (no work at import time)
    from pipeline.kafka.admin import (  # noqa: PLC0415  (no work at import time)
        ensure_topics,
        redrive_history_spec,
        topic_specs,
    )

    if args.partitions is not None and args.partitions < 1:
        raise PipelineError(f"--partitions must be a positive integer, got {args.partitions}")
    if not 0 < args.timeout <= 3600:
        raise PipelineError(f"--timeout must be in (0, 3600] seconds, got {args.timeout:g}")
    topo = credentials.load_checked(args.topology, os.environ)
    specs = [*topic_specs(topo, args.partitions), redrive_history_spec(topo)]
    try:
        results = asyncio.run(ensure_topics(args.bootstrap, specs, timeout=args.timeout))
    except KafkaError as exc:
        raise PipelineError(f"Kafka at {args.bootstrap}: {exc}") from None
    for done, result in enumerate(results, 1):
        line = f"[{done}/{len(results)}] {result.action:8} {result.name} ({result.partitions} partitions)"
        print(line + (f"  note: {result.note}" if result.note else ""))
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from aiokafka.errors import KafkaError  # noqa: PLC0415

    from pipeline import credentials, topology  # noqa: PLC0415
    from pipeline.kafka.admin import check_bootstrap  # noqa: PLC0415
    from pipeline.worker.loop import Worker  # noqa: PLC0415

    settings = worker_settings(args)
    topo = credentials.load_checked(settings.topology, os.environ)
    credentials.require_secrets(topo, topology.Verify.WORKER)
    if args.processes > 1:  # before any child starts; one worker is refused where it first connects
        check_bootstrap(settings.bootstrap)
        from pipeline.worker.supervisor import Supervisor, child_specs  # noqa: PLC0415

        specs = child_specs(settings.for_topology(topo.app), args.processes, log_level=args.log_level)
        return asyncio.run(run_service(Supervisor(specs)))
    from pipeline.worker.parent_watch import supervisor_pid  # noqa: PLC0415

    parent = supervisor_pid(os.environ)  # set when a supervisor started this process
    try:
        return asyncio.run(run_service(Worker(settings, topo), supervisor=parent))
    except KafkaError as exc:  # one the worker did not turn into a PipelineError itself
        raise PipelineError(f"Kafka at {settings.bootstrap}: {exc}") from None


async def run_service(service: Service, *, supervisor: int | None = None) -> int:
    """Start ``service``, run it until SIGTERM or SIGINT (or, given the ``supervisor`` pid that
    started this process, until that process is gone), and stop it cleanly."""
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, service.stop)
    if supervisor is None:
        return await _start_and_run(service)
    from pipeline.worker.parent_watch import watch_parent  # noqa: PLC0415

    watch = asyncio.create_task(watch_parent(supervisor, service.stop), name="parent-watch")
    try:
        return await _start_and_run(service)
    finally:
        watch.cancel()


async def _start_and_run(service: Service) -> int:
    # aiokafka logs each failed connection attempt itself; a start that fails is reported by the
    # service's own error in one line, so its client's lines are held back until the start is done
    client_log = logging.getLogger("aiokafka")
    level = client_log.level
    client_log.setLevel(logging.CRITICAL)
    try:
        await service.start()
    finally:
        client_log.setLevel(level)
    tune_gc()
    await service.run()
    return 0


def tune_gc() -> None:
    """Move everything alive after start-up out of the collector's way, and collect less often."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def cmd_ingress(args: argparse.Namespace) -> int:
    from pipeline import credentials  # noqa: PLC0415
    from pipeline.ingress.event_loop import loop_factory  # noqa: PLC0415
    from pipeline.ingress.server import Ingress  # noqa: PLC0415
    from pipeline.kafka.admin import check_bootstrap  # noqa: PLC0415

    settings = ingress_settings(args)
    check_bootstrap(settings.bootstrap)  # before the start's warnings about unset secrets
    topo = credentials.load_checked(settings.topology, os.environ)
    with asyncio.Runner(loop_factory=loop_factory(settings.event_loop)) as runner:
        return runner.run(run_service(Ingress(settings, topo)))


def cmd_rescale(args: argparse.Namespace) -> int:

    from pipeline import topology  # noqa: PLC0415
    from pipeline.ops.rescale import rescale  # noqa: PLC0415

    topo = topology.load(args.topology)
    group = args.group or topo.app
    state = Path(args.state_file or f".state/rescale-{topo.app}-{group}.json")
    print(f"rescaling {topo.topics.input} to {args.partitions} partitions (progress in {state})")
    asyncio.run(rescale(args.bootstrap, topo, partitions=args.partitions, group=group, state_file=state))
    print("done: start the workers (and restart the ingress) now")
    return 0


def cmd_up(args: argparse.Namespace) -> int:

    from pipeline.kafka.admin import check_bootstrap  # noqa: PLC0415
    from pipeline.stack.foreground import run_foreground  # noqa: PLC0415
    from pipeline.stack.up import Up, UpSettings  # noqa: PLC0415

    if args.bootstrap is not None:
        check_bootstrap(args.bootstrap)
    settings = UpSettings(
        topology=Path(args.topology),
        state_dir=Path(args.state_dir),
        bootstrap=args.bootstrap,
        kafka_port=args.kafka_port,
        ingress_port=args.ingress_port,
        metrics_port=args.metrics_port,
        console_port=args.console_port,
        demo=args.demo,
        demo_events=args.demo_events,
    )
    return asyncio.run(run_foreground(Up(settings)))


def cmd_console(args: argparse.Namespace) -> int:
    from pipeline import credentials  # noqa: PLC0415
    from pipeline.console.server import Console  # noqa: PLC0415
    from pipeline.console.settings import TOKENS_ENV, ConsoleSettings, parse_tokens  # noqa: PLC0415
    from pipeline.kafka.admin import check_bootstrap  # noqa: PLC0415

    check_bootstrap(args.bootstrap)
    settings = ConsoleSettings(
        bootstrap=args.bootstrap,
        topology=Path(args.topology),
        host=args.host,
        port=args.port,
        workers=tuple(w.strip() for w in (args.workers or "").split(",") if w.strip()),
        group=args.group or "",
        users=parse_tokens(os.environ.get(TOKENS_ENV)),
        refresh_seconds=args.refresh,
        public_url=args.public_url or "",
    )
    console = Console(settings, credentials.load_checked(settings.topology, os.environ))
    return asyncio.run(run_service(_Announced(console)))


class _Announced:
    """A console that prints its URL once it listens (for a person at the terminal)."""

    def __init__(self, console: Any) -> None:
        self.console = console

    async def start(self) -> None:
        await self.console.start()
        print(f"console on {self.console.where}  (Ctrl-C stops it)", flush=True)

    async def run(self) -> None:
        await self.console.run()

    def stop(self) -> None:
        self.console.stop()


def add_console_command(commands: Any) -> None:
    """``console``."""
    from pipeline.cli.settings import add_common  # noqa: PLC0415

    console = commands.add_parser(
        "console",
        help="serve the operator console: find an event, triage and redrive the DLQ, watch partitions",
    )
    add_common(console)
    console.add_argument(
        "--host",
        default=env_default("PIPELINE_CONSOLE_HOST", "127.0.0.1"),
        help="listen on this address (env PIPELINE_CONSOLE_HOST, default %(default)s); any address but "
        "loopback needs PIPELINE_CONSOLE_TOKENS=name:role:token[,...] (role read or redrive)",
    )
    console.add_argument(
        "--port",
        type=int,
        default=env_default("PIPELINE_CONSOLE_PORT", "8090"),
        help="listen on this port (env PIPELINE_CONSOLE_PORT, default %(default)s; 0: any free port)",
    )
    console.add_argument(
        "--workers",
        default=env_default("PIPELINE_WORKERS", "127.0.0.1:9100"),
        help="worker HTTP endpoints host:port,... (env PIPELINE_WORKERS, default %(default)s)",
    )
    console.add_argument(
        "--group",
        default=env_default("PIPELINE_GROUP"),
        help="the workers' consumer group (env PIPELINE_GROUP, default: the topology's app name)",
    )
    console.add_argument(
        "--refresh",
        type=float,
        default=3.0,
        help="seconds between two samples of the workers (default %(default)s)",
    )
    console.add_argument(
        "--public-url",
        default=env_default("PIPELINE_CONSOLE_PUBLIC_URL"),
        help="where browsers reach the console (https://console.example.com behind a proxy, or by a "
        "name): the only host name it answers to besides loopback (env PIPELINE_CONSOLE_PUBLIC_URL)",
    )
    console.set_defaults(handler=cmd_console)


def add_service_commands(commands: Any) -> None:
    """``ingress``, ``up`` and ``console``."""
    add_console_command(commands)
    ingress = commands.add_parser(
        "ingress", help="run the HTTP ingress: POST /webhooks/{source}", populate=add_ingress_settings
    )
    ingress.set_defaults(handler=cmd_ingress)

    up = commands.add_parser(
        "up", help="run everything on this machine (starts a local Kafka unless --bootstrap)"
    )
    up.add_argument(
        "--bootstrap", default=env_default("KAFKA_BOOTSTRAP_SERVERS"), help="use this Kafka instead"
    )
    up.add_argument(
        "--topology",
        default=env_default("PIPELINE_TOPOLOGY", str(DEFAULT_TOPOLOGY)),
        help="default %(default)s",
    )
    up.add_argument(
        "--state-dir", default=env_default("PIPELINE_STATE_DIR", ".state/up"), help="default %(default)s"
    )
    up.add_argument("--kafka-port", type=int, default=9092, help="local broker port (default %(default)s)")
    up.add_argument("--ingress-port", type=int, default=8080, help="default %(default)s")
    up.add_argument(
        "--metrics-port", type=int, default=9100, help="worker metrics port (default %(default)s)"
    )
    up.add_argument(
        "--console-port",
        type=int,
        default=8090,
        help="the operator console's port, on 127.0.0.1 (default %(default)s; -1: no console)",
    )
    up.add_argument(
        "--demo", action="store_true", help="also send a demo stream of signed webhooks with duplicates"
    )
    up.add_argument(
        "--demo-events", type=int, default=120, help="unique events in the demo (default %(default)s)"
    )
    up.set_defaults(handler=cmd_up)
