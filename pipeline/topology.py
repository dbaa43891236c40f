"""Topologies: the declarative TOML description of sources, routes and topics.

``load(path)`` reads a file into frozen objects and validates all of it at
once: an invalid file raises one :class:`~pipeline.errors.TopologyError` that
lists every problem with the file, the key and the reason, so nothing starts
half-configured.
"""

from __future__ import annotations

import fnmatch
import os
import re
import tomllib
from collections.abc import Mapping
from datetime import timedelta
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pipeline.durations import parse_duration
from pipeline.errors import ConfigError, TopologyError
from pipeline.topology_model import (
    CHANGELOG_MARGIN,
    DEFAULT_TTL,
    Expiry,
    Route,
    Source,
    Topics,
    Topology,
    Verify,
)

if TYPE_CHECKING:
    from pipeline.providers.base import Preset

#: Bounds of every TTL (``ttl``, ``effect_ttl``). Below an hour no provider's retries are
#: covered (and a store bucket is at least an hour wide); above a year is a typo.
MIN_TTL = timedelta(hours=1)
MAX_TTL = timedelta(days=365)
#: The topology every command reads unless told otherwise (the packaged one when no such file is here).
DEFAULT_TOPOLOGY = Path("topologies/default.toml")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_E = TypeVar("_E", bound=StrEnum)

__all__ = [
    "CHANGELOG_MARGIN",
    "DEFAULT_TOPOLOGY",
    "DEFAULT_TTL",
    "MAX_TTL",
    "MIN_TTL",
    "Expiry",
    "Route",
    "Source",
    "Topics",
    "Topology",
    "Verify",
    "load",
    "parse",
]


