"""Provider presets: verify a webhook's signature and read its idempotency key.

Usage::

    from pipeline import providers

    stripe = providers.get("stripe")
    stripe.verify(headers, body, ["whsec_..."], now=received_at)  # or raises SignatureError
    key = stripe.idempotency_key(headers, body)                     # "evt_..." (unscoped)
    kind = stripe.event_type(headers, body)                         # "invoice.paid" or None

``headers`` is any ``Mapping[str, str]`` (names match case-insensitively), ``body`` the raw
bytes. :mod:`pipeline.providers.signing` produces valid headers for tests and demos.

Pure Python: nothing here talks to Kafka.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from pipeline.errors import ConfigError, UnknownProviderError
from pipeline.providers import _body, generic, presets
from pipeline.providers.base import Preset, Provider

__all__ = ["Provider", "get", "names"]

_PRESETS: dict[str, Callable[..., Preset]] = {
    "generic": generic.generic,
    "github": presets.github,
    "paddle": presets.paddle,
    "shopify": presets.shopify,
    "slack": presets.slack,
    "square": presets.square,
    "standard-webhooks": presets.standard_webhooks,
    "stripe": presets.stripe,
    "sweego": presets.sweego,
    "webhooker": presets.webhooker,
}


def parse_body(body: bytes, provider: str) -> dict[str, Any]:
    """A webhook body as a JSON object (parsed once per body); ``BodyError`` otherwise."""
    return _body.parse_object(body, provider)


def check_body(body: bytes, provider: str) -> None:
    """``BodyError`` unless the webhook body is a JSON object (validated without building it)."""
    _body.check_object(body, provider)


def names() -> list[str]:
    """The preset names, sorted."""
    return sorted(_PRESETS)


def build(name: str, **options: object) -> Preset:
    """The preset ``name`` as its concrete :class:`Preset` (with ``sign``); see :func:`get`."""
    factory = _PRESETS.get(name)
    if factory is None:
        raise UnknownProviderError(f"unknown provider {name!r}; known providers: {', '.join(names())}")
    accepted = list(inspect.signature(factory).parameters)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        takes = f"it takes: {', '.join(accepted)}" if accepted else "it takes no options"
        raise ConfigError(f"provider {name!r} has no option(s) {', '.join(unknown)}; {takes}")
    return factory(**options)


def get(name: str, **options: object) -> Provider:
    """The preset ``name`` configured with ``options``.

    Raises UnknownProviderError (listing the known names) for an unknown name and
    ConfigError for an option the preset does not take or an invalid value.
    """
    return build(name, **options)
