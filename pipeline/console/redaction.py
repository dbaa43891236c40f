"""Secrets kept out of every page, whether or not the console was given them.

A DLQ body or header may hold a signing secret (a sender that echoes its
config, a debug header), and the console may run without the webhook secrets
in its environment, or with last month's. So nothing here depends on knowing
the secret; a value is hidden when any of these says it is one:

- its header is a credential by name (``authorization``, ``cookie``,
  ``*secret*``, ``*token*``, ...) or is a signature header of a provider preset
  (``Stripe-Signature``, ``X-Hub-Signature-256``, ...);
- it is a JSON field, or a ``name=value`` / ``name: value`` pair in any text,
  whose name says credential or signature;
- it has the shape of a known secret (``whsec_…``, ``sk_live_…``, ``ghp_…``,
  ``xoxb-…``, ``shpss_…``, ``pdl_ntfset_…``);
- it is the value of a secret the console did load (every variable the topology names).

Pure: no I/O. Bytes and text are redacted alike (text through its UTF-8), so
the hex view of a body hides what its text view hides.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping

from pipeline import providers
from pipeline.credentials import source_secrets
from pipeline.errors import ConfigError
from pipeline.headers import HTTP_PREFIX
from pipeline.providers.base import Preset
from pipeline.topology import Topology

REDACTED = "[redacted]"
_MARK = REDACTED.encode()
_MIN_SECRET = 6  # a shorter configured value would redact ordinary text

#: A name that says its value is a credential or a signature (header, JSON field, ``name=value``).
_CREDENTIAL = (
    r"authorization|cookie|secret|token|passw(?:or)?d|api[-_]?key|signature|credential|private[-_]?key|hmac"
)
_CREDENTIAL_NAME = re.compile(_CREDENTIAL, re.IGNORECASE)
#: A JSON member with a string or number value: its name, the colon, its value (escapes kept whole).
_JSON_MEMBER = re.compile(rb'"((?:[^"\\]|\\.){1,200}?)"(\s*:\s*)("(?:[^"\\]|\\.)*"|-?[0-9][0-9.eE+-]*)')
#: ``name=value`` or ``name: value`` in any text, the name saying credential (an auth scheme word kept).
_PAIR = re.compile(
    rb"(?i)(?<![a-z0-9_.-])([a-z0-9_.-]{0,40}?(?:" + _CREDENTIAL.encode() + rb")[a-z0-9_.-]{0,40})"
    rb"(\s*[=:]\s*(?:(?:bearer|basic|token|digest)\s+)?)([^\s\"'&;<>]+)"
)
#: Secrets of a known shape, whatever surrounds them.
_SHAPES = re.compile(
    rb"whsec_[A-Za-z0-9+/=_-]{8,}"
    rb"|(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{8,}"
    rb"|pdl_ntfset_[A-Za-z0-9_]{8,}"
    rb"|(?:ghp|gho|ghs|ghu|ghr)_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
    rb"|xox[abposr]-[A-Za-z0-9-]{10,}"
    rb"|shp(?:ss|at|ca|pa)_[A-Fa-f0-9]{16,}"
)


def signature_headers(topology: Topology | None = None) -> frozenset[str]:
    """The signature headers every provider preset reads (with the topology's sources' options, as
    a ``generic`` source names its own), lowercased."""
    presets: list[Preset] = []
    for name in providers.names():
        try:
            presets.append(providers.build(name))
        except ConfigError:  # a preset that needs options (generic): only its configured sources count
            continue
    for source in topology.sources.values() if topology is not None else ():
        try:
            presets.append(providers.build(source.provider, **source.options))
        except ConfigError:
            continue
    names: set[str] = set()
    for preset in presets:
        names |= _verifier_headers(preset.verifier)
    return frozenset(names)


def _verifier_headers(verifier: object) -> set[str]:
    """The header names a signature scheme's fields name as signatures (``header``, ``signature_header(s)``, ``legacy``)."""
    if not dataclasses.is_dataclass(verifier):
        return set()
    found: set[str] = set()
    for item in dataclasses.fields(verifier):
        value = getattr(verifier, item.name)
        if item.name in {"header", "signature_header"} and isinstance(value, str):
            found.add(value.lower())
        elif item.name == "signature_headers" and isinstance(value, tuple):
            found |= {v.lower() for v in value if isinstance(v, str)}
        elif item.name == "legacy" and isinstance(value, tuple):
            found |= {pair[0].lower() for pair in value if isinstance(pair, tuple) and pair}
    return found


class Redactor:
    """Hides secrets from what the console renders (see the module docstring for what counts as one)."""

    def __init__(self, secret_values: Iterable[str] = (), headers: Iterable[str] = ()) -> None:
        values = sorted({s for s in secret_values if len(s) >= _MIN_SECRET}, key=len, reverse=True)
        self._values = [v.encode() for v in values]
        self._headers = frozenset(h.lower() for h in headers)

    @classmethod
    def of(cls, topology: Topology, environ: Mapping[str, str]) -> Redactor:
        """The secrets the topology's sources read from ``environ`` (those set and usable), and every
        provider's signature headers."""
        values: list[str] = []
        for source in topology.sources.values():
            try:
                values += source_secrets(source, environ)
            except ConfigError:  # an unusable value: the topology check reports it; hide it all the same
                values += [environ[name] for name in source.secret_env if environ.get(name)]
        return cls(values, signature_headers(topology))

    def data(self, value: bytes) -> bytes:
        """``value`` with every secret replaced by ``[redacted]``."""
        for secret in self._values:
            value = value.replace(secret, _MARK)
        value = _JSON_MEMBER.sub(_member, value)
        value = _PAIR.sub(_pair, value)
        return _SHAPES.sub(_MARK, value)

    def text(self, value: str) -> str:
        """``value`` with every secret replaced (see :meth:`data`)."""
        return self.data(value.encode("utf-8", "surrogatepass")).decode("utf-8", "surrogatepass")

    def header(self, name: str, value: str) -> str:
        """A header's value as shown: hidden whole when its name says credential or signature."""
        bare = name.lower().removeprefix(HTTP_PREFIX)
        if bare in self._headers or _CREDENTIAL_NAME.search(bare):
            return REDACTED
        return self.text(value)


def _member(match: re.Match[bytes]) -> bytes:
    name = match[1].decode("utf-8", "replace")
    if not _CREDENTIAL_NAME.search(name):
        return match[0]
    return b'"' + match[1] + b'"' + match[2] + b'"' + _MARK + b'"'


def _pair(match: re.Match[bytes]) -> bytes:
    return match[1] + match[2] + _MARK
