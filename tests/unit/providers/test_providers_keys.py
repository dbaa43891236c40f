"""Idempotency keys and event types: each preset reads the stable event id, not a look-alike."""

from __future__ import annotations

import hashlib

import orjson
import pytest

from pipeline import providers
from pipeline.errors import BodyError, ConfigError, MissingKeyError

STRIPE_EVENT = orjson.dumps(
    {
        "id": "evt_1NG8Du2eZvKYlo2CUI79vXWy",
        "object": "event",
        "type": "payment_intent.succeeded",
        "data": {"object": {"id": "pi_3NG8Du2eZvKYlo2C0", "object": "payment_intent"}},
    }
)
PADDLE_EVENT = orjson.dumps(
    {
        "event_id": "evt_01h8bzakzx3hm2fmen703n5q45",
        "notification_id": "ntf_01h8bzam1z32agrxjwhjgqk8w6",
        "event_type": "transaction.completed",
        "occurred_at": "2023-08-21T11:57:47.390028Z",
        "data": {"id": "txn_01h8bz7am4sx04xtqwjnb0e9bq"},
    }
)
SWEEGO_EVENT = orjson.dumps(
    {
        "event_type": "email_opened",
        "event_id": "2c8cbf41-5a5c-4d2a-9a45-8e0b1c1f3f11",
        "transaction_id": "d4fbec9d-eed9-44d5-af47-c1126467a5ca",
        "recipient": "someone@example.com",
    }
)
SLACK_EVENT = orjson.dumps(
    {
        "type": "event_callback",
        "event_id": "Ev0PV52K21",
        "event_time": 1234567890,
        "event": {
            "type": "app_mention",
            "user": "U061F7AUR",
            "text": "<@U0LAN0Z89> is it everything?",
        },
    }
)
SQUARE_EVENT = orjson.dumps(
    {
        "merchant_id": "6SSW7HV8K2ST5",
        "type": "payment.updated",
        "event_id": "13b867cf-db3d-4b1c-90b6-2f32a9d78124",
        "data": {"type": "payment", "id": "KkAkhdMsgzn59SM8A89WgKwekxLZY"},
    }
)
SW_EVENT = orjson.dumps(
    {"type": "invoice.paid", "timestamp": "2024-01-01T00:00:00Z", "data": {"id": "inv_1"}}
)


def test_stripe_key_is_the_event_id_not_the_object_id() -> None:
    """A payment_intent event keys on evt_…, never on data.object.id (a shared pi_…)."""
    stripe = providers.get("stripe")
    assert stripe.idempotency_key({}, STRIPE_EVENT) == "evt_1NG8Du2eZvKYlo2CUI79vXWy"
    assert stripe.event_type({}, STRIPE_EVENT) == "payment_intent.succeeded"


def test_paddle_key_is_the_event_id_not_the_notification_id() -> None:
    """Paddle keys on event_id; notification_id differs per destination and per replay."""
    paddle = providers.get("paddle")
    assert paddle.idempotency_key({}, PADDLE_EVENT) == "evt_01h8bzakzx3hm2fmen703n5q45"
    assert paddle.event_type({}, PADDLE_EVENT) == "transaction.completed"


def test_sweego_key_is_the_event_id_not_the_transaction_id() -> None:
    """Sweego keys on event_id; transaction_id is shared by every event of one email."""
    sweego = providers.get("sweego")
    headers = {"webhook-id": "some-request-id"}
    assert sweego.idempotency_key(headers, SWEEGO_EVENT) == "2c8cbf41-5a5c-4d2a-9a45-8e0b1c1f3f11"
    assert sweego.event_type(headers, SWEEGO_EVENT) == "email_opened"


def test_sweego_does_not_fall_back_to_the_request_id() -> None:
    """Without event_id Sweego's key is missing: webhook-id identifies a request, not the event."""
    body = orjson.dumps({"event_type": "delivered", "transaction_id": "t-1"})
    with pytest.raises(MissingKeyError, match="'event_id' missing"):
        providers.get("sweego").idempotency_key({"webhook-id": "req-1"}, body)


def test_shopify_key_is_the_event_id_not_the_webhook_id() -> None:
    """With both headers present, Shopify keys on X-Shopify-Event-Id."""
    headers = {
        "X-Shopify-Webhook-Id": "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043",
        "X-Shopify-Event-Id": "98880550-7158-44d4-b7cd-2c97c8a091b5",
        "X-Shopify-Topic": "orders/create",
    }
    shopify = providers.get("shopify")
    assert shopify.idempotency_key(headers, b"{}") == "98880550-7158-44d4-b7cd-2c97c8a091b5"
    assert shopify.event_type(headers, b"{}") == "orders/create"


