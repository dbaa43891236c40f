"""The ``pipeline`` command line.

Every failure the user can cause or fix ends in one readable line on stderr
and a non-zero exit: 1 for a pipeline error, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable, Sequence

from pipeline import __version__
from pipeline.errors import PipelineError

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
DEFAULT_TOPOLOGY = "topologies/default.toml"

Handler = Callable[[argparse.Namespace], int]


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

    return parser


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
