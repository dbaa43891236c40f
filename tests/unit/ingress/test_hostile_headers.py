"""Hostile headers at the ingress (event ids, timestamps, signatures): 4xx with a reason, never 5xx."""

from __future__ import annotations

import gzip
from collections.abc import AsyncIterator

import pytest

from tests.unit.ingress.hostile_requests import (
    EVT,
    GH,
    NOW,
    PADDLE,
    SLACK,
    SQUARE,
    SQUARE_URL,
    STRIPE_FORGED,
    STRIPE_SIG,
    SWEEGO,
    WEBHOOKER,
    Case,
    Sink,
    check_answer,
    deflate,
    ok,
    replaced,
    serve,
    signed,
    without,
)


@pytest.fixture
async def served() -> AsyncIterator[tuple[int, Sink]]:
    async with serve() as port_and_sink:
        yield port_and_sink


VALID = [
    Case("stripe signed", ok(202), "/webhooks/stripe", STRIPE_SIG, EVT),
    Case("github signed", ok(202), "/webhooks/github", signed("github", b'{"zen": "x"}'), b'{"zen": "x"}'),
    Case("shopify signed", ok(202), "/webhooks/shopify", signed("shopify", b"{}"), b"{}"),
    Case(
        "standard webhooks signed",
        ok(202),
        "/webhooks/standard-webhooks",
        signed("standard-webhooks", b"{}"),
        b"{}",
    ),
    Case("sweego signed", ok(202), "/webhooks/sweego", signed("sweego", SWEEGO), SWEEGO),
    Case("slack signed", ok(202), "/webhooks/slack", signed("slack", SLACK), SLACK),
    Case("square signed", ok(202), "/webhooks/square", signed("square", SQUARE, url=SQUARE_URL), SQUARE),
    Case("paddle signed", ok(202), "/webhooks/paddle", signed("paddle", PADDLE), PADDLE),
    Case("webhooker signed", ok(202), "/webhooks/webhooker", signed("webhooker", WEBHOOKER), WEBHOOKER),
    Case("utf-8 non-ascii event id", ok(202), headers=(("X-GitHub-Delivery", "délivery-é-✓"),), body=b"{}"),
    Case("event id repeated, same value", ok(202), headers=GH + GH, body=b"{}"),
    Case("event id of 8000 characters", ok(202), headers=(("X-GitHub-Delivery", "g" * 8000),), body=b"{}"),
    Case("chunked body", ok(202), headers=GH, body=b'{"a": 1}', framing="chunked"),
    Case("gzip body", ok(202), headers=(*GH, ("Content-Encoding", "gzip")), body=gzip.compress(b"{}")),
    Case(
        "GZIP spelled upper case",
        ok(202),
        headers=(*GH, ("Content-Encoding", "GZIP")),
        body=gzip.compress(b"{}"),
    ),
    Case("deflate body", ok(202), headers=(*GH, ("Content-Encoding", "deflate")), body=deflate(b"{}")),
    Case("identity coding", ok(202), headers=(*GH, ("Content-Encoding", "identity")), body=b"{}"),
    Case("integer body id", ok(202), "/webhooks/generic-open", body=b'{"id": 12345}'),
    Case("duplicate JSON keys", ok(202), "/webhooks/generic-open", body=b'{"id": "a", "id": "b"}'),
    Case(
        "100 extra headers", ok(202), headers=GH + tuple((f"X-Pad-{i}", "v") for i in range(100)), body=b"{}"
    ),
]

