"""The provider presets, each built from the parts in :mod:`pipeline.providers.base`.

Each factory documents where the event id lives, the signature scheme, and the retry
window with its source. ``default_ttl`` is ``max(window x 1.5, window + 1 day, 7 days)``
unless a preset says otherwise.
"""

# Parts implement shared Protocols, so some take arguments they do not use.
# ruff: noqa: ARG002

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from pipeline.errors import BodyError, ConfigError
from pipeline.providers import _body
from pipeline.providers._headers import HeaderView
from pipeline.providers._verify_body import BodyHmacVerifier
from pipeline.providers._verify_standard import StandardWebhooksVerifier
from pipeline.providers._verify_timestamped import KeyValueHeaderVerifier, SlackVerifier
from pipeline.providers.base import (
    BodyKey,
    BodyType,
    FirstType,
    HeaderKey,
    HeaderType,
    KeySource,
    Preset,
    default_ttl_for,
)

#: Default tolerance for timestamped schemes (Stripe's, Slack's and Standard Webhooks' value).
DEFAULT_TOLERANCE = 300


def _tolerance(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"option 'tolerance' must be a positive number of seconds, got {value!r}")
    return value


def stripe(*, tolerance: int = DEFAULT_TOLERANCE) -> Preset:
    """Stripe: key = body ``id`` (``evt_…``), never ``data.object.id``.

    ``data.object.id`` names the object (a ``pi_…``), which many events share.

    ``Stripe-Signature: t=…,v1=…`` over ``f"{t}.{body}"``, hex HMAC-SHA256 keyed by the whole
    ``whsec_…`` string; ``v0`` (test-mode scheme) is not accepted. Tolerance 300 s (Stripe SDK
    default). Retries: "for up to three days with an exponential back off" in live mode
    (https://docs.stripe.com/webhooks#automatic-retries).
    """
    window = timedelta(days=3)
    return Preset(
        name="stripe",
        retry_window=window,
        default_ttl=default_ttl_for(window),
        key=BodyKey("id"),
        verifier=KeyValueHeaderVerifier(
            header="Stripe-Signature",
            item_separator=",",
            timestamp_field="t",
            signature_field="v1",
            message_separator=".",
            tolerance=_tolerance(tolerance),
        ),
        type_source=BodyType("type"),
        foreign_secrets=(
            ("sk_", "a Stripe secret API key"),
            ("rk_", "a Stripe restricted API key"),
            ("pk_", "a Stripe publishable key"),
        ),
    )


@dataclass(frozen=True, slots=True)
class _GithubType:
    """``X-GitHub-Event`` plus the body's ``action`` when present: ``pull_request.opened``."""

    def extract(self, headers: HeaderView, body: bytes, provider: str) -> str | None:
        event = (headers.get("X-GitHub-Event") or "").strip()
        if not event:
            return None
        try:
            action = _body.optional_text(body, "action", provider)
        except BodyError:  # form-encoded deliveries: the header alone names the event
            return event
        return f"{event}.{action}" if action else event


def github() -> Preset:
    """GitHub: key = header ``X-GitHub-Delivery`` (a GUID, kept on redelivery).

    ``X-Hub-Signature-256: sha256=<hex>`` over the body; no timestamp. The SHA-1
    ``X-Hub-Signature`` alone is reported as unsupported. GitHub "does not automatically
    redeliver failed deliveries"; deliveries "from the past 3 days" can be redelivered by hand
    (https://docs.github.com/webhooks/testing-and-troubleshooting-webhooks/redelivering-webhooks;
    GitHub Enterprise Server keeps 7 days, which the 7-day default TTL also covers).
    """
    window = timedelta(days=3)
    return Preset(
        name="github",
        retry_window=window,
        default_ttl=default_ttl_for(window),
        key=HeaderKey(("X-GitHub-Delivery",)),
        verifier=BodyHmacVerifier(
            header="X-Hub-Signature-256",
            encoding="hex",
            prefix="sha256=",
            legacy=(("X-Hub-Signature", "legacy HMAC-SHA1"),),
        ),
        type_source=_GithubType(),
    )


@dataclass(frozen=True, slots=True)
class _ShopifyTopicKey:
    """``f"{X-Shopify-Event-Id}:{X-Shopify-Topic}"`` (option ``key_per_topic``)."""

    def extract(self, headers: HeaderView, body: bytes, provider: str) -> str:
        event_id = HeaderKey(("X-Shopify-Event-Id",)).extract(headers, body, provider)
        topic = HeaderKey(("X-Shopify-Topic",)).extract(headers, body, provider)
        return f"{event_id}:{topic}"


