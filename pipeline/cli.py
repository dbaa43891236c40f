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
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline import __version__
from pipeline.config import (
    DEFAULT_BOOTSTRAP,
    DEFAULT_TOPOLOGY,
    INGRESS_OPTIONS,
    WORKER_DEFAULTS,
    WORKER_OPTIONS,
    Option,
    WorkerSettings,
)
from pipeline.errors import PipelineError
from pipeline.resources import resolve_topology
from pipeline.service import Service

if TYPE_CHECKING:
    from pipeline.ingress.server import IngressSettings
    from pipeline.ops.dlq_records import DlqFilter

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
        default=_env("PIPELINE_TOPOLOGY", str(DEFAULT_TOPOLOGY)),
        help="topology file (env PIPELINE_TOPOLOGY, default %(default)s)",
    )


# -- settings options: one flag and one environment variable per settings field -------------


@dataclass(frozen=True, slots=True)
class _Setting:
    """A settings option added to a parser: how its text parses, and its default (in the flag's unit)."""

    option: Option
    parse: Callable[[str], Any]
    default: Any


class _Parser(argparse.ArgumentParser):
    """An argument parser whose settings options also read environment variables.

    A settings option missing from the command line takes its variable's value, else
    its default. A variable that does not parse ends the program with one line on
    stderr and exit status 2. ``populate`` adds the options on first use, so a
    command's imports happen only when that command runs or shows its help.
    """

    def __init__(self, *args: Any, populate: Callable[[_Parser], None] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.settings: list[_Setting] = []
        self._populate = populate

    def _ready(self) -> None:
        if self._populate is not None:
            populate, self._populate = self._populate, None
            populate(self)

    def format_help(self) -> str:
        """The help text, settings options included."""
        self._ready()
        return super().format_help()

    def parse_known_args(
        self, args: Iterable[str] | None = None, namespace: Any = None
    ) -> tuple[Any, list[str]]:
        """Parse ``args``; a settings option not given takes its environment variable, else its default."""
        self._ready()
        parsed, extras = super().parse_known_args(args, namespace)
        for setting in self.settings:
            if not hasattr(parsed, setting.option.dest):
                setattr(parsed, setting.option.dest, self._from_env(setting))
        return parsed, extras

    def _from_env(self, setting: _Setting) -> Any:
        text = os.environ.get(setting.option.env, "")
        if not text:
            return setting.default
        try:
            return setting.parse(text)
        except argparse.ArgumentTypeError as exc:
            self.exit(2, f"{self.prog}: error: environment variable {setting.option.env}: {exc}\n")


def _kinds(settings_class: type) -> dict[str, tuple[type, bool]]:
    """Each field's type, and whether it may be None."""
    kinds = {}
    for name, hint in typing.get_type_hints(settings_class).items():
        members = [m for m in typing.get_args(hint) if m is not type(None)]
        kinds[name] = (members[0] if members else hint, len(members) < len(typing.get_args(hint)))
    return kinds


def _text_parser(kind: type, *, optional: bool) -> Callable[[str], Any]:
    """How a flag's or a variable's text becomes the value (a path stays text)."""

    def parse(text: str) -> Any:
        if optional and text.strip().lower() in ({""} if kind is str else {"", "none", "off"}):
            return None
        if kind is bool:
            word = text.strip().lower()
            if word not in {"true", "1", "yes", "on", "false", "0", "no", "off"}:
                raise argparse.ArgumentTypeError(f"{text[:40]!r} is not true or false")
            return word in {"true", "1", "yes", "on"}
        if kind in {int, float}:
            try:
                return kind(text)
            except ValueError:
                what = "an integer" if kind is int else "a number"
                raise argparse.ArgumentTypeError(f"{text[:40]!r} is not {what}") from None
        return text

    return parse


def settings_defaults(settings_class: type, options: Sequence[Option]) -> dict[str, Any]:
    """Each option's default in its flag's unit: the field's dataclass default, else the option's."""
    defaults = {f.name: f.default for f in fields(settings_class) if f.default is not MISSING}
    return {o.field: o.to_flag(defaults.get(o.field, o.default)) for o in options}


def shown(value: Any) -> str:
    """A default as ``--help`` and docs/operations.md show it."""
    if value is None:
        return "none"
    if value == "":
        return "app name"  # the group: empty means the topology's app name
    return str(value).lower() if isinstance(value, bool) else str(value)


def _metavar(option: Option, kind: type) -> str:
    if option.ms or option.field.endswith("_ms"):
        return "MS"
    if option.field.endswith("_bytes"):
        return "BYTES"
    return "SECONDS" if kind is float else option.dest.upper()


def _add_settings(parser: _Parser, settings_class: type, options: Sequence[Option]) -> None:
    """One flag per option, reading its environment variable and showing its default."""
    kinds = _kinds(settings_class)
    defaults = settings_defaults(settings_class, options)
    for option in options:
        kind, optional = kinds[option.field]
        parse = _text_parser(int if option.ms else kind, optional=optional)
        text = f"{option.help} (env {option.env}; default {shown(defaults[option.field])})"
        help_text = text.replace("%", "%%")
        if kind is bool:
            parser.add_argument(
                option.flag,
                dest=option.dest,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=help_text,
            )
        else:
            parser.add_argument(
                option.flag,
                dest=option.dest,
                type=parse,
                default=argparse.SUPPRESS,
                metavar=_metavar(option, kind),
                help=help_text,
            )
        parser.settings.append(_Setting(option, parse, defaults[option.field]))


def _settings_values(
    args: argparse.Namespace, settings_class: type, options: Sequence[Option]
) -> dict[str, Any]:
    kinds = _kinds(settings_class)
    values = {}
    for option in options:
        value = option.to_field(getattr(args, option.dest))
        values[option.field] = Path(value) if kinds[option.field][0] is Path and value is not None else value
    return values


def worker_settings(args: argparse.Namespace) -> WorkerSettings:
    """The worker's settings from parsed ``pipeline worker`` arguments; raise ConfigError if one is out of range."""
    return WorkerSettings(**_settings_values(args, WorkerSettings, WORKER_OPTIONS))


def ingress_settings(args: argparse.Namespace) -> IngressSettings:
    """The ingress's settings from parsed ``pipeline ingress`` arguments; raise ConfigError if one is out of range."""
    from pipeline.ingress.server import IngressSettings  # noqa: PLC0415  (aiohttp: only for the ingress)

    return IngressSettings(**_settings_values(args, IngressSettings, INGRESS_OPTIONS))


def _add_worker_settings(parser: _Parser) -> None:
    _add_settings(parser, WorkerSettings, WORKER_OPTIONS)
    # Not a WorkerSettings field: how many workers this command runs, not how one runs.
    parser.add_argument(
        PROCESSES.flag,
        dest=PROCESSES.dest,
        type=parse_processes,
        default=argparse.SUPPRESS,
        metavar="N",
        help=f"{PROCESSES.help} (env {PROCESSES.env}; default 1)",
    )
    parser.settings.append(_Setting(PROCESSES, parse_processes, 1))


PROCESSES = Option(
    "processes",
    "--processes",
    "PIPELINE_PROCESSES",
    "run N worker processes in one group under a supervisor that restarts a crashed one "
    "(auto: one per CPU); each gets <state-dir>/proc-<i>, metrics port + i and <instance-id>-<i>",
)


def parse_processes(text: str) -> int:
    """``--processes``: a count from 1 to 256, or ``auto`` (one per CPU)."""
    word = text.strip().lower()
    if word == "auto":
        return max(1, min(os.cpu_count() or 1, 256))
    try:
        count = int(word)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a process count or auto") from None
    if not 1 <= count <= 256:
        raise argparse.ArgumentTypeError(f"{count} is not in [1, 256]")
    return count


def _add_ingress_settings(parser: _Parser) -> None:
    from pipeline.ingress.server import IngressSettings  # noqa: PLC0415  (aiohttp: only for the ingress)

    _add_settings(parser, IngressSettings, INGRESS_OPTIONS)


def _cmd_topics(args: argparse.Namespace) -> int:
    from pipeline import kafka, topology  # noqa: PLC0415  (no work at import time)

    if args.partitions is not None and args.partitions < 1:
        raise PipelineError(f"--partitions must be a positive integer, got {args.partitions}")
    if not 0 < args.timeout <= 3600:
        raise PipelineError(f"--timeout must be in (0, 3600] seconds, got {args.timeout:g}")
    topo = topology.load(args.topology, os.environ)
    specs = kafka.topic_specs(topo, args.partitions)
    try:
        results = asyncio.run(kafka.ensure_topics(args.bootstrap, specs, timeout=args.timeout))
    except kafka.KafkaError as exc:
        raise PipelineError(f"Kafka at {args.bootstrap}: {exc}") from None
    for done, result in enumerate(results, 1):
        line = f"[{done}/{len(results)}] {result.action:8} {result.name} ({result.partitions} partitions)"
        print(line + (f"  note: {result.note}" if result.note else ""))
    return 0


def _cmd_worker(args: argparse.Namespace) -> int:
    from aiokafka.errors import KafkaError  # noqa: PLC0415

    from pipeline import credentials, topology  # noqa: PLC0415
    from pipeline.kafka.admin import check_bootstrap  # noqa: PLC0415
    from pipeline.worker.loop import Worker  # noqa: PLC0415

    settings = worker_settings(args)
    topo = topology.load(settings.topology, os.environ)
    credentials.require_secrets(topo, topology.Verify.WORKER)
    check_bootstrap(settings.bootstrap)
    if args.processes > 1:
        from pipeline.worker.supervisor import Supervisor, child_specs  # noqa: PLC0415

        specs = child_specs(settings.for_topology(topo.app), args.processes, log_level=args.log_level)
        return asyncio.run(_run_service(Supervisor(specs)))
    try:
        return asyncio.run(_run_service(Worker(settings, topo)))
    except KafkaError as exc:  # one the worker did not turn into a PipelineError itself
        raise PipelineError(f"Kafka at {settings.bootstrap}: {exc}") from None


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
    from pipeline import topology  # noqa: PLC0415
    from pipeline.ingress.server import Ingress  # noqa: PLC0415

    settings = ingress_settings(args)
    topo = topology.load(settings.topology, os.environ)
    return asyncio.run(_run_service(Ingress(settings, topo)))


def _cmd_rescale(args: argparse.Namespace) -> int:
    from pathlib import Path  # noqa: PLC0415

    from pipeline import topology  # noqa: PLC0415
    from pipeline.ops.rescale import rescale  # noqa: PLC0415

    topo = topology.load(args.topology)
    group = args.group or topo.app
    state = Path(args.state_file or f".state/rescale-{topo.app}-{group}.json")
    print(f"rescaling {topo.topics.input} to {args.partitions} partitions (progress in {state})")
    asyncio.run(rescale(args.bootstrap, topo, partitions=args.partitions, group=group, state_file=state))
    print("done: start the workers (and restart the ingress) now")
    return 0


def _cmd_up(args: argparse.Namespace) -> int:
    from pathlib import Path  # noqa: PLC0415

    from pipeline.ops.foreground import run_foreground  # noqa: PLC0415
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
    return asyncio.run(run_foreground(Up(settings)))


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


def _cmd_init(args: argparse.Namespace) -> int:
    from pipeline.ops.init import init, summary  # noqa: PLC0415

    print("\n".join(summary(init(Path(args.dir), app=args.app, force=args.force))))
    return 0


def _cmd_sign(args: argparse.Namespace) -> int:
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


def _since(text: str) -> int:
    """``--since`` as ms since the epoch: a duration back from now, or a time (a usage error otherwise)."""
    from datetime import UTC, datetime  # noqa: PLC0415

    from pipeline.ops.dlq_records import parse_since  # noqa: PLC0415

    try:
        return parse_since(text, now=datetime.now(UTC))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _dlq_filter(args: argparse.Namespace) -> DlqFilter:
    from pipeline.ops.dlq_records import DlqFilter, reasons_of  # noqa: PLC0415

    return DlqFilter(reasons=reasons_of(args.reason), key=args.key, since_ms=args.since)


def _cmd_dlq_list(args: argparse.Namespace) -> int:
    from pipeline import topology  # noqa: PLC0415
    from pipeline.ops.dlq import list_dlq  # noqa: PLC0415
    from pipeline.ops.dlq_records import summary  # noqa: PLC0415

    topo = topology.load(args.topology)
    flt = _dlq_filter(args)
    counts = asyncio.run(list_dlq(args.bootstrap, topo.topics.dlq, flt, out=sys.stdout, as_json=args.json))
    print(summary(counts), file=sys.stderr if args.json else sys.stdout)
    return 0


def _cmd_dlq_replay(args: argparse.Namespace) -> int:
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
        )
    )
    if progress.shown and sys.stderr.isatty():
        print(file=sys.stderr)
    verb = "would replay" if args.dry_run else "replayed"
    print(f"{verb} {summary(report.replayed)} to {topo.topics.input}; skipped {len(report.skipped)}")
    if report.skipped:
        print(
            f"pipeline: {len(report.skipped)} DLQ records cannot be replayed (the 'skip' lines say why)",
            file=sys.stderr,
        )
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = _Parser(prog="pipeline", description=__doc__.splitlines()[1] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--log-level", default=_env("PIPELINE_LOG_LEVEL", "INFO"), help="default %(default)s")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    init = commands.add_parser("init", help="write a starter topology and a .env template into DIR")
    init.add_argument("dir", nargs="?", default=".", help="default: the current directory")
    init.add_argument(
        "--app", default="webhooks", help="app name, also the topic names' prefix (default %(default)s)"
    )
    init.add_argument("--force", action="store_true", help="overwrite files that exist")
    init.set_defaults(handler=_cmd_init)

    topics = commands.add_parser("topics", help="manage the pipeline's topics")
    topics_commands = topics.add_subparsers(dest="topics_command", required=True, metavar="ACTION")
    create = topics_commands.add_parser("create", help="create the topics (idempotent)")
    _common(create)
    create.add_argument(
        "--partitions", type=int, default=None, help="partition count (default: the topology's)"
    )
    create.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the broker")
    create.set_defaults(handler=_cmd_topics)

    worker = commands.add_parser(
        "worker", help="run a dedupe worker (joins the consumer group)", populate=_add_worker_settings
    )
    worker.set_defaults(handler=_cmd_worker)

    _add_service_commands(commands)
    _add_tool_commands(commands)
    _add_dlq_commands(commands)
    return parser


def _add_dlq_commands(commands: Any) -> None:
    """``dlq list`` and ``dlq replay``."""
    dlq = commands.add_parser("dlq", help="what the DLQ holds, and replaying it once the cause is fixed")
    actions = dlq.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="one line per DLQ record and a count per reason")
    replay = actions.add_parser(
        "replay", help="produce the original records again to the input topic (deduped as usual)"
    )
    for parser in (listing, replay):
        _common(parser)
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
    listing.add_argument("--json", action="store_true", help="print JSON lines (the summary goes to stderr)")
    listing.set_defaults(handler=_cmd_dlq_list)
    replay.add_argument(
        "--dry-run", action="store_true", help="print what would be replayed, produce nothing"
    )
    replay.set_defaults(handler=_cmd_dlq_replay)