def test_shopify_can_key_per_topic() -> None:
    """key_per_topic=True keeps two topics fired by one merchant action apart."""
    shopify = providers.get("shopify", key_per_topic=True)
    headers = {"X-Shopify-Event-Id": "98880550", "X-Shopify-Topic": "orders/paid"}
    assert shopify.idempotency_key(headers, b"{}") == "98880550:orders/paid"


@pytest.mark.parametrize("name", ["X-GitHub-Delivery", "x-github-delivery", "X-GITHUB-DELIVERY"])
def test_github_key_header_in_any_case(name: str) -> None:
    """The delivery GUID is found whatever the header's case."""
    github = providers.get("github")
    assert github.idempotency_key({name: "72d3162e-cc78-11e3-81ab-4c9367dc0958"}, b"{}") == (
        "72d3162e-cc78-11e3-81ab-4c9367dc0958"
    )


@pytest.mark.parametrize(
    ("headers", "body", "expected"),
    [
        (
            {"X-GitHub-Event": "pull_request"},
            b'{"action": "opened", "number": 1}',
            "pull_request.opened",
        ),
        ({"x-github-event": "push"}, b'{"ref": "refs/heads/main"}', "push"),
        ({"X-GitHub-Event": "push"}, b"payload=%7B%7D", "push"),
        ({}, b'{"action": "opened"}', None),
    ],
)
def test_github_event_type_is_event_dot_action(
    headers: dict[str, str], body: bytes, expected: str | None
) -> None:
    """GitHub's type is X-GitHub-Event plus .action when the body has one; form bodies work too."""
    assert providers.get("github").event_type(headers, body) == expected


def test_standard_webhooks_key_and_svix_fallback() -> None:
    """Standard Webhooks keys on webhook-id, or svix-id for Svix's branded headers."""
    provider = providers.get("standard-webhooks")
    assert provider.idempotency_key({"Webhook-Id": "msg_1"}, SW_EVENT) == "msg_1"
    assert provider.idempotency_key({"svix-id": "msg_2"}, SW_EVENT) == "msg_2"
    assert provider.event_type({}, SW_EVENT) == "invoice.paid"


def test_slack_key_and_nested_type() -> None:
    """Slack keys on event_id; the type is the inner event.type."""
    slack = providers.get("slack")
    assert slack.idempotency_key({}, SLACK_EVENT) == "Ev0PV52K21"
    assert slack.event_type({}, SLACK_EVENT) == "app_mention"


def test_square_key_and_type() -> None:
    """Square keys on event_id, not data.id."""
    square = providers.get("square")
    assert square.idempotency_key({}, SQUARE_EVENT) == "13b867cf-db3d-4b1c-90b6-2f32a9d78124"
    assert square.event_type({}, SQUARE_EVENT) == "payment.updated"


def test_webhooker_key_and_type() -> None:
    """webhooker keys on X-Webhooker-Event-Id; the type comes from its header, else the body."""
    webhooker = providers.get("webhooker")
    headers = {"x-webhooker-event-id": "evt_9rMz7kQpXa2FbtW"}
    assert webhooker.idempotency_key(headers, b"not json") == "evt_9rMz7kQpXa2FbtW"
    assert webhooker.event_type({"X-Webhooker-Event-Type": "invoice.paid"}, b"not json") == "invoice.paid"
    assert webhooker.event_type({}, STRIPE_EVENT) == "payment_intent.succeeded"
    assert webhooker.event_type({}, b"not json") is None


