"""The operator tools: ``tail``, ``produce``, ``init``, ``sign``, ``inspect`` and ``dlq list|replay``."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.errors import PipelineError
from pipeline.kafka.settings import READ_TIMEOUT_S
from pipeline.topology import DEFAULT_TOPOLOGY
from pipeline.worker.settings import WORKER_DEFAULTS

if TYPE_CHECKING:
    from pipeline.ops.dlq_records import DlqFilter
from pipeline.cli.services import cmd_rescale
from pipeline.cli.settings import add_common, env_default


def cmd_tail(args: argparse.Namespace) -> int:
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


def cmd_produce(args: argparse.Namespace) -> int:
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


def cmd_init(args: argparse.Namespace) -> int:
    from pipeline.ops.init import init, summary  # noqa: PLC0415

    print("\n".join(summary(init(Path(args.dir), app=args.app, force=args.force))))
    return 0


def cmd_sign(args: argparse.Namespace) -> int:
    from pathlib import Path  # noqa: PLC0415

    from pipeline import topology  # noqa: PLC0415
    from pipeline.ops.sign import sign_file  # noqa: PLC0415

    topo = topology.load(args.topology)
    signed = sign_file(
        topo,
        args.source,
        Path(args.file),
        dict(os.environ),
        base_url=args.url,
        msg_id=args.id,
        event_type=args.event_type,
    )
    print(signed.command)
    print(f"pipeline: {signed.note()}", file=sys.stderr)
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from pipeline import topology  # noqa: PLC0415
    from pipeline.records.lookup import inspect  # noqa: PLC0415

    topo = topology.load(args.topology)
    workers = [w.strip() for w in (args.workers or "").split(",") if w.strip()]
    report = asyncio.run(inspect(args.key, topo, bootstrap=args.bootstrap, workers=workers))
    if args.json:
        from dataclasses import asdict  # noqa: PLC0415

        import orjson  # noqa: PLC0415

        print(orjson.dumps({"status": report.status, **asdict(report)}).decode())
    else:
        print("\n".join(report.lines()))
    return 0 if report.known else 3


def _since(text: str) -> int:
    """``--since`` as ms since the epoch: a duration back from now, or a time (a usage error otherwise)."""
    from datetime import UTC, datetime  # noqa: PLC0415

    from pipeline.ops.dlq_records import parse_since  # noqa: PLC0415

    try:
        return parse_since(text, now=datetime.now(UTC))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seconds(text: str) -> float:
    """A duration on the command line (``90s``, ``2m``; a bare number is seconds), as seconds."""
    from pipeline.durations import parse_duration  # noqa: PLC0415

    try:
        return parse_duration(text).total_seconds()
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _dlq_filter(args: argparse.Namespace) -> DlqFilter:
    from pipeline.ops.dlq_records import DlqFilter, reasons_of, records_of  # noqa: PLC0415

    try:
        records = records_of(getattr(args, "record", None))
    except ValueError as exc:
        raise PipelineError(f"--record: {exc}") from None
    return DlqFilter(reasons=reasons_of(args.reason), key=args.key, since_ms=args.since, records=records)


def cmd_dlq_list(args: argparse.Namespace) -> int:
    from pipeline import topology  # noqa: PLC0415
    from pipeline.ops.dlq import list_dlq  # noqa: PLC0415
    from pipeline.ops.dlq_records import summary  # noqa: PLC0415

    topo = topology.load(args.topology)
    flt = _dlq_filter(args)
    counts = asyncio.run(
        list_dlq(
            args.bootstrap, topo.topics.dlq, flt, out=sys.stdout, as_json=args.json, timeout=args.timeout
        )
    )
    print(summary(counts), file=sys.stderr if args.json else sys.stdout)
    return 0


def cmd_dlq_replay(args: argparse.Namespace) -> int:
    from pipeline import topology  # noqa: PLC0415
    from pipeline.ops.dlq import ProgressLine, replay  # noqa: PLC0415
    from pipeline.ops.dlq_records import summary  # noqa: PLC0415

    topo = topology.load(args.topology)
    progress = ProgressLine(sys.stderr)
    report = asyncio.run(
        replay(
            args.bootstrap,
            topo,
            _dlq_filter(args),
            dry_run=args.dry_run,
            out=sys.stdout,
            progress=progress,
            timeout=args.timeout,
        )
    )
    if progress.shown and sys.stderr.isatty():
        print(file=sys.stderr)
    verb = "would replay" if args.dry_run else "replayed"
    targets = ", ".join(sorted(report.topics)) or topo.topics.input
    print(f"{verb} {summary(report.replayed)} to {targets}; skipped {len(report.skipped)}")
    if report.skipped:
        print(
            f"pipeline: {len(report.skipped)} DLQ records cannot be replayed (the 'skip' lines say why)",
            file=sys.stderr,
        )
        return 1
    return 0


def add_dlq_commands(commands: Any) -> None:
    """``dlq list`` and ``dlq replay``."""
    dlq = commands.add_parser("dlq", help="what the DLQ holds, and replaying it once the cause is fixed")
    actions = dlq.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="one line per DLQ record and a count per reason")
    replay = actions.add_parser(
        "replay",
        help="produce the original records again to the input topic, or the effect stage's to the effects "
        "topic (deduped as usual)",
    )
    for parser in (listing, replay):
        add_common(parser)
        parser.add_argument(
            "--reason",
            action="append",
            help="only this reason, e.g. bad-signature or unknown-source (repeat or comma-separate)",
        )
        parser.add_argument("--key", help="only this key; 'stripe:*' takes a prefix")
        parser.add_argument(
            "--since",
            type=_since,
            help="only records from this time on: '2h', '3d', or '2026-11-30T10:00' (UTC unless it names an offset)",
        )
        parser.add_argument(
            "--record",
            action="append",
            help="only this DLQ record, as PARTITION:OFFSET (repeat or comma-separate), e.g. 0:17",
        )
        parser.add_argument(
            "--timeout",
            type=_seconds,
            default=READ_TIMEOUT_S,
            help="fail (exit 1, saying how far each partition got) when the DLQ read makes no progress "
            f"for this long: the broker away, a partition without a leader (default {READ_TIMEOUT_S:g}s)",
        )
    listing.add_argument("--json", action="store_true", help="print JSON lines (the summary goes to stderr)")
    listing.set_defaults(handler=cmd_dlq_list)
    replay.add_argument(
        "--dry-run", action="store_true", help="print what would be replayed, produce nothing"
    )
    replay.set_defaults(handler=cmd_dlq_replay)


def add_tool_commands(commands: Any) -> None:
    """``inspect``, ``sign``, ``tail`` and ``produce``."""
    inspect = commands.add_parser(
        "inspect", help="what the pipeline knows about an event key or an effect key"
    )
    add_common(inspect)
    inspect.add_argument("key", help="e.g. stripe:evt_123 or fulfil-order:pi_123")
    inspect.add_argument(
        "--workers",
        default=env_default("PIPELINE_WORKERS", "127.0.0.1:9100"),
        help="worker HTTP endpoints host:port,... (env PIPELINE_WORKERS, default %(default)s)",
    )
    inspect.add_argument("--json", action="store_true", help="print JSON")
    inspect.set_defaults(handler=cmd_inspect)

    sign = commands.add_parser(
        "sign", help="print a curl command posting FILE to SOURCE's webhook URL, signed with its secret"
    )
    sign.add_argument("source", help="a source of the topology, e.g. stripe")
    sign.add_argument("file", help="the event body, sent byte for byte")
    sign.add_argument(
        "--topology",
        default=env_default("PIPELINE_TOPOLOGY", str(DEFAULT_TOPOLOGY)),
        help="default %(default)s",
    )
    sign.add_argument(
        "--url",
        default=env_default("PIPELINE_INGRESS_URL", "http://127.0.0.1:8080"),
        help="the ingress (default %(default)s)",
    )
    sign.add_argument("--id", default=None, help="delivery id for header-keyed providers (default: random)")
    sign.add_argument("--event-type", default=None, help="event type header for header-typed providers")
    sign.set_defaults(handler=cmd_sign)

    tail = commands.add_parser("tail", help="print a topic's committed records as JSON lines")
    add_common(tail)
    tail.add_argument("topic")
    tail.add_argument("--follow", "-f", action="store_true", help="keep waiting for new records")
    tail.add_argument("--latest", action="store_true", help="start at the end instead of the beginning")
    tail.set_defaults(handler=cmd_tail)

    rescale = commands.add_parser("rescale", help="raise the partition count safely (workers stopped)")
    add_common(rescale)
    rescale.add_argument("--partitions", type=int, required=True, help="the new partition count")
    rescale.add_argument(
        "--group",
        default=env_default("PIPELINE_GROUP", WORKER_DEFAULTS["group"]),
        help="the workers' group (default: the topology's app name)",
    )
    rescale.add_argument(
        "--state-file", default=None, help="progress file (default .state/rescale-<app>-<group>.json)"
    )
    rescale.set_defaults(handler=cmd_rescale)

    produce = commands.add_parser(
        "produce", help="produce webhooks from a JSON-lines file ({source, headers, body})"
    )
    add_common(produce)
    produce.add_argument("file")
    produce.set_defaults(handler=cmd_produce)
