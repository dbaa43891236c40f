"""What a provider preset is: a Protocol for callers, and the small parts presets are built from.

A :class:`Preset` composes three independent parts: where the idempotency key lives
(:class:`KeySource`), how the signature is checked (:class:`Verifier`) and where the event
type lives (:class:`TypeSource`). Each part is a small frozen dataclass.
"""

# Parts implement shared Protocols, so some take arguments they do not use.
# ruff: noqa: ARG002

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol, runtime_checkable

import orjson

from pipeline.errors import MissingKeyError
from pipeline.providers import _body
from pipeline.providers._headers import HeaderView
from pipeline.providers._verify_body import NoSignatureVerifier

#: Floor for every preset's default TTL: a week covers every automatic retry schedule we know.
MINIMUM_DEFAULT_TTL = timedelta(days=7)


def default_ttl_for(retry_window: timedelta, *, at_least: timedelta = MINIMUM_DEFAULT_TTL) -> timedelta:
    """A dedupe TTL with margin: ``max(window x 1.5, window + 1 day, at_least)``."""
    return max(retry_window * 1.5, retry_window + timedelta(days=1), at_least)


@runtime_checkable
class Provider(Protocol):
    """A webhook sender's conventions: its event id, its signature scheme, its retry window."""

    @property
    def name(self) -> str:
        """The preset name, e.g. ``"stripe"``."""
        ...

    @property
    def retry_window(self) -> timedelta:
        """How long after the first attempt the provider may still deliver the same event."""
        ...

    @property
    def default_ttl(self) -> timedelta:
        """How long to remember a key by default (always longer than ``retry_window``)."""
        ...

    def idempotency_key(self, headers: Mapping[str, str], body: bytes) -> str:
        """The provider's stable event id, unscoped (the pipeline prefixes ``<source>:``).

        Raises MissingKeyError (what was missing) or BodyError (unparseable body).
        """
        ...

    def event_type(self, headers: Mapping[str, str], body: bytes) -> str | None:
        """The event type (``invoice.paid``), or None when the delivery does not say."""
        ...

    def verify(
        self,
        headers: Mapping[str, str],
        body: bytes,
        secrets: Sequence[str],
        *,
        now: float,
        url: str | None = None,
    ) -> None:
        """Raise SignatureError saying exactly which check failed; return None when authentic."""
        ...


class KeySource(Protocol):
    """Where a provider puts its event id."""

    def extract(self, headers: HeaderView, body: bytes, provider: str) -> str:
        """The id; MissingKeyError or BodyError when it cannot be read."""
        ...


class TypeSource(Protocol):
    """Where a provider puts its event type."""

    def extract(self, headers: HeaderView, body: bytes, provider: str) -> str | None:
        """The type or None; BodyError only when the body must be parsed and cannot be."""
        ...


class Verifier(Protocol):
    """A signature scheme: checks incoming requests and can produce the sender's headers."""

    def verify(
        self,
        headers: HeaderView,
        body: bytes,
        secrets: Sequence[str],
        *,
        now: float,
        url: str | None,
        provider: str,
    ) -> None:
        """Raise SignatureError unless some secret signed this request."""
        ...

    def sign(
        self, body: bytes, secret: str, *, timestamp: int, msg_id: str, url: str | None
    ) -> dict[str, str]:
        """The signature headers a sender holding ``secret`` would attach."""
        ...

    def secret_problem(self, secret: str) -> str | None:
        """What is wrong with ``secret`` for this scheme (never showing it), or None when usable."""
        ...


@dataclass(frozen=True, slots=True)
class HeaderKey:
    """The key is a header's value (first present of ``names``)."""

    names: tuple[str, ...]

    def extract(self, headers: HeaderView, body: bytes, provider: str) -> str:
        """The header value, stripped; MissingKeyError naming the header when absent or empty."""
        found = headers.first(self.names)
        if found is None or not found[1].strip():
            raise MissingKeyError(f"header {' or '.join(self.names)} missing")
        return found[1].strip()


@dataclass(frozen=True, slots=True)
class BodyKey:
    """The key is a JSON body field at a dotted path."""

    path: str

    def extract(self, headers: HeaderView, body: bytes, provider: str) -> str:
        """The field; BodyError for a non-object body, MissingKeyError for an absent field."""
        return _body.required_text(body, self.path, provider)