def _add_service_commands(commands: Any) -> None:
    """``ingress`` and ``up``."""
    ingress = commands.add_parser(
        "ingress", help="run the HTTP ingress: POST /webhooks/{source}", populate=_add_ingress_settings
    )
    ingress.set_defaults(handler=_cmd_ingress)

    up = commands.add_parser(
        "up", help="run everything on this machine (starts a local Kafka unless --bootstrap)"
    )
    up.add_argument("--bootstrap", default=_env("KAFKA_BOOTSTRAP_SERVERS"), help="use this Kafka instead")
    up.add_argument(
        "--topology", default=_env("PIPELINE_TOPOLOGY", str(DEFAULT_TOPOLOGY)), help="default %(default)s"
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
    """``inspect``, ``sign``, ``tail`` and ``produce``."""
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

    sign = commands.add_parser(
        "sign", help="print a curl command posting FILE to SOURCE's webhook URL, signed with its secret"
    )
    sign.add_argument("source", help="a source of the topology, e.g. stripe")
    sign.add_argument("file", help="the event body, sent byte for byte")
    sign.add_argument(
        "--topology", default=_env("PIPELINE_TOPOLOGY", str(DEFAULT_TOPOLOGY)), help="default %(default)s"
    )
    sign.add_argument(
        "--url",
        default=_env("PIPELINE_INGRESS_URL", "http://127.0.0.1:8080"),
        help="the ingress (default %(default)s)",
    )
    sign.add_argument("--id", default=None, help="delivery id for header-keyed providers (default: random)")
    sign.add_argument("--event-type", default=None, help="event type header for header-typed providers")
    sign.set_defaults(handler=_cmd_sign)

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
        "--group",
        default=_env("PIPELINE_GROUP", WORKER_DEFAULTS["group"]),
        help="the workers' group (default: the topology's app name)",
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
        if getattr(args, "topology", None) is not None:  # a bare name or a missing default: the packaged one
            args.topology = str(resolve_topology(args.topology))
        return handler(args)
    except PipelineError as exc:
        print(f"pipeline: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