EVENT_IDS = [
    Case(
        "event id not utf-8 (0xff 0xfe)",
        ok(400),
        headers=(("X-GitHub-Delivery", "\udcff\udcfeab"),),
        body=b"{}",
    ),
    Case("event id latin-1", ok(400), headers=(("X-GitHub-Delivery", "caf\udce9"),), body=b"{}"),
    Case("event id truncated utf-8", ok(400), headers=(("X-GitHub-Delivery", "ab\udcc3"),), body=b"{}"),
    Case(
        "event id utf-8-encoded surrogate",
        ok(400),
        headers=(("X-GitHub-Delivery", "\udced\udca0\udc80"),),
        body=b"{}",
    ),
    Case("event id empty", ok(400), headers=(("X-GitHub-Delivery", ""),), body=b"{}"),
    Case("event id blank", ok(400), headers=(("X-GitHub-Delivery", "   "),), body=b"{}"),
    Case("event id missing", ok(400), body=b"{}"),
    Case(
        "event id repeated, different values",
        ok(400),
        headers=(*GH, ("X-GitHub-Delivery", "guid-2")),
        body=b"{}",
    ),
    Case(
        "event id spelled twice, different values",
        ok(400),
        headers=(*GH, ("x-github-delivery", "guid-2")),
        body=b"{}",
    ),
    Case(
        "event id over the header size limit",
        ok(400, 431),
        headers=(("X-GitHub-Delivery", "g" * 9000),),
        body=b"{}",
    ),
    Case(
        "signed github, event id not utf-8",
        ok(400),
        "/webhooks/github",
        (*without(signed("github", b"{}"), "X-GitHub-Delivery"), ("X-GitHub-Delivery", "\udcff")),
        b"{}",
    ),
    Case(
        "signed standard webhooks, webhook-id not utf-8",
        ok(400),
        "/webhooks/standard-webhooks",
        signed("standard-webhooks", b"{}", msg_id="msg_\udcff\udcfe"),
        b"{}",
    ),
    Case(
        "signed shopify, event id not utf-8",
        ok(400),
        "/webhooks/shopify",
        replaced(signed("shopify", b"{}"), "X-Shopify-Event-Id", "\udcff1"),
        b"{}",
    ),
    Case(
        "signed webhooker, event id not utf-8",
        ok(400),
        "/webhooks/webhooker",
        replaced(signed("webhooker", WEBHOOKER), "X-Webhooker-Event-Id", "\udcff1"),
        WEBHOOKER,
    ),
    Case(
        "svix-id and webhook-id both, unsigned",
        ok(401),
        "/webhooks/standard-webhooks",
        (("webhook-id", "a"), ("svix-id", "b")),
        b"{}",
    ),
]