@pytest.mark.parametrize(
    ("name", "headers", "body", "missing"),
    [
        ("stripe", {}, b'{"object": "event"}', "body field 'id' missing"),
        ("github", {}, b"{}", "header X-GitHub-Delivery missing"),
        ("github", {"X-GitHub-Delivery": "  "}, b"{}", "header X-GitHub-Delivery missing"),
        ("shopify", {"X-Shopify-Webhook-Id": "w-1"}, b"{}", "header X-Shopify-Event-Id missing"),
        ("standard-webhooks", {}, SW_EVENT, "header webhook-id or svix-id missing"),
        (
            "slack",
            {},
            b'{"type": "url_verification", "challenge": "x"}',
            "body field 'event_id' missing",
        ),
        ("square", {}, b'{"type": "payment.updated"}', "body field 'event_id' missing"),
        ("paddle", {}, b'{"notification_id": "ntf_1"}', "body field 'event_id' missing"),
        ("webhooker", {}, b"{}", "header X-Webhooker-Event-Id missing"),
        ("sweego", {}, b'{"transaction_id": "t"}', "body field 'event_id' missing"),
        ("stripe", {}, b'{"id": null}', "body field 'id' missing"),
        ("stripe", {}, b'{"id": {"nested": 1}}', "body field 'id' is not a non-empty string"),
    ],
)
def test_missing_key_says_what_was_missing(
    name: str, headers: dict[str, str], body: bytes, missing: str
) -> None:
    """Without its key a delivery raises MissingKeyError naming the header or field."""
    with pytest.raises(MissingKeyError) as caught:
        providers.get(name).idempotency_key(headers, body)
    assert missing in str(caught.value)


@pytest.mark.parametrize("name", ["stripe", "slack", "square", "paddle", "sweego"])
@pytest.mark.parametrize("body", [b"", b"not json", b"[1, 2]", b'"evt_1"', b"\xff\xfe"])
def test_unparseable_body_for_a_body_keyed_provider_is_a_body_error(name: str, body: bytes) -> None:
    """A body that is not a JSON object raises BodyError, for the key and for the event type."""
    provider = providers.get(name)
    with pytest.raises(BodyError):
        provider.idempotency_key({}, body)
    with pytest.raises(BodyError):
        provider.event_type({}, body)


@pytest.mark.parametrize(
    "name", ["stripe", "shopify", "standard-webhooks", "slack", "square", "paddle", "sweego"]
)
def test_absent_event_type_is_none(name: str) -> None:
    """A delivery that does not state its type yields None, not an error."""
    assert providers.get(name).event_type({}, b'{"unrelated": true}') is None


def test_generic_key_from_header_path_or_hashed_fields() -> None:
    """generic reads a header, else a body path, else sha256 of chosen fields' canonical JSON."""
    body = orjson.dumps({"order": {"id": 42}, "status": "paid", "received_at": "2024-01-01T00:00:00Z"})
    by_header = providers.get("generic", key_header="X-Request-Id")
    assert by_header.idempotency_key({"x-request-id": "r-1"}, body) == "r-1"
    by_path = providers.get("generic", key_path="order.id")
    assert by_path.idempotency_key({}, body) == "42"
    by_fields = providers.get("generic", key_fields=["status", "order.id"])
    expected = hashlib.sha256(orjson.dumps({"order.id": 42, "status": "paid"}, option=orjson.OPT_SORT_KEYS))
    assert by_fields.idempotency_key({}, body) == expected.hexdigest()


def test_generic_field_hash_ignores_field_order_and_other_fields() -> None:
    """Two deliveries that differ only in key order and a receipt time hash to the same key."""
    provider = providers.get("generic", key_fields=["order.id", "status"])
    first = b'{"order": {"id": 42}, "status": "paid", "received_at": "2024-01-01T00:00:00Z"}'
    second = b'{"received_at": "2024-01-01T00:05:00Z", "status": "paid", "order": {"id": 42}}'
    assert provider.idempotency_key({}, first) == provider.idempotency_key({}, second)


def test_generic_field_hash_needs_every_field() -> None:
    """A missing configured field is a MissingKeyError, never a hash of fewer fields."""
    provider = providers.get("generic", key_fields=["order.id", "status"])
    with pytest.raises(MissingKeyError, match="'status' missing"):
        provider.idempotency_key({}, b'{"order": {"id": 42}}')


def test_generic_without_a_key_source_is_a_config_error() -> None:
    """generic needs key_header, key_path or key_fields: the whole body is never hashed."""
    with pytest.raises(ConfigError, match="key_header, key_path or key_fields"):
        providers.get("generic")


def test_generic_event_type_options() -> None:
    """generic reads the type from type_header, else type_path, else says None."""
    body = b'{"kind": "order.paid"}'
    assert providers.get("generic", key_path="kind", type_path="kind").event_type({}, body) == "order.paid"
    assert (
        providers.get("generic", key_path="kind", type_header="X-Type").event_type({"x-type": "t"}, body)
        == "t"
    )
    assert providers.get("generic", key_path="kind").event_type({}, body) is None
