"""Published test vectors from provider documentation and official SDKs, byte for byte."""

from __future__ import annotations

import pytest

from pipeline import providers
from pipeline.errors import SignatureError


def test_standard_webhooks_reference_vector() -> None:
    """The Standard Webhooks reference vector passes, with and without the whsec_ prefix."""
    # standard-webhooks/standard-webhooks libraries/python/tests/test_webhooks.py
    headers = {
        "webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek",
        "webhook-timestamp": "1614265330",
        "webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
    }
    body = b'{"test": 2432232314}'
    provider = providers.get("standard-webhooks")
    for secret in ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"):
        provider.verify(headers, body, [secret], now=1614265330)
    assert provider.idempotency_key(headers, body) == "msg_p5jXN8AQM9LWM0D4loKWxJek"


def test_github_documentation_example() -> None:
    """GitHub's 'Validating webhook deliveries' documentation example passes."""
    headers = {
        "X-Hub-Signature-256": "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    }
    providers.get("github").verify(headers, b"Hello, World!", ["It's a Secret to Everybody"], now=0)


def test_slack_documentation_example() -> None:
    """Slack's 'Verifying requests from Slack' walkthrough (a slash-command body)."""
    body = (
        b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V"
        b"&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text="
        b"&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN"
        b"&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c"
    )
    headers = {
        "X-Slack-Request-Timestamp": "1531420618",
        "X-Slack-Signature": "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503",
    }
    providers.get("slack").verify(headers, body, ["8f742231b10e8888abcd99yyyzzz85a5"], now=1531420618)


# square/square-python-sdk tests/utilities/test_webhooks_helper.py
SQUARE_BODY = (
    b'{"merchant_id":"MLEFBHHSJGVHD","type":"webhooks.test_notification",'
    b'"event_id":"ac3ac95b-f97d-458c-a6e6-18981597e05f","created_at":"2022-07-13T20:30:59.037339943Z",'
    b'"data":{"type":"webhooks","id":"bc368e64-01aa-407e-b46e-3231809b1129"}}'
)
SQUARE_HEADERS = {"x-square-hmacsha256-signature": "GF4YkrJgGBDZ9NIYbNXBnMzqb2HoL4RW/S6vkZ9/2N4="}
SQUARE_KEY = "Ibxx_5AKakO-3qeNVR61Dw"
SQUARE_URL = "https://webhook.site/679a4f3a-dcfa-49ee-bac5-9d0edad886b9"


def test_square_sdk_vector() -> None:
    """The Square Python SDK's webhook helper vector passes, and its event_id is the key."""
    provider = providers.get("square")
    provider.verify(SQUARE_HEADERS, SQUARE_BODY, [SQUARE_KEY], now=0, url=SQUARE_URL)
    assert provider.idempotency_key(SQUARE_HEADERS, SQUARE_BODY) == "ac3ac95b-f97d-458c-a6e6-18981597e05f"
    assert provider.event_type(SQUARE_HEADERS, SQUARE_BODY) == "webhooks.test_notification"


@pytest.mark.parametrize(
    ("key", "url"),
    [
        ("MCmhFRxGX82xMwg5FsaoQA", SQUARE_URL),  # the SDK's wrong-key case
        (
            SQUARE_KEY,
            "https://webhook.site/79a4f3a-dcfa-49ee-bac5-9d0edad886b9",
        ),  # its URL-mismatch case
    ],
)
def test_square_sdk_negative_vectors(key: str, url: str) -> None:
    """The Square SDK's wrong-key and wrong-URL cases are rejected."""
    with pytest.raises(SignatureError, match="no signature matched"):
        providers.get("square").verify(SQUARE_HEADERS, SQUARE_BODY, [key], now=0, url=url)


def test_paddle_sdk_vector_with_rotation() -> None:
    """Paddle SDK vector: a dummy h1 and a real one; of three secrets only the third signs."""
    # PaddleHQ/paddle-python-sdk tests/Unit/Notification/test_Verifier.py
    headers = {
        "Paddle-Signature": "ts=1696195954;h1=dummy;"
        "h1=d96299976a6eb066f484d7fde011ac56fc32b38fc9940bc419d6e537fdc6ef02"
    }
    secrets = [
        "pdl_ntf_01hbpjmytsa32fhr36nqgc3kgb_TjIG2BXbm83HPXqNfziwe506sBEdqL/4",
        "pdl_ntf_01hbpjmytsa32fhr36nqgc3kgb_vB/yIOnTOCWIvpBadM5jzBZPHc7OmdSo",
        "pdl_ntf_01hbpjmytsa32fhr36nqgc3kgb_WvRO0eL4Bj9rgYYIBZY6wZhG4EHy9jzh",
    ]
    providers.get("paddle").verify(headers, b"hello-world", secrets, now=1696195954)
    with pytest.raises(SignatureError, match="no signature matched"):
        providers.get("paddle").verify(headers, b"hello-world", secrets[:2], now=1696195954)


# symfony/symfony src/Symfony/Component/Mailer/Bridge/Sweego/Tests/Webhook/
#   SweegoSignedRequestParserTest.php and Fixtures/delivered.json (file bytes, final newline kept)
SWEEGO_BODY = b"""{
    "event_type": "delivered",
    "timestamp": "2024-08-15T16:05:59+00:00",
    "swg_uid": "02-0d4affd0-1183-43b1-a980-ab30b3374dd3",
    "event_id": "9f26b9d0-13d7-410c-ba04-5019cd30e6d0",
    "channel": "email",
    "headers": {
        "x-campaign-type": "default",
        "x-swg-uid": "01-f14sqdf65-fgh9b6-4160-bc45-fliolioa277ca9",
        "x-mailer": "Sweego",
        "x-campaign-id": "default",
        "x-client-id": "0c8cc711c85e4595953862",
        "x-originating-ip": "XXX.XXX.XXX.XX",
        "x-email-id": "23",
        "x-transaction-id": "d4fbec9d-eed9-44d5-af47-c1126467a5ca"
    },
    "campaign_tags": null,
    "campaign_type": "transac",
    "campaign_id": "transac",
    "recipient": "recipient@example.com",
    "domain_from": "example.org"
}
"""
SWEEGO_HEADERS = {
    "webhook-id": "9f26b9d0-13d7-410c-ba04-5019cd30e6d0",
    "webhook-timestamp": "1723737959",
    "webhook-signature": "E1RfmN81xnbXMqDZUD0eJjPQEWmf24ft//gtV29bp18=",
}


@pytest.mark.parametrize(
    ("offset", "accepted"), [(0, True), (300, True), (-300, True), (301, False), (-301, False)]
)
def test_sweego_vector_from_symfony_bridge(offset: int, accepted: bool) -> None:
    """Symfony's Sweego fixture (bare base64 signature): accepted within ±300 s, rejected beyond."""
    provider = providers.get("sweego")
    now = 1723737959 + offset
    if accepted:
        provider.verify(SWEEGO_HEADERS, SWEEGO_BODY, ["GvLY88Uyj70jQm3fUwYyWmAaiz98wWim"], now=now)
    else:
        with pytest.raises(SignatureError, match="window"):
            provider.verify(SWEEGO_HEADERS, SWEEGO_BODY, ["GvLY88Uyj70jQm3fUwYyWmAaiz98wWim"], now=now)
    assert provider.idempotency_key(SWEEGO_HEADERS, SWEEGO_BODY) == "9f26b9d0-13d7-410c-ba04-5019cd30e6d0"
    assert provider.event_type(SWEEGO_HEADERS, SWEEGO_BODY) == "delivered"


def test_standard_webhooks_multi_signature_header_from_reference_tests() -> None:
    """The reference tests' mixed header (wrong v1, unknown v2, the valid v1) verifies."""
    valid = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    headers = {
        "webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek",
        "webhook-timestamp": "1614265330",
        "webhook-signature": " ".join(
            [
                "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc=",
                "v2,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc=",
                valid,
                "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc=",
            ]
        ),
    }
    providers.get("standard-webhooks").verify(
        headers, b'{"test": 2432232314}', ["MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"], now=1614265330
    )