@dataclass(frozen=True, slots=True)
class FieldsHashKey:
    """The key is ``sha256`` (hex) of the canonical JSON of several stable body fields.

    For senders with no event id. Only fields that are the same on every delivery of one
    event may be listed (never a delivery time or attempt number); all must be present.
    """

    paths: tuple[str, ...]

    def extract(self, headers: HeaderView, body: bytes, provider: str) -> str:
        """The hash; MissingKeyError naming the first absent field."""
        document = _body.parse_object(body, provider)
        picked: dict[str, object] = {}
        for path in self.paths:
            value = _body.lookup(document, path)
            if _body.is_missing(value) or value is None:
                raise MissingKeyError(f"body field {path!r} missing (needed for the key hash)")
            picked[path] = value
        canonical = orjson.dumps(picked, option=orjson.OPT_SORT_KEYS)
        return hashlib.sha256(canonical).hexdigest()


@dataclass(frozen=True, slots=True)
class NoType:
    """The provider does not say (or the preset is not told) what type an event has."""

    def extract(self, headers: HeaderView, body: bytes, provider: str) -> str | None:
        """Always None."""
        return None


@dataclass(frozen=True, slots=True)
class HeaderType:
    """The event type is a header's value."""

    name: str

    def extract(self, headers: HeaderView, body: bytes, provider: str) -> str | None:
        """The header value, or None."""
        value = headers.get(self.name)
        if value is None:
            return None
        return value.strip() or None


@dataclass(frozen=True, slots=True)
class BodyType:
    """The event type is a JSON body field at a dotted path."""

    path: str

    def extract(self, headers: HeaderView, body: bytes, provider: str) -> str | None:
        """The field or None; BodyError when the body is not a JSON object."""
        return _body.optional_text(body, self.path, provider)


@dataclass(frozen=True, slots=True)
class FirstType:
    """The first type any of ``sources`` finds."""

    sources: tuple[TypeSource, ...]

    def extract(self, headers: HeaderView, body: bytes, provider: str) -> str | None:
        """The first non-None answer."""
        for source in self.sources:
            found = source.extract(headers, body, provider)
            if found is not None:
                return found
        return None


@dataclass(frozen=True, slots=True)
class Preset:
    """A provider preset: name, windows and its three parts. Implements :class:`Provider`."""

    name: str
    retry_window: timedelta
    default_ttl: timedelta
    key: KeySource
    verifier: Verifier
    type_source: TypeSource = NoType()
    #: Prefixes of the provider's other credentials, and what they are: a secret starting
    #: with one was pasted from the wrong place (an API key instead of the signing secret).
    foreign_secrets: tuple[tuple[str, str], ...] = ()

    @property
    def verifies(self) -> bool:
        """Whether this preset has a signature scheme (a ``generic`` one may have none)."""
        return not isinstance(self.verifier, NoSignatureVerifier)

    def secret_problem(self, secret: str) -> str | None:
        """What is wrong with ``secret`` for this provider, or None; never shows the secret."""
        for prefix, what in self.foreign_secrets:
            if secret.startswith(prefix):
                return f"starts with {prefix!r}: it looks like {what}, not the webhook signing secret"
        return self.verifier.secret_problem(secret)

    def idempotency_key(self, headers: Mapping[str, str], body: bytes) -> str:
        """See :meth:`Provider.idempotency_key`."""
        return self.key.extract(HeaderView(headers), body, self.name)

    def event_type(self, headers: Mapping[str, str], body: bytes) -> str | None:
        """See :meth:`Provider.event_type`."""
        return self.type_source.extract(HeaderView(headers), body, self.name)

    def verify(
        self,
        headers: Mapping[str, str],
        body: bytes,
        secrets: Sequence[str],
        *,
        now: float,
        url: str | None = None,
    ) -> None:
        """See :meth:`Provider.verify`."""
        self.verifier.verify(HeaderView(headers), body, secrets, now=now, url=url, provider=self.name)

    def sign(
        self, body: bytes, secret: str, *, timestamp: int, msg_id: str, url: str | None = None
    ) -> dict[str, str]:
        """The headers a real sender would attach: signature headers plus a header-borne key."""
        headers = self.verifier.sign(body, secret, timestamp=timestamp, msg_id=msg_id, url=url)
        if isinstance(self.key, HeaderKey) and not any(
            name.lower() in {h.lower() for h in headers} for name in self.key.names
        ):
            headers[self.key.names[0]] = msg_id
        return headers
