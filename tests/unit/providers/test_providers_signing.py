"""pipeline.providers.signing produces the headers a real sender attaches, key header included."""

from __future__ import annotations

import pytest

from pipeline import providers
from pipeline.errors import ConfigError
from pipeline.providers.signing import sign

T = 1_700_000_000


@pytest.mark.parametrize(
    ("name", "key_header"),
    [
        ("github", "X-GitHub-Delivery"),
        ("shopify", "X-Shopify-Event-Id"),
        ("standard-webhooks", "webhook-id"),
        ("webhooker", "X-Webhooker-Event-Id"),
    ],
)
def test_header_keyed_providers_get_their_key_header(name: str, key_header: str) -> None:
    """msg_id becomes the key header, and the provider reads it back as the idempotency key."""
    secret = "whsec_c2VjcmV0LWtleS1ieXRlcw==" if name == "standard-webhooks" else "secret"
    headers = sign(name, b"{}", secret, timestamp=T, msg_id="id-123")
    assert headers[key_header] == "id-123"
    provider = providers.get(name)
    provider.verify(headers, b"{}", [secret], now=T)
    assert provider.idempotency_key(headers, b"{}") == "id-123"


def test_a_fresh_id_is_generated_when_none_is_given() -> None:
    """Without msg_id every call is a new event with a new id."""
    first = sign("github", b"{}", "s", timestamp=T)["X-GitHub-Delivery"]
    second = sign("github", b"{}", "s", timestamp=T)["X-GitHub-Delivery"]
    assert first != second
    assert sign("standard-webhooks", b"{}", "whsec_c2VjcmV0", timestamp=T)["webhook-id"].startswith("msg_")


def test_shopify_headers_look_like_shopify() -> None:
    """Shopify deliveries carry a per-delivery Webhook-Id, the event id, topic and Triggered-At."""
    headers = sign("shopify", b"{}", "s", timestamp=T, msg_id="evt-1", event_type="orders/create")
    assert headers["X-Shopify-Event-Id"] == "evt-1"
    assert headers["X-Shopify-Webhook-Id"] != "evt-1"
    assert headers["X-Shopify-Topic"] == "orders/create"
    assert headers["X-Shopify-Triggered-At"].startswith("2023-11-14T22:13:20")


def test_event_type_goes_to_the_type_header() -> None:
    """event_type lands where each header-typed provider reads it."""
    github = sign("github", b'{"action": "opened"}', "s", timestamp=T, event_type="pull_request")
    assert providers.get("github").event_type(github, b'{"action": "opened"}') == "pull_request.opened"
    webhooker = sign("webhooker", b"{}", "s", timestamp=T, event_type="invoice.paid")
    assert providers.get("webhooker").event_type(webhooker, b"{}") == "invoice.paid"


def test_sweego_signs_bare_base64_like_sweego() -> None:
    """Sweego's webhook-signature has no 'v1,' prefix."""
    headers = sign("sweego", b"{}", "c2VjcmV0LWtleS1ieXRlcw==", timestamp=T)
    assert "," not in headers["webhook-signature"]


def test_square_signing_needs_the_url() -> None:
    """Square signs URL + body, so signing without url is a ConfigError."""
    with pytest.raises(ConfigError, match="url required"):
        sign("square", b"{}", "key", timestamp=T)


def test_generic_signing_uses_the_configured_scheme() -> None:
    """sign() takes the same options as get(), so a generic source can be signed too."""
    options = {
        "key_header": "X-Event-Id",
        "signature_header": "X-Sig",
        "signature_prefix": "sha256=",
    }
    headers = sign("generic", b"{}", "s", timestamp=T, msg_id="e-1", **options)
    assert headers["X-Sig"].startswith("sha256=")
    assert headers["X-Event-Id"] == "e-1"
    providers.get("generic", **options).verify(headers, b"{}", ["s"], now=T)
