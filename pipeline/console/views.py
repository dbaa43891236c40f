"""Rendering: the Jinja2 templates (every value escaped), their filters, and redacting secrets.

A webhook body, its headers and its key are attacker-controlled: templates
only ever print them through autoescaping (no ``|safe`` anywhere), and
:class:`Redactor` replaces every configured secret's value, and the values
of headers that carry credentials, before anything reaches a template.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import jinja2
from aiohttp import web

from pipeline.credentials import source_secrets
from pipeline.topology import Topology

REDACTED = "[redacted]"
#: Header names whose values are credentials (the ingress drops most of them; older records may not).
_SECRET_HEADER = re.compile(r"authorization|cookie|secret|token|password|api[-_]?key", re.IGNORECASE)
_MIN_SECRET = 6  # shorter values would redact ordinary text


class Redactor:
    """Hides the topology's secret values, and credential headers, from what the console renders."""

    def __init__(self, secret_values: Iterable[str]) -> None:
        self._texts = sorted({s for s in secret_values if len(s) >= _MIN_SECRET}, key=len, reverse=True)
        self._bytes = [s.encode() for s in self._texts]

    @classmethod
    def of(cls, topology: Topology, environ: Mapping[str, str]) -> Redactor:
        """The secrets the topology's sources read from ``environ``."""
        return cls(value for source in topology.sources.values() for value in source_secrets(source, environ))

    def text(self, value: str) -> str:
        """``value`` with every secret replaced."""
        for secret in self._texts:
            value = value.replace(secret, REDACTED)
        return value

    def data(self, value: bytes) -> bytes:
        """``value`` with every secret's bytes replaced."""
        for secret in self._bytes:
            value = value.replace(secret, REDACTED.encode())
        return value

    def header(self, name: str, value: str) -> str:
        """A header's value as shown: redacted whole when its name says it is a credential."""
        return REDACTED if _SECRET_HEADER.search(name) else self.text(value)


def iso_time(ms: int | None) -> str:
    """Milliseconds since the epoch as ``2026-12-02 05:22:39Z``; ``-`` when unknown."""
    if ms is None:
        return "-"
    try:
        return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"
    except (OverflowError, OSError, ValueError):
        return str(ms)


def key_path(key: str) -> str:
    """The console URL of a key: the whole key quoted into one path segment."""
    return "/keys/" + quote(key, safe="")


def hexdump(data: bytes, *, limit: int = 65_536) -> str:
    """``data`` as offset, hex bytes and printable ASCII, 16 bytes a line (at most ``limit`` bytes)."""
    lines = []
    for start in range(0, min(len(data), limit), 16):
        chunk = data[start : start + 16]
        hexes = " ".join(f"{b:02x}" for b in chunk)
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{start:08x}  {hexes:<47}  |{text}|")
    if len(data) > limit:
        lines.append(f"... {len(data) - limit} more bytes")
    return "\n".join(lines)


def make_environment() -> jinja2.Environment:
    """The template environment: templates from the package, autoescape on for every template."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("pipeline.console", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["time"] = iso_time
    env.filters["keypath"] = key_path
    env.filters["quote"] = lambda text: quote(str(text), safe="")
    return env


def render(
    env: jinja2.Environment,
    request: web.Request,
    name: str,
    *,
    session: Any,
    status: int = 200,
    **context: Any,
) -> web.Response:
    """A page (or fragment) rendered with the request's session (None on the login page) in its context."""
    html = env.get_template(name).render(session=session, path=request.path_qs, **context)
    return web.Response(text=html, status=status, content_type="text/html", charset="utf-8")
