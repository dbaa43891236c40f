"""``pipeline sign SOURCE FILE``: a ready-to-run ``curl`` that posts your own event, signed.

The secret is read from the source's environment variable (as the ingress
reads it) and never printed: the command carries only the signature. The
body is sent from the file byte for byte (``--data-binary @FILE``), so the
signature matches. Timestamped schemes (Stripe, Standard Webhooks, Paddle,
Slack, …) accept a signature only for their tolerance (300 s by default): the
note on stderr says until when.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pipeline import providers
from pipeline.credentials import source_secrets
from pipeline.errors import ConfigError, PipelineError
from pipeline.providers.signing import sign
from pipeline.topology import Source, Topology, Verify

DEFAULT_URL = "http://127.0.0.1:8080"


@dataclass(frozen=True)
class Signed:
    """A signed request: the shell command, and how long its signature is accepted (None: no limit)."""

    command: str
    signed_at: float
    valid_for: int | None

    def note(self) -> str:
        """One line saying when the signature stops being accepted."""
        if self.valid_for is None:
            return "this signature has no timestamp: it does not expire"
        until = datetime.fromtimestamp(self.signed_at + self.valid_for, tz=UTC)
        return (
            f"this signature is accepted for {self.valid_for} s, until "
            f"{until.isoformat(timespec='seconds').replace('+00:00', 'Z')}; sign again after that"
        )


def source_for(topology: Topology, name: str) -> Source:
    """The topology's source ``name``; a PipelineError naming the known ones otherwise."""
    source = topology.sources.get(name)
    if source is None:
        known = ", ".join(sorted(topology.sources)) or "none"
        raise PipelineError(f"unknown source {name!r} (this topology has: {known})")
    return source


def tolerance(source: Source) -> int | None:
    """Seconds a fresh signature of ``source`` is accepted, or None when the scheme has no timestamp."""
    try:
        preset = providers.build(source.provider, **source.options)
    except ConfigError as exc:
        raise PipelineError(f"source {source.name}: {exc}") from None
    value = getattr(preset.verifier, "tolerance", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def signed_curl(
    source: Source,
    body: bytes,
    secret: str,
    *,
    base_url: str = DEFAULT_URL,
    data_file: Path | None = None,
    msg_id: str | None = None,
    event_type: str | None = None,
    now: float | None = None,
) -> Signed:
    """A ``curl`` posting ``body`` to ``source``'s webhook URL with the headers its sender would add.

    With ``data_file`` the body is sent from that file (which must hold exactly
    ``body``); otherwise it is inline.
    """
    url = f"{base_url.rstrip('/')}/webhooks/{source.name}"
    signed_at = time.time() if now is None else now
    headers = sign(
        source.provider,
        body,
        secret,
        timestamp=signed_at,
        msg_id=msg_id,
        url=url,
        event_type=event_type,
        **source.options,
    )
    parts = ["curl", "-sS", "-X", "POST", url]
    for name, value in headers.items():
        parts += ["-H", f"{name}: {value}"]
    parts += ["-H", "Content-Type: application/json", "--data-binary"]
    parts.append(f"@{data_file}" if data_file is not None else body.decode("utf-8", "replace"))
    return Signed(shlex.join(parts), signed_at, tolerance(source))


def sign_file(
    topology: Topology,
    source_name: str,
    path: Path,
    environ: dict[str, str],
    *,
    base_url: str = DEFAULT_URL,
    msg_id: str | None = None,
    event_type: str | None = None,
) -> Signed:
    """Sign the event in ``path`` for ``source_name`` with the first secret set in ``environ``."""
    source = source_for(topology, source_name)
    if source.verify is Verify.NONE:
        raise PipelineError(
            f"source {source.name} does not verify signatures (verify = none): post it unsigned"
        )
    secrets = source_secrets(source, environ)
    if not secrets:
        names = ", ".join(source.secret_env) or "none"
        raise PipelineError(f"source {source.name}: no secret set; set {names} (as for the ingress)")
    try:
        body = path.read_bytes()
    except OSError as exc:
        raise PipelineError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if b"\x00" in body or _not_utf8(body):
        raise PipelineError(f"{path}: not a UTF-8 text body")
    return signed_curl(
        source,
        body,
        secrets[0],
        base_url=base_url,
        data_file=path,
        msg_id=msg_id,
        event_type=event_type,
    )


def _not_utf8(body: bytes) -> bool:
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def curl_note(topology: Topology, environ: Mapping[str, str]) -> str:
    """What a banner says under its sample curl: how long it is accepted, and how to sign your own."""
    for source in topology.sources.values():
        if source.verify is Verify.NONE or not source_secrets(source, environ):
            continue
        limit = tolerance(source)
        when = f"is accepted for {limit} s from now" if limit is not None else "does not expire"
        return f"# its signature {when}; sign your own event: pipeline sign {source.name} event.json"
    return "# no signed source has a secret set: set one (see the topology) to sign events"