def shopify(*, key_per_topic: bool = False) -> Preset:
    """Shopify: key = header ``X-Shopify-Event-Id``.

    Shopify's "Ignore duplicate webhooks" guide names ``X-Shopify-Event-Id``: "the same value
    across more than one webhook indicates a duplicate"
    (https://shopify.dev/docs/apps/build/webhooks/ignore-duplicates). ``X-Shopify-Webhook-Id``
    is "a unique composite key per delivery" (delivery-structure page): it identifies one
    delivery (one subscription), so several subscriptions for one event would each pass a
    dedupe on it. The delivery-structure page also says the event id is "shared across all
    deliveries produced by the same merchant action"; if one action fans out to several
    topics you route separately, ``key_per_topic=True`` keys by ``<event id>:<topic>``.

    ``X-Shopify-Hmac-Sha256`` is base64 HMAC-SHA256 of the body keyed by the app's client
    secret. No timestamp is signed (``X-Shopify-Triggered-At`` is informational), so there is
    no window check. Retries: the current docs say 8 retries over 4 hours (changelog
    2024-09-10, https://shopify.dev/changelog/updates-to-webhook-retry-mechanism); earlier
    docs said 19 retries over 48 hours. The longer value, 48 h, is used.
    """
    if not isinstance(key_per_topic, bool):
        raise ConfigError(f"option 'key_per_topic' must be true or false, got {key_per_topic!r}")
    window = timedelta(hours=48)
    key: KeySource = _ShopifyTopicKey() if key_per_topic else HeaderKey(("X-Shopify-Event-Id",))
    return Preset(
        name="shopify",
        retry_window=window,
        default_ttl=default_ttl_for(window),
        key=key,
        verifier=BodyHmacVerifier(header="X-Shopify-Hmac-Sha256", encoding="base64"),
        type_source=HeaderType("X-Shopify-Topic"),
    )


def standard_webhooks(*, tolerance: int = DEFAULT_TOLERANCE) -> Preset:
    """Standard Webhooks / Svix: key = header ``webhook-id`` (``svix-id`` accepted).

    Signature per https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md
    (see ``_verify_standard``), tolerance 5 minutes as in the reference libraries. Svix
    retries "immediately, 5 seconds, 5 minutes, 30 minutes, 2 hours, 5 hours, 10 hours,
    10 hours", each after the previous failure (https://docs.svix.com/retries): the last
    attempt comes 27 h 35 min 5 s after the first, rounded up to 28 h.
    """
    window = timedelta(hours=28)
    return Preset(
        name="standard-webhooks",
        retry_window=window,
        default_ttl=default_ttl_for(window),
        key=HeaderKey(("webhook-id", "svix-id")),
        verifier=StandardWebhooksVerifier(tolerance=_tolerance(tolerance)),
        type_source=BodyType("type"),
    )


def slack(*, tolerance: int = DEFAULT_TOLERANCE) -> Preset:
    """Slack Events API: key = body ``event_id``.

    ``X-Slack-Signature: v0=<hex>`` over ``f"v0:{timestamp}:{body}"`` with
    ``X-Slack-Request-Timestamp``; Slack asks to reject requests older than 5 minutes
    (https://api.slack.com/authentication/verifying-requests-from-slack). Slack retries a
    failed event 3 times: immediately, after 1 minute, after 5 minutes
    (https://api.slack.com/apis/events-api#retries); 1 hour is a conservative window.
    ``url_verification`` handshakes have no ``event_id`` and fail key extraction on purpose.
    """
    window = timedelta(hours=1)
    return Preset(
        name="slack",
        retry_window=window,
        default_ttl=default_ttl_for(window),
        key=BodyKey("event_id"),
        verifier=SlackVerifier(tolerance=_tolerance(tolerance)),
        type_source=BodyType("event.type"),
    )


def square() -> Preset:
    """Square: key = body ``event_id``.

    ``x-square-hmacsha256-signature`` is base64 HMAC-SHA256 of notification URL + body keyed
    by the subscription's signature key, so verify() needs ``url``. The legacy SHA-1
    ``x-square-signature`` alone is reported as unsupported. No timestamp header. Retries:
    "Unsuccessful deliveries are retried for up to 24 hours" in the current troubleshooting
    page, 72 hours in another version of it
    (https://developer.squareup.com/docs/webhooks/troubleshooting); 72 h is used.
    """
    window = timedelta(hours=72)
    return Preset(
        name="square",
        retry_window=window,
        default_ttl=default_ttl_for(window),
        key=BodyKey("event_id"),
        verifier=BodyHmacVerifier(
            header="x-square-hmacsha256-signature",
            encoding="base64",
            sign_url=True,
            legacy=(("x-square-signature", "legacy HMAC-SHA1"),),
        ),
        type_source=BodyType("type"),
    )


