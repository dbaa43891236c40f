"""Settings as flags and environment variables: one flag and one variable per settings field, defaults from the settings classes."""

from __future__ import annotations

import argparse
import os
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.kafka.settings import DEFAULT_BOOTSTRAP
from pipeline.options import INGRESS_OPTIONS, WORKER_OPTIONS, Option
from pipeline.topology import DEFAULT_TOPOLOGY
from pipeline.worker.settings import WorkerSettings

if TYPE_CHECKING:
    from pipeline.ingress.server import IngressSettings


Handler = Callable[[argparse.Namespace], int]


def env_default(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name) or default


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bootstrap",
        default=env_default("KAFKA_BOOTSTRAP_SERVERS", DEFAULT_BOOTSTRAP),
        help="Kafka bootstrap servers (env KAFKA_BOOTSTRAP_SERVERS, default %(default)s)",
    )
    parser.add_argument(
        "--topology",
        default=env_default("PIPELINE_TOPOLOGY", str(DEFAULT_TOPOLOGY)),
        help="topology file (env PIPELINE_TOPOLOGY, default %(default)s)",
    )


@dataclass(frozen=True, slots=True)
class Setting:
    """A settings option added to a parser: how its text parses, and its default (in the flag's unit)."""

    option: Option
    parse: Callable[[str], Any]
    default: Any


class SettingsParser(argparse.ArgumentParser):
    """An argument parser whose settings options also read environment variables.

    A settings option missing from the command line takes its variable's value, else
    its default. A variable that does not parse ends the program with one line on
    stderr and exit status 2. ``populate`` adds the options on first use, so a
    command's imports happen only when that command runs or shows its help.
    """

    def __init__(
        self, *args: Any, populate: Callable[[SettingsParser], None] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.settings: list[Setting] = []
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

    def _from_env(self, setting: Setting) -> Any:
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


def _add_settings(parser: SettingsParser, settings_class: type, options: Sequence[Option]) -> None:
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
        parser.settings.append(Setting(option, parse, defaults[option.field]))


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


def add_worker_settings(parser: SettingsParser) -> None:
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
    parser.settings.append(Setting(PROCESSES, parse_processes, 1))


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


def add_ingress_settings(parser: SettingsParser) -> None:
    from pipeline.ingress.server import IngressSettings  # noqa: PLC0415  (aiohttp: only for the ingress)

    _add_settings(parser, IngressSettings, INGRESS_OPTIONS)
