"""The ``pipeline`` parser and entry point: every failure ends in one line on stderr and a non-zero exit."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from pipeline import __version__
from pipeline.cli.logs import LIBRARY_LOG_ENV, QUIET, configure, level_number
from pipeline.cli.services import add_service_commands, cmd_topics, cmd_worker
from pipeline.cli.settings import Handler, SettingsParser, add_common, add_worker_settings, env_default
from pipeline.cli.tools import add_dlq_commands, add_tool_commands, cmd_init
from pipeline.errors import PipelineError
from pipeline.resources import resolve_topology


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = SettingsParser(prog="pipeline", description="Handle every webhook exactly once.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--log-level",
        type=_level,
        default=env_default("PIPELINE_LOG_LEVEL", "INFO"),
        help="the pipeline's own lines (env PIPELINE_LOG_LEVEL, default %(default)s)",
    )
    parser.add_argument(
        "--library-log-level",
        type=_level,
        default=env_default(LIBRARY_LOG_ENV, QUIET),
        help=f"the Kafka client's (aiokafka's) lines, e.g. info or error (env {LIBRARY_LOG_ENV},"
        " default %(default)s: the one-line errors say what went wrong)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    init = commands.add_parser("init", help="write a starter topology and a .env template into DIR")
    init.add_argument("dir", nargs="?", default=".", help="default: the current directory")
    init.add_argument(
        "--app", default="webhooks", help="app name, also the topic names' prefix (default %(default)s)"
    )
    init.add_argument("--force", action="store_true", help="overwrite files that exist")
    init.set_defaults(handler=cmd_init)

    topics = commands.add_parser("topics", help="manage the pipeline's topics")
    topics_commands = topics.add_subparsers(dest="topics_command", required=True, metavar="ACTION")
    create = topics_commands.add_parser("create", help="create the topics (idempotent)")
    add_common(create)
    create.add_argument(
        "--partitions", type=int, default=None, help="partition count (default: the topology's)"
    )
    create.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the broker")
    create.set_defaults(handler=cmd_topics)

    worker = commands.add_parser(
        "worker", help="run a dedupe worker (joins the consumer group)", populate=add_worker_settings
    )
    worker.set_defaults(handler=cmd_worker)

    add_service_commands(commands)
    add_tool_commands(commands)
    add_dlq_commands(commands)
    return parser


def _level(text: str) -> str:
    """A log level's name as given (``info``, ``DEBUG``, ``off``); a usage error otherwise."""
    try:
        level_number(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text.strip().upper()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    configure(args.log_level, args.library_log_level)
    handler: Handler = args.handler
    try:
        if getattr(args, "topology", None) is not None:  # a bare name or a missing default: the packaged one
            args.topology = str(resolve_topology(args.topology))
        return handler(args)
    except PipelineError as exc:
        print(f"pipeline: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
