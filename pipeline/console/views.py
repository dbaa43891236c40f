"""Rendering: the Jinja2 templates (every value escaped, nothing hidden) and their filters.

A webhook body, its headers and its key are attacker-controlled: templates
only ever print them through autoescaping (no ``|safe`` anywhere), and every
printed value first has its control, bidi and zero-width characters written
as escapes (:func:`pipeline.log_text.reveal`), so a key cannot read as
another (``invoice\u202egnp.exe``); a body keeps its line breaks (the
``lines`` filter). Secrets are taken out before anything reaches a template
(:mod:`pipeline.console.redaction`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import jinja2
from aiohttp import web
from markupsafe import Markup, escape

from pipeline.log_text import reveal


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


def shown(value: Any) -> Any:
    """What every ``{{ ... }}`` prints: text with its hidden characters revealed (then autoescaped);
    markup already escaped (``|e``, ``|lines``) as it is."""
    if isinstance(value, str) and not isinstance(value, Markup):
        return reveal(value)
    return value


def lines(text: str) -> Markup:
    """A body over several lines: escaped, hidden characters revealed, line breaks and tabs kept."""
    return escape(reveal(text, keep="\n\t"))


def make_environment() -> jinja2.Environment:
    """The template environment: templates from the package, autoescape on for every template, and
    every printed value passed through :func:`shown`."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("pipeline.console", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=shown,
    )
    env.filters["lines"] = lines
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
