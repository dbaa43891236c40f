"""Our signers and verifiers agree with stripe, standardwebhooks and slack_sdk, both ways."""

from __future__ import annotations

import base64
import random
import time
from datetime import UTC, datetime

import orjson
import pytest
import stripe
from slack_sdk.signature import Clock, SignatureVerifier
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from pipeline import providers
from pipeline.providers.signing import sign

_ALPHABET = 'abcXYZ019 {}":,.-_/\\éüß中文字🙂🚀\u200b\t'


def _payloads(count: int = 5) -> list[bytes]:
    """Seeded random JSON bodies with unicode (multi-byte) text."""
    rng = random.Random(20240601)
    bodies = []
    for index in range(count):
        text = "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(1, 200)))
        document = {
            "id": f"evt_{index}{rng.getrandbits(40):x}",
            "object": "event",
            "type": "demo.test",
            "text": text,
        }
        bodies.append(orjson.dumps(document))
    return bodies


PAYLOADS = _payloads()
STRIPE_SECRET = "whsec_test_" + "k" * 24
SW_SECRET = "whsec_" + base64.b64encode(random.Random(7).randbytes(24)).decode()
SLACK_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"


class _FixedClock(Clock):
    def __init__(self, now: float) -> None:
        self._now = now

    def now(self) -> float:
        return self._now


@pytest.mark.parametrize("body", PAYLOADS)
def test_stripe_sdk_verifies_our_signature(body: bytes) -> None:
    """stripe.Webhook.construct_event accepts a Stripe-Signature we produced."""
    now = int(time.time())
    headers = sign("stripe", body, STRIPE_SECRET, timestamp=now)
    event = stripe.Webhook.construct_event(body, headers["Stripe-Signature"], STRIPE_SECRET, tolerance=300)
    assert event.id == orjson.loads(body)["id"]


@pytest.mark.parametrize("body", PAYLOADS)
def test_we_verify_the_stripe_sdk_signature(body: bytes) -> None:
    """A header from stripe.WebhookSignature.generate_signature_header passes our verify."""
    header = stripe.WebhookSignature.generate_signature_header(
        body.decode(), STRIPE_SECRET, timestamp=1_700_000_000
    )
    providers.get("stripe").verify({"stripe-signature": header}, body, [STRIPE_SECRET], now=1_700_000_000)


@pytest.mark.parametrize("body", PAYLOADS)
def test_standardwebhooks_sdk_verifies_our_signature(body: bytes) -> None:
    """standardwebhooks.Webhook(secret).verify accepts the headers we produced."""
    headers = sign("standard-webhooks", body, SW_SECRET, timestamp=time.time(), msg_id="msg_cross")
    assert Webhook(SW_SECRET).verify(body, headers) == orjson.loads(body)


@pytest.mark.parametrize("body", PAYLOADS)
def test_we_verify_the_standardwebhooks_sdk_signature(body: bytes) -> None:
    """standardwebhooks.Webhook(secret).sign output passes our verify (whsec_ or bare secret)."""
    at = datetime.fromtimestamp(1_700_000_000, tz=UTC)
    signature = Webhook(SW_SECRET).sign("msg_cross", at, body.decode())
    headers = {
        "webhook-id": "msg_cross",
        "webhook-timestamp": "1700000000",
        "webhook-signature": signature,
    }
    provider = providers.get("standard-webhooks")
    provider.verify(headers, body, [SW_SECRET], now=1_700_000_000)
    provider.verify(headers, body, [SW_SECRET.removeprefix("whsec_")], now=1_700_000_000)


@pytest.mark.parametrize("body", PAYLOADS)
def test_slack_sdk_verifies_our_signature(body: bytes) -> None:
    """slack_sdk's SignatureVerifier accepts the headers we produced."""
    headers = sign("slack", body, SLACK_SECRET, timestamp=1_700_000_000)
    verifier = SignatureVerifier(SLACK_SECRET, clock=_FixedClock(1_700_000_000))
    assert verifier.is_valid_request(body, headers)


@pytest.mark.parametrize("body", PAYLOADS)
def test_we_verify_the_slack_sdk_signature(body: bytes) -> None:
    """A signature from slack_sdk's generate_signature passes our verify."""
    signature = SignatureVerifier(SLACK_SECRET).generate_signature(timestamp="1700000000", body=body)
    assert signature is not None
    headers = {"X-Slack-Request-Timestamp": "1700000000", "X-Slack-Signature": signature}
    providers.get("slack").verify(headers, body, [SLACK_SECRET], now=1_700_000_000)


def test_the_sdks_reject_what_we_reject() -> None:
    """A one-byte change fails in the SDKs too, so the cross-checks are not vacuous."""
    body = PAYLOADS[0]
    tampered = body[:-2] + b" }"
    now = int(time.time())
    stripe_header = sign("stripe", body, STRIPE_SECRET, timestamp=now)["Stripe-Signature"]
    with pytest.raises(stripe.SignatureVerificationError):
        stripe.WebhookSignature.verify_header(tampered, stripe_header, STRIPE_SECRET, tolerance=300)
    sw_headers = sign("standard-webhooks", body, SW_SECRET, timestamp=now)
    with pytest.raises(WebhookVerificationError, match="No matching signature"):
        Webhook(SW_SECRET).verify(tampered, sw_headers)
    slack_headers = sign("slack", body, SLACK_SECRET, timestamp=now)
    assert not SignatureVerifier(SLACK_SECRET).is_valid_request(tampered, slack_headers)
