"""What a topology is: sources, routes and topics, as frozen objects (parsed by :mod:`pipeline.topology`)."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any

DEFAULT_TTL = timedelta(days=7)  # for a Source built in code; a topology source takes its preset's
CHANGELOG_MARGIN = timedelta(days=1)


class Expiry(StrEnum):
    """How a key's time to live is counted."""

    FIXED = "fixed"  # from first sight: later copies do not extend it
    SLIDING = "sliding"  # from the latest copy


class Verify(StrEnum):
    """Where a source's signatures are checked."""

    INGRESS = "ingress"  # our HTTP ingress verifies before producing
    WORKER = "worker"  # records come from elsewhere: the worker verifies them
    NONE = "none"  # trusted producer; nothing is verified (explicit opt-out)


@dataclass(frozen=True, slots=True)
class Source:
    """One webhook sender: its provider preset, secrets and dedupe window."""

    name: str
    provider: str
    secret_env: tuple[str, ...] = ()
    ttl: timedelta = DEFAULT_TTL
    expiry: Expiry = Expiry.FIXED
    verify: Verify = Verify.INGRESS
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Route:
    """Sends matching events to a command topic under a command name (or drops them)."""

    source: str = "*"
    event: str = "*"
    topic: str | None = None
    command: str | None = None
    drop: bool = False
    effect_key: str | None = None  # dotted path into the event; commands then pass the effect stage
    effect_ttl: timedelta | None = None  # default: the source's TTL

    def effect_value(self, event: Mapping[str, Any]) -> str | None:
        """The value at ``effect_key`` in ``event`` (a string or number), or ``None``."""
        if self.effect_key is None:
            return None
        value: Any = event
        for part in self.effect_key.split("."):
            if not isinstance(value, Mapping) or part not in value:
                return None
            value = value[part]
        if isinstance(value, str) and value:
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        return None

    def matches(self, source: str, event_type: str | None) -> bool:
        """Whether an event from ``source`` of ``event_type`` takes this route."""
        return fnmatch.fnmatchcase(source, self.source) and fnmatch.fnmatchcase(event_type or "", self.event)


@dataclass(frozen=True, slots=True)
class Topics:
    """Topic names and sizes."""

    input: str = "webhooks.raw"
    commands: str = "webhooks.events"
    audit: str = "webhooks.deliveries"
    dlq: str = "webhooks.dlq"
    changelog: str = "webhooks-seen-changelog"
    effects: str = "webhooks-effects"  # internal: commands keyed by effect key, between the stages
    effects_changelog: str = "webhooks-effects-changelog"
    redrives: str = "webhooks-redrives"  # the console's redrive history (compacted, one partition)
    partitions: int = 6
    replication: int = 1


@dataclass(frozen=True, slots=True)
class Topology:
    """A whole, validated topology."""

    app: str
    topics: Topics
    sources: Mapping[str, Source]
    routes: tuple[Route, ...] = ()
    path: Path | None = None

    @property
    def max_ttl(self) -> timedelta:
        """The longest TTL of any source or effect: the changelogs must keep keys that long."""
        ttls = [s.ttl for s in self.sources.values()] + [r.effect_ttl for r in self.routes if r.effect_ttl]
        return max(ttls, default=DEFAULT_TTL)

    @property
    def has_effects(self) -> bool:
        """Whether any route sends its commands through the effect stage."""
        return any(r.effect_key for r in self.routes)

    @property
    def changelog_retention(self) -> timedelta:
        """``retention.ms`` for the changelog: the largest TTL plus a margin."""
        return self.max_ttl + CHANGELOG_MARGIN

    def command_topics(self) -> list[str]:
        """Every topic a command may be written to."""
        names = {self.topics.commands} | {r.topic for r in self.routes if r.topic}
        return sorted(names)

    def route(self, source: str, event_type: str | None) -> Route | None:
        """The first route that matches, or ``None`` for the default command topic."""
        for route in self.routes:
            if route.matches(source, event_type):
                return route
        return None