def load(path: str | os.PathLike[str]) -> Topology:
    """Read and validate the topology at ``path`` (its secrets are checked by
    :func:`pipeline.credentials.load_checked`, which the services use)."""
    file = Path(path)
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TopologyError([f"{file}: file not found"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TopologyError([f"{file}: cannot read: {exc}"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise TopologyError([f"{file}: not valid TOML: {exc}"]) from None
    return parse(data, origin=str(file), path=file)


def parse(data: Mapping[str, Any], *, origin: str = "<topology>", path: Path | None = None) -> Topology:
    """Validate a parsed TOML document; raise one error listing every problem."""
    problems = _Problems(origin)
    problems.unknown(data, "", {"app", "topics", "sources", "routes"})
    app = data.get("app", {})
    app_name = "webhooks"
    if isinstance(app, Mapping):
        problems.unknown(app, "app", {"name"})
        app_name = problems.name(app.get("name", app_name), "app.name")
    else:
        problems.add("app", "must be a table")
    topics = _parse_topics(data.get("topics", {}), app_name, problems)
    sources = _parse_sources(data.get("sources", {}), problems)
    routes = _parse_routes(data.get("routes", []), sources, problems)
    problems.raise_if_any()
    return Topology(app=app_name, topics=topics, sources=sources, routes=routes, path=path)


class _Problems:
    def __init__(self, origin: str) -> None:
        self.origin = origin
        self.items: list[str] = []

    def add(self, key: str, reason: str) -> None:
        self.items.append(f"{self.origin}: {key or '<top level>'}: {reason}")

    def unknown(self, table: Mapping[str, Any], prefix: str, allowed: set[str]) -> None:
        for key in sorted(set(table) - allowed):
            where = f"{prefix}.{key}" if prefix else key
            self.add(where, f"unknown key (expected one of: {', '.join(sorted(allowed))})")

    def name(self, value: object, key: str) -> str:
        if isinstance(value, str) and _NAME.match(value):
            return value
        self.add(key, "must be a lowercase name of letters, digits, '-' or '_'")
        return "invalid"

    def topic(self, value: object, key: str) -> str:
        if isinstance(value, str) and _TOPIC.match(value):
            return value
        self.add(key, "must be a Kafka topic name (letters, digits, '.', '_', '-')")
        return "invalid"

    def positive_int(self, value: object, key: str) -> int:
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
        self.add(key, f"must be a positive integer, got {value!r}")
        return 1

    def duration(self, value: object, key: str) -> timedelta:
        try:
            return parse_duration(value, at_least=MIN_TTL, at_most=MAX_TTL)
        except ValueError as exc:
            self.add(key, str(exc))
            return DEFAULT_TTL

    def raise_if_any(self) -> None:
        if self.items:
            raise TopologyError(self.items)


def _parse_topics(raw: object, app: str, problems: _Problems) -> Topics:
    if not isinstance(raw, Mapping):
        problems.add("topics", "must be a table")
        return Topics()
    defaults = Topics(
        changelog=f"{app}-seen-changelog",
        effects=f"{app}-effects",
        effects_changelog=f"{app}-effects-changelog",
        redrives=f"{app}-redrives",
    )
    problems.unknown(raw, "topics", set(Topics.__slots__))
    names = {
        key: problems.topic(raw.get(key, getattr(defaults, key)), f"topics.{key}")
        for key in (
            "input",
            "commands",
            "audit",
            "dlq",
            "changelog",
            "effects",
            "effects_changelog",
            "redrives",
        )
    }
    if len(set(names.values())) < len(names):
        problems.add(
            "topics", "input, commands, audit, dlq, changelog, effects and redrives topics must be distinct"
        )
    return Topics(
        **names,
        partitions=problems.positive_int(raw.get("partitions", defaults.partitions), "topics.partitions"),
        replication=problems.positive_int(raw.get("replication", defaults.replication), "topics.replication"),
    )


def _parse_sources(raw: object, problems: _Problems) -> dict[str, Source]:
    from pipeline import providers  # noqa: PLC0415  (keeps topology importable without presets)

    if not isinstance(raw, Mapping) or not raw:
        problems.add("sources", "must be a table with at least one source")
        return {}
    sources: dict[str, Source] = {}
    allowed = {"provider", "secrets", "ttl", "expiry", "verify", "options"}
    for name, table in raw.items():
        key = f"sources.{name}"
        problems.name(name, key)
        if not isinstance(table, Mapping):
            problems.add(key, "must be a table")
            continue
        problems.unknown(table, key, allowed)
        provider = table.get("provider", name)
        if provider not in providers.names():
            problems.add(
                f"{key}.provider",
                f"unknown provider {provider!r} (known: {', '.join(providers.names())})",
            )
        secret_env = table.get("secrets", [])
        if isinstance(secret_env, str):
            secret_env = [secret_env]
        if not (isinstance(secret_env, list) and all(isinstance(s, str) and s for s in secret_env)):
            problems.add(f"{key}.secrets", "must be a list of environment variable names")
            secret_env = []
        options = table.get("options", {})
        if not isinstance(options, Mapping):
            problems.add(f"{key}.options", "must be a table")
            options = {}
        preset = _preset(str(provider), options, key, problems)
        default_ttl = preset.default_ttl if preset is not None else DEFAULT_TTL
        ttl = problems.duration(table["ttl"], f"{key}.ttl") if "ttl" in table else default_ttl
        expiry = _enum(Expiry, table.get("expiry", "fixed"), f"{key}.expiry", problems)
        verify = _enum(Verify, table.get("verify", "ingress"), f"{key}.verify", problems)
        if verify is not Verify.NONE and provider in providers.names() and not secret_env:
            problems.add(
                f"{key}.secrets",
                f"verify = {verify.value!r} needs at least one secret variable (or verify = 'none')",
            )
        if verify is not Verify.NONE and preset is not None and not preset.verifies:
            problems.add(
                f"{key}.verify",
                f"verify = {verify.value!r} but the source has no signature scheme:"
                " set options.signature_header, or verify = 'none'",
            )
        sources[name] = Source(
            name=name,
            provider=str(provider),
            secret_env=tuple(secret_env),
            ttl=ttl,
            expiry=expiry,
            verify=verify,
            options=dict(options),
        )
    return sources


def _preset(provider: str, options: Mapping[str, Any], key: str, problems: _Problems) -> Preset | None:
    """The source's preset built with its options (they are checked here), or None."""
    from pipeline import providers  # noqa: PLC0415

    if provider not in providers.names():
        return None  # already reported
    try:
        return providers.build(provider, **options)
    except ConfigError as exc:
        problems.add(f"{key}.options", str(exc))
        return None


def _parse_routes(raw: object, sources: Mapping[str, Source], problems: _Problems) -> tuple[Route, ...]:
    if not isinstance(raw, list):
        problems.add("routes", "must be an array of tables ([[routes]])")
        return ()
    routes = []
    for index, table in enumerate(raw):
        key = f"routes[{index}]"
        if not isinstance(table, Mapping):
            problems.add(key, "must be a table")
            continue
        problems.unknown(
            table, key, {"source", "event", "topic", "command", "drop", "effect_key", "effect_ttl"}
        )
        source = table.get("source", "*")
        if not isinstance(source, str) or not any(fnmatch.fnmatchcase(s, source) for s in sources):
            problems.add(f"{key}.source", f"{source!r} matches no source")
        event = table.get("event", "*")
        if not isinstance(event, str):
            problems.add(f"{key}.event", "must be a string pattern such as 'invoice.*'")
            event = "*"
        drop = table.get("drop", False)
        if not isinstance(drop, bool):
            problems.add(f"{key}.drop", "must be true or false")
            drop = False
        topic = table.get("topic")
        if topic is not None:
            topic = problems.topic(topic, f"{key}.topic")
        command = table.get("command")
        if command is not None and not (isinstance(command, str) and command):
            problems.add(f"{key}.command", "must be a non-empty string")
            command = None
        effect_key, effect_ttl = _parse_effect(table, key, command, problems)
        if drop and (topic or command or effect_key):
            problems.add(key, "a route with drop = true takes no topic, command or effect_key")
        routes.append(
            Route(
                source=str(source),
                event=event,
                topic=topic,
                command=command,
                drop=drop,
                effect_key=effect_key,
                effect_ttl=effect_ttl,
            )
        )
    return tuple(routes)


def _parse_effect(
    table: Mapping[str, Any], key: str, command: object, problems: _Problems
) -> tuple[str | None, timedelta | None]:
    effect_key = table.get("effect_key")
    if effect_key is not None and not (isinstance(effect_key, str) and all(effect_key.split("."))):
        problems.add(f"{key}.effect_key", "must be a dotted path into the event, such as 'data.object.id'")
        effect_key = None
    effect_ttl = None
    if "effect_ttl" in table:
        effect_ttl = problems.duration(table["effect_ttl"], f"{key}.effect_ttl")
        if effect_key is None:
            problems.add(f"{key}.effect_ttl", "needs an effect_key")
    if effect_key is not None and command is None:
        problems.add(
            f"{key}.command", "a route with an effect_key needs a command name (the effect it names)"
        )
    return effect_key, effect_ttl


def _enum(kind: type[_E], value: object, key: str, problems: _Problems) -> _E:
    try:
        return kind(str(value))
    except ValueError:
        problems.add(key, f"must be one of: {', '.join(m.value for m in kind)}")
        return next(iter(kind))