TIMESTAMPS_AND_SIGNATURES = [
    Case(
        "stripe t= non-ascii digits",
        ok(401),
        "/webhooks/stripe",
        replaced(STRIPE_SIG, "Stripe-Signature", f"t=\u0661\u0662\u0663,v1={'a' * 64}"),
        EVT,
    ),
    Case(
        "stripe t= exponent",
        ok(401),
        "/webhooks/stripe",
        (("Stripe-Signature", f"t=1e9,v1={'a' * 64}"),),
        EVT,
    ),
    Case(
        "stripe t= 20 digits",
        ok(401),
        "/webhooks/stripe",
        (("Stripe-Signature", f"t={'9' * 20},v1={'a' * 64}"),),
        EVT,
    ),
    Case(
        "stripe t= negative", ok(401), "/webhooks/stripe", (("Stripe-Signature", f"t=-1,v1={'a' * 64}"),), EVT
    ),
    Case(
        "stripe t= not utf-8",
        ok(401),
        "/webhooks/stripe",
        (("Stripe-Signature", f"t=\udcff,v1={'a' * 64}"),),
        EVT,
    ),
    Case(
        "stripe signature not utf-8",
        ok(401),
        "/webhooks/stripe",
        (("Stripe-Signature", f"t={NOW},v1=\udcff\udcfe"),),
        EVT,
    ),
    Case("stripe signature empty", ok(401), "/webhooks/stripe", (("Stripe-Signature", ""),), EVT),
    Case(
        "stripe signature only separators",
        ok(401),
        "/webhooks/stripe",
        (("Stripe-Signature", ",,,=,="),),
        EVT,
    ),
    Case(
        "stripe 1000 signatures",
        ok(401),
        "/webhooks/stripe",
        (("Stripe-Signature", f"t={NOW}," + ",".join(["v1=00"] * 1000)),),
        EVT,
    ),
    Case("stripe signature missing", ok(401), "/webhooks/stripe", (), EVT),
    Case("stripe stale", ok(401), "/webhooks/stripe", signed("stripe", EVT, timestamp=NOW - 3600), EVT),
    Case(
        "stripe from the future",
        ok(401),
        "/webhooks/stripe",
        signed("stripe", EVT, timestamp=NOW + 3600),
        EVT,
    ),
    Case("stripe forged", ok(401), "/webhooks/stripe", STRIPE_FORGED, EVT),
    Case(
        "stripe signature repeated: valid and forged",
        ok(400),
        "/webhooks/stripe",
        STRIPE_SIG + STRIPE_FORGED,
        EVT,
    ),
    Case(
        "stripe signature repeated: forged and valid",
        ok(400),
        "/webhooks/stripe",
        STRIPE_FORGED + STRIPE_SIG,
        EVT,
    ),
    Case(
        "github signature not utf-8",
        ok(401),
        "/webhooks/github",
        (*GH, ("X-Hub-Signature-256", "sha256=\udcff")),
        b"{}",
    ),
    Case(
        "github signature not hex",
        ok(401),
        "/webhooks/github",
        (*GH, ("X-Hub-Signature-256", "sha256=" + "z" * 64)),
        b"{}",
    ),
    Case("github signature missing", ok(401), "/webhooks/github", GH, b"{}"),
    Case(
        "shopify hmac not base64",
        ok(401),
        "/webhooks/shopify",
        (("X-Shopify-Event-Id", "1"), ("X-Shopify-Hmac-Sha256", "%%%")),
        b"{}",
    ),
    Case(
        "slack timestamp not utf-8",
        ok(401),
        "/webhooks/slack",
        replaced(signed("slack", SLACK), "X-Slack-Request-Timestamp", "\udcff"),
        SLACK,
    ),
    Case(
        "slack timestamp full-width digits",
        ok(401),
        "/webhooks/slack",
        replaced(signed("slack", SLACK), "X-Slack-Request-Timestamp", "\uff11\uff12\uff13"),
        SLACK,
    ),
    Case(
        "slack timestamp NaN",
        ok(401),
        "/webhooks/slack",
        replaced(signed("slack", SLACK), "X-Slack-Request-Timestamp", "NaN"),
        SLACK,
    ),
    Case(
        "standard webhooks timestamp not utf-8",
        ok(401),
        "/webhooks/standard-webhooks",
        replaced(signed("standard-webhooks", b"{}"), "webhook-timestamp", "\udcff"),
        b"{}",
    ),
    Case(
        "standard webhooks asymmetric v1a only",
        ok(401),
        "/webhooks/standard-webhooks",
        replaced(signed("standard-webhooks", b"{}"), "webhook-signature", "v1a,AAAA"),
        b"{}",
    ),
    Case("paddle ts= letters", ok(401), "/webhooks/paddle", (("Paddle-Signature", "ts=abc;h1=00"),), PADDLE),
    Case(
        "square host not utf-8",
        ok(401),
        "/webhooks/square",
        signed("square", SQUARE, url=SQUARE_URL),
        SQUARE,
        host="h\udcff",
    ),
    Case(
        "webhooker signature not utf-8",
        ok(401),
        "/webhooks/webhooker",
        replaced(signed("webhooker", WEBHOOKER), "X-Webhooker-Signature", "t=1,v1=\udcff"),
        WEBHOOKER,
    ),
]


CASES = [*VALID, *EVENT_IDS, *TIMESTAMPS_AND_SIGNATURES]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
async def test_a_hostile_header_gets_its_4xx_with_a_reason_never_5xx(
    served: tuple[int, Sink], case: Case
) -> None:
    """The request gets the status its case names (4xx with a reason, or 2xx when valid), never 5xx."""
    await check_answer(*served, case)
