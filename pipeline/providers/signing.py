"""Produce the headers a real sender attaches, for tests, demos and load generators.

``sign("stripe", body, "whsec_…", timestamp=1700000000)`` returns
``{"Stripe-Signature": "t=1700000000,v1=…"}``; for providers whose idempotency key travels
in a header (GitHub, Shopify, Standard Webhooks, webhooker, Sweego's ``webhook-id``) the
key header is included too, set to ``msg_id`` (a fresh random id when not given).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from pipeline.providers import build
from pipeline.providers.base import FirstType, HeaderType, TypeSource

# Where each header-typed preset carries the event type (the others carry it in the body).
_TYPE_HEADERS = {
    "github": "X-GitHub-Event",
    "shopify": "X-Shopify-Topic",
    "webhooker": "X-Webhooker-Event-Type",
}


def new_msg_id(provider_name: str) -> str:
    """A fresh event/delivery id in the provider's usual shape."""
    if provider_name == "standard-webhooks":
        return f"msg_{uuid.uuid4().hex}"
    return str(uuid.uuid4())


def _type_header(provider_name: str, source: TypeSource) -> str | None:
    if provider_name in _TYPE_HEADERS:
        return _TYPE_HEADERS[provider_name]
    if isinstance(source, HeaderType):
        return source.name
    if isinstance(source, FirstType):
        for part in source.sources:
            if isinstance(part, HeaderType):
                return part.name
    return None


def sign(
    provider_name: str,
    body: bytes,
    secret: str,
    *,
    timestamp: float,
    msg_id: str | None = None,
    url: str | None = None,
    event_type: str | None = None,
    **options: object,
) -> dict[str, str]:
    """The headers a sender holding ``secret`` attaches to ``body`` at ``timestamp``.

    ``url`` is required for Square (it signs URL + body). ``event_type`` sets the type
    header of header-typed presets (GitHub, Shopify, webhooker). ``options`` configure the
    preset as in :func:`pipeline.providers.get` (needed for ``generic``).
    """
    preset = build(provider_name, **options)
    seconds = int(timestamp)
    ident = msg_id or new_msg_id(provider_name)
    headers = preset.sign(body, secret, timestamp=seconds, msg_id=ident, url=url)
    if provider_name == "shopify":
        headers.setdefault("X-Shopify-Event-Id", ident)
        headers.setdefault("X-Shopify-Webhook-Id", str(uuid.uuid4()))
        headers.setdefault("X-Shopify-Triggered-At", datetime.fromtimestamp(seconds, tz=UTC).isoformat())
    if event_type is not None:
        name = _type_header(provider_name, preset.type_source)
        if name is not None:
            headers[name] = event_type
    return headers
