"""The ``pipeline`` command line.

Every failure the user can cause or fix ends in one readable line on stderr
and a non-zero exit: 1 for a pipeline error, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

from pipeline import __version__
from pipeline.errors import PipelineError
from pipeline.service import Service

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
DEFAULT_TOPOLOGY = "topologies/default.toml"

Handler = Callable[[argparse.Namespace], int]
# The cyclic GC's first generation runs every 700 allocations by default. A
# worker batch keeps thousands of parsed event trees alive until its commit,
# so each run rescans them (5-20% of the worker's CPU, ``bench/hotpath.py``).
# Not much higher than 10,000, though: some of what aiokafka's fetch path
# allocates is freed only by the collector (its fetch buffers, by the look of
# it), and at 50,000 a worker reading 1M small records peaked at 860 MiB RSS
# instead of 290 MiB (``bench/worker_bench.py --only worker-preloaded``).
GC_THRESHOLDS = (10_000, 10, 10)


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name) or default


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bootstrap",
        default=_env("KAFKA_BOOTSTRAP_SERVERS", DEFAULT_BOOTSTRAP),
        help="Kafka bootstrap servers (env KAFKA_BOOTSTRAP_SERVERS, default %(default)s)",
    )
    parser.add_argument(
        "--topology",
        default=_env("PIPELINE_TOPOLOGY", DEFAULT_TOPOLOGY),
        help="topology file (env PIPELINE_TOPOLOGY, default %(default)s)",
    )


def _cmd_topics(args: argparse.Namespace) -> int:
    from pipeline import kafka, topology  # noqa: PLC0415  (no work at import time)

    topo = topology.load(args.topology)
    specs = kafka.topic_specs(topo, args.partitions)
    results = asyncio.run(kafka.ensure_topics(args.bootstrap, specs, timeout=args.timeout))
    for done, result in enumerate(results, 1):
        line = f"[{done}/{len(results)}] {result.action:8} {result.name} ({result.partitions} partitions)"
        print(line + (f"  note: {result.note}" if result.note else ""))
    return 0


def _cmd_worker(args: argparse.Namespace) -> int:
    from pathlib import Path  # noqa: PLC0415

    from pipeline import topology  # noqa: PLC0415
    from pipeline.config import WorkerSettings  # noqa: PLC0415
    from pipeline.worker.loop import Worker  # noqa: PLC0415

    topo = topology.load(args.topology)
    settings = WorkerSettings(
        bootstrap=args.bootstrap,
        topology=Path(args.topology),
        state_dir=Path(args.state_dir),
        group=args.group,
        metrics_port=args.metrics_port,
        commit_interval=args.commit_interval_ms / 1000,
        max_batch=args.max_batch,
        session_timeout_ms=args.session_timeout_ms,
        instance_id=args.instance_id or None,
    )
    return asyncio.run(_run_service(Worker(settings, topo)))


async def _run_service(service: Service) -> int:
    """Start ``service``, run it until SIGTERM or SIGINT, and stop it cleanly."""
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, service.stop)
    await service.start()
    tune_gc()
    await service.run()
    return 0


def tune_gc() -> None:
    """Move everything alive after start-up out of the collector's way, and collect less often."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def _cmd_ingress(args: argparse.Namespace) -> int:
    from pathlib import Path  # noqa: PLC0415

    from pipeline import topology  # noqa: PLC0415
    from pipeline.ingress.server import Ingress, IngressSettings  # noqa: PLC0415

    topo = topology.load(args.topology)
    settings = IngressSettings(
        bootstrap=args.bootstrap,
        topology=Path(args.topology),
        host=args.host,
        port=args.port,
        max_body_bytes=args.max_body_bytes,
        produce_timeout=args.produce_timeout,
        trust_forwarded=args.trust_forwarded,
    )
    return asyncio.run(_run_service(Ingress(settings, topo)))


def _cmd_rescale(args: argparse.Namespace) -> int:
    from pathlib import Path  # noqa: PLC0415

    from pipeline import topology  # noqa: PLC0415
    from pipeline.ops.rescale import rescale  # noqa: PLC0415

    topo = topology.load(args.topology)
    state = Path(args.state_file or f".state/rescale-{topo.app}-{args.group}.json")
    print(f"rescaling {topo.topics.input} to {args.partitions} partitions (progress in {state})")
    asyncio.run(rescale(args.bootstrap, topo, partitions=args.partitions, group=args.group, state_file=state))
    print("done: start the workers (and restart the ingress) now")
    return 0