def paddle(*, tolerance: int = DEFAULT_TOLERANCE) -> Preset:
    """Paddle Billing: key = body ``event_id``, never ``notification_id``.

    One event yields one notification per destination, and each replay creates a new
    notification "related to the same event_id" (Paddle API, replay a notification), so
    ``notification_id`` differs between copies of one event.
    ``Paddle-Signature: ts=…;h1=…[;h1=…]`` is hex HMAC-SHA256 over ``f"{ts}:{body}"`` keyed by
    the whole ``pdl_ntf_…`` secret. The Paddle SDK's default tolerance is 5 s; 300 s is used
    here so that a record checked later in the worker (against the ingress receive time) or
    a sender clock a little off is not rejected, while still bounding replays.
    Retries: live accounts "up to 60 times over 3 days"
    (https://developer.paddle.com/webhooks/respond-to-webhooks). Notifications can be
    replayed by hand while retained, and "notifications older than 90 days aren't retained"
    (https://developer.paddle.com/api-reference/notifications/replay-notification), so the
    default TTL is 91 days: a replay of an event already handled stays a duplicate.
    """
    window = timedelta(days=3)
    return Preset(
        name="paddle",
        retry_window=window,
        default_ttl=default_ttl_for(window, at_least=timedelta(days=91)),
        key=BodyKey("event_id"),
        verifier=KeyValueHeaderVerifier(
            header="Paddle-Signature",
            item_separator=";",
            timestamp_field="ts",
            signature_field="h1",
            message_separator=":",
            tolerance=_tolerance(tolerance),
        ),
        type_source=BodyType("event_type"),
        foreign_secrets=(
            ("pdl_live_apikey_", "a Paddle API key"),
            ("pdl_sdbx_apikey_", "a Paddle sandbox API key"),
        ),
    )


@dataclass(frozen=True, slots=True)
class _LenientBodyType:
    """A body field as type; None when the body is not a JSON object (gateways forward anything)."""

    path: str

    def extract(self, headers: HeaderView, body: bytes, provider: str) -> str | None:
        try:
            return _body.optional_text(body, self.path, provider)
        except BodyError:
            return None


def webhooker(*, tolerance: int = DEFAULT_TOLERANCE) -> Preset:
    """Webhooker (webhooker.eu gateway): key = header ``X-Webhooker-Event-Id``.

    The gateway adds ``X-Webhooker-Event-Id`` (the event's public id) to every forwarded
    request, replays included (webhooker-cli README). Its outbound signature format is not
    published where we could find it; this preset assumes
    ``X-Webhooker-Signature: t=<ts>,v1=<hex HMAC-SHA256 of "{t}.{body}">`` with a 300 s window.
    The gateway stores every event and replays on demand with a configurable retry policy;
    no default schedule is published, so the window is 3 days (Stripe's, the longest of the
    providers it commonly fronts) and the TTL the 7-day floor.
    """
    window = timedelta(days=3)
    return Preset(
        name="webhooker",
        retry_window=window,
        default_ttl=default_ttl_for(window),
        key=HeaderKey(("X-Webhooker-Event-Id",)),
        verifier=KeyValueHeaderVerifier(
            header="X-Webhooker-Signature",
            item_separator=",",
            timestamp_field="t",
            signature_field="v1",
            message_separator=".",
            tolerance=_tolerance(tolerance),
        ),
        type_source=FirstType((HeaderType("X-Webhooker-Event-Type"), _LenientBodyType("type"))),
    )


def sweego(*, tolerance: int = DEFAULT_TOLERANCE) -> Preset:
    """Sweego (email/SMS events): key = body ``event_id``, never ``transaction_id``.

    ``transaction_id`` is shared by every event of one email (sent, delivered, opened…).
    There is no fallback to ``webhook-id``: Sweego documents it as a "unique identifier for
    this webhook request", not for the event, so it may change between attempts.
    Signature: Standard Webhooks layout (``webhook-id``, ``webhook-timestamp``,
    ``webhook-signature``) but the signature is bare base64 without ``v1,`` and the secret is
    base64 without ``whsec_`` (https://learn.sweego.io/docs/webhooks/webhook_signature;
    Symfony's Sweego bridge uses a 300 s window). Sweego publishes no retry schedule we could
    find: 3 days is assumed, with the 7-day TTL floor.
    """
    window = timedelta(days=3)
    return Preset(
        name="sweego",
        retry_window=window,
        default_ttl=default_ttl_for(window),
        key=BodyKey("event_id"),
        verifier=StandardWebhooksVerifier(
            id_headers=("webhook-id",),
            timestamp_headers=("webhook-timestamp",),
            signature_headers=("webhook-signature",),
            tolerance=_tolerance(tolerance),
            bare_signatures=True,
        ),
        type_source=BodyType("event_type"),
    )