def _cmd_up(args: argparse.Namespace) -> int:
    from pathlib import Path  # noqa: PLC0415

    from pipeline.ops.up import Up, UpSettings  # noqa: PLC0415

    settings = UpSettings(
        topology=Path(args.topology),
        state_dir=Path(args.state_dir),
        bootstrap=args.bootstrap,
        kafka_port=args.kafka_port,
        ingress_port=args.ingress_port,
        metrics_port=args.metrics_port,
        demo=args.demo,
        demo_events=args.demo_events,
    )
    return asyncio.run(_run_service(Up(settings)))


def _cmd_tail(args: argparse.Namespace) -> int:
    from pipeline.ops.topic_io import tail  # noqa: PLC0415

    asyncio.run(
        tail(
            args.bootstrap,
            args.topic,
            from_beginning=not args.latest,
            follow=args.follow,
            out=sys.stdout.buffer,
        )
    )
    return 0


def _cmd_produce(args: argparse.Namespace) -> int:
    from pathlib import Path  # noqa: PLC0415

    from pipeline import topology  # noqa: PLC0415
    from pipeline.ops.topic_io import print_progress, produce_file  # noqa: PLC0415

    topo = topology.load(args.topology)
    path = Path(args.file)
    if not path.is_file():
        raise PipelineError(f"{path}: no such file")
    produced, problems = asyncio.run(produce_file(args.bootstrap, topo, path, progress=print_progress))
    for problem in problems:
        print(f"pipeline: skipped {problem}", file=sys.stderr)
    print(f"produced {produced} webhooks to {topo.topics.input}; skipped {len(problems)}")
    return 1 if problems else 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    from pipeline import topology  # noqa: PLC0415
    from pipeline.ops.lookup import inspect  # noqa: PLC0415

    topo = topology.load(args.topology)
    workers = [w.strip() for w in (args.workers or "").split(",") if w.strip()]
    report = asyncio.run(inspect(args.key, topo, bootstrap=args.bootstrap, workers=workers))
    if args.json:
        from dataclasses import asdict  # noqa: PLC0415

        import orjson  # noqa: PLC0415

        print(orjson.dumps(asdict(report)).decode())
    else:
        print("\n".join(report.lines()))
    return 0 if report.known else 3


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="pipeline", description=__doc__.splitlines()[1] if __doc__ else None
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--log-level", default=_env("PIPELINE_LOG_LEVEL", "INFO"), help="default %(default)s")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    topics = commands.add_parser("topics", help="manage the pipeline's topics")
    topics_commands = topics.add_subparsers(dest="topics_command", required=True, metavar="ACTION")
    create = topics_commands.add_parser("create", help="create the topics (idempotent)")
    _common(create)
    create.add_argument(
        "--partitions", type=int, default=None, help="partition count (default: the topology's)"
    )
    create.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the broker")
    create.set_defaults(handler=_cmd_topics)

    worker = commands.add_parser("worker", help="run a dedupe worker (joins the consumer group)")
    _common(worker)
    worker.add_argument(
        "--state-dir",
        default=_env("PIPELINE_STATE_DIR", ".state/worker"),
        help="where the RocksDB stores live (env PIPELINE_STATE_DIR, default %(default)s)",
    )
    worker.add_argument(
        "--group",
        default=_env("PIPELINE_GROUP", "webhook-dedupe"),
        help="consumer group (env PIPELINE_GROUP)",
    )
    worker.add_argument(
        "--metrics-port",
        type=int,
        default=int(_env("PIPELINE_METRICS_PORT", "0") or 0) or None,
        help="serve Prometheus metrics on this port (env PIPELINE_METRICS_PORT)",
    )
    worker.add_argument(
        "--commit-interval-ms", type=int, default=100, help="longest a transaction stays open"
    )
    worker.add_argument(
        "--max-batch", type=int, default=2000, help="input records after which a transaction commits"
    )
    worker.add_argument(
        "--session-timeout-ms",
        type=int,
        default=int(_env("PIPELINE_SESSION_TIMEOUT_MS", "10000") or 10000),
        help="how long a silent worker keeps its partitions (env PIPELINE_SESSION_TIMEOUT_MS)",
    )
    worker.add_argument(
        "--instance-id",
        default=_env("PIPELINE_INSTANCE_ID"),
        help="static group membership (env PIPELINE_INSTANCE_ID, e.g. the pod name): a restarted worker "
        "gets its partitions back without a rebalance; a removed one keeps them until the session times out",
    )
    worker.set_defaults(handler=_cmd_worker)

    _add_service_commands(commands)
    _add_tool_commands(commands)
    return parser


def _add_service_commands(commands: Any) -> None:
    """``ingress`` and ``up``."""
    ingress = commands.add_parser("ingress", help="run the HTTP ingress: POST /webhooks/{source}")
    _common(ingress)
    ingress.add_argument(
        "--host", default=_env("PIPELINE_INGRESS_HOST", "127.0.0.1"), help="default %(default)s"
    )
    ingress.add_argument(
        "--port",
        type=int,
        default=int(_env("PIPELINE_INGRESS_PORT", "8080") or 8080),
        help="default %(default)s",
    )
    ingress.add_argument("--max-body-bytes", type=int, default=1024 * 1024, help="larger bodies get 413")
    ingress.add_argument(
        "--produce-timeout", type=float, default=5.0, help="seconds to wait for the broker's ack before 503"
    )
    ingress.add_argument(
        "--trust-forwarded",
        action="store_true",
        help="use X-Forwarded-Proto/Host for signed URLs (behind a proxy)",
    )
    ingress.set_defaults(handler=_cmd_ingress)

    up = commands.add_parser(
        "up", help="run everything on this machine (starts a local Kafka unless --bootstrap)"
    )
    up.add_argument("--bootstrap", default=_env("KAFKA_BOOTSTRAP_SERVERS"), help="use this Kafka instead")
    up.add_argument(
        "--topology", default=_env("PIPELINE_TOPOLOGY", DEFAULT_TOPOLOGY), help="default %(default)s"
    )
    up.add_argument(
        "--state-dir", default=_env("PIPELINE_STATE_DIR", ".state/up"), help="default %(default)s"
    )
    up.add_argument("--kafka-port", type=int, default=9092, help="local broker port (default %(default)s)")
    up.add_argument("--ingress-port", type=int, default=8080, help="default %(default)s")
    up.add_argument(
        "--metrics-port", type=int, default=9100, help="worker metrics port (default %(default)s)"
    )
    up.add_argument(
        "--demo", action="store_true", help="also send a demo stream of signed webhooks with duplicates"
    )
    up.add_argument(
        "--demo-events", type=int, default=120, help="unique events in the demo (default %(default)s)"
    )
    up.set_defaults(handler=_cmd_up)


def _add_tool_commands(commands: Any) -> None:
    """``inspect``, ``tail`` and ``produce``."""
    inspect = commands.add_parser(
        "inspect", help="what the pipeline knows about an event key or an effect key"
    )
    _common(inspect)
    inspect.add_argument("key", help="e.g. stripe:evt_123 or fulfil-order:pi_123")
    inspect.add_argument(
        "--workers",
        default=_env("PIPELINE_WORKERS", "127.0.0.1:9100"),
        help="worker HTTP endpoints host:port,... (env PIPELINE_WORKERS, default %(default)s)",
    )
    inspect.add_argument("--json", action="store_true", help="print JSON")
    inspect.set_defaults(handler=_cmd_inspect)

    tail = commands.add_parser("tail", help="print a topic's committed records as JSON lines")
    _common(tail)
    tail.add_argument("topic")
    tail.add_argument("--follow", "-f", action="store_true", help="keep waiting for new records")
    tail.add_argument("--latest", action="store_true", help="start at the end instead of the beginning")
    tail.set_defaults(handler=_cmd_tail)

    rescale = commands.add_parser("rescale", help="raise the partition count safely (workers stopped)")
    _common(rescale)
    rescale.add_argument("--partitions", type=int, required=True, help="the new partition count")
    rescale.add_argument(
        "--group", default=_env("PIPELINE_GROUP", "webhook-dedupe"), help="the workers' group"
    )
    rescale.add_argument(
        "--state-file", default=None, help="progress file (default .state/rescale-<app>-<group>.json)"
    )
    rescale.set_defaults(handler=_cmd_rescale)

    produce = commands.add_parser(
        "produce", help="produce webhooks from a JSON-lines file ({source, headers, body})"
    )
    _common(produce)
    produce.add_argument("file")
    produce.set_defaults(handler=_cmd_produce)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=str(args.log_level).upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    handler: Handler = args.handler
    try:
        return handler(args)
    except PipelineError as exc:
        print(f"pipeline: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
