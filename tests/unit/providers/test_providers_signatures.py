"""Signature checks of every signing preset, stated once and run against each preset."""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from typing import Any

import pytest

from pipeline import providers
from pipeline.errors import ConfigError, SignatureError
from pipeline.providers.signing import sign

T = 1_700_000_000  # the signing time used throughout
BODY = '{"id": "evt_1", "event_id": "e-1", "type": "demo", "note": "naïve café ☕"}'.encode()


def _b64_secret(seed: bytes, prefix: str) -> str:
    return prefix + base64.b64encode(seed * 4).decode()


@dataclass(frozen=True)
class Case:
    """How one preset signs: its secrets, headers and how to tamper with them."""

    provider: str
    secrets: tuple[str, str]  # (old, current): rotation keeps both configured
    signature_header: str
    malformed: str  # a value of signature_header that is structurally wrong
    timestamp_header: str | None = None  # header carrying the signed timestamp
    timestamp_prefix: str = ""  # "t=" when the timestamp shares the signature header
    multi_separator: str | None = None  # how several signatures are joined in one header
    url: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def timestamped(self) -> bool:
        """Whether the scheme signs a timestamp (and so has a window)."""
        return self.timestamp_header is not None

    def __str__(self) -> str:
        return self.provider if not self.options else f"{self.provider}-{self.options.get('encoding', 'hex')}"


CASES = [
    Case(
        "stripe",
        ("whsec_old0old0old0", "whsec_current1current1"),
        "Stripe-Signature",
        malformed="garbage",
        timestamp_header="Stripe-Signature",
        timestamp_prefix="t=",
        multi_separator=",",
    ),
    Case("github", ("old secret", "It's a Secret"), "X-Hub-Signature-256", malformed="md5=abc"),
    Case("shopify", ("shpss_old", "shpss_current"), "X-Shopify-Hmac-Sha256", malformed="   "),
    Case(
        "standard-webhooks",
        (_b64_secret(b"old-key!", "whsec_"), _b64_secret(b"new-key!", "whsec_")),
        "webhook-signature",
        malformed="garbage",
        timestamp_header="webhook-timestamp",
        multi_separator=" ",
    ),
    Case(
        "slack",
        ("8f742231b10e8888abcd99yyyzzz0000", "8f742231b10e8888abcd99yyyzzz85a5"),
        "X-Slack-Signature",
        malformed="garbage",
        timestamp_header="X-Slack-Request-Timestamp",
    ),
    Case(
        "square",
        ("sq-old-key", "sq-current-key"),
        "x-square-hmacsha256-signature",
        malformed="",
        url="https://example.com/hooks/square",
    ),
    Case(
        "paddle",
        ("pdl_ntf_01old_aaaa", "pdl_ntf_01new_bbbb"),
        "Paddle-Signature",
        malformed="garbage",
        timestamp_header="Paddle-Signature",
        timestamp_prefix="ts=",
        multi_separator=";",
    ),
    Case(
        "webhooker",
        ("whk-old", "whk-current"),
        "X-Webhooker-Signature",
        malformed="garbage",
        timestamp_header="X-Webhooker-Signature",
        timestamp_prefix="t=",
        multi_separator=",",
    ),
    Case(
        "sweego",
        (_b64_secret(b"sweego-0", ""), _b64_secret(b"sweego-1", "")),
        "webhook-signature",
        malformed=",abc",
        timestamp_header="webhook-timestamp",
        multi_separator=" ",
    ),
    Case(
        "generic",
        ("generic-old", "generic-current"),
        "X-Signature",
        malformed="md5=abc",
        options={
            "key_header": "X-Event-Id",
            "signature_header": "X-Signature",
            "signature_prefix": "sha256=",
        },
    ),
    Case(
        "generic",
        ("generic-old", "generic-current"),
        "X-Signature",
        malformed="",
        options={"key_path": "id", "signature_header": "X-Signature", "encoding": "base64"},
    ),
]
TIMESTAMPED = [case for case in CASES if case.timestamped]
MULTI = [case for case in CASES if case.multi_separator]


def signed(case: Case, *, secret: str | None = None, body: bytes = BODY, at: int = T) -> dict[str, str]:
    """Headers ``case``'s sender attaches, signed with ``secret`` (default: the current one)."""
    return sign(
        case.provider,
        body,
        secret or case.secrets[1],
        timestamp=at,
        msg_id="msg_fixed_id",
        url=case.url,
        **case.options,
    )


def verify(
    case: Case,
    headers: dict[str, str],
    *,
    body: bytes = BODY,
    now: float = T,
    secrets: list[str] | None = None,
) -> None:
    """Run ``case``'s verifier with its current secret unless ``secrets`` is given."""
    provider = providers.get(case.provider, **case.options)
    provider.verify(headers, body, [case.secrets[1]] if secrets is None else secrets, now=now, url=case.url)


def rejection(case: Case, headers: dict[str, str], **kwargs: object) -> str:
    """The SignatureError message ``verify`` raises."""
    with pytest.raises(SignatureError) as caught:
        verify(case, headers, **kwargs)  # type: ignore[arg-type]
    return str(caught.value)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_valid_signature_is_accepted(case: Case) -> None:
    """A request signed with the configured secret passes."""
    verify(case, signed(case))


@pytest.mark.parametrize("case", CASES, ids=str)
def test_header_names_match_case_insensitively(case: Case) -> None:
    """Headers given as a plain dict in upper or lower case verify the same."""
    verify(case, {name.upper(): value for name, value in signed(case).items()})
    verify(case, {name.lower(): value for name, value in signed(case).items()})


@pytest.mark.parametrize("case", CASES, ids=str)
def test_one_changed_body_byte_is_rejected(case: Case) -> None:
    """Flipping one bit of the body makes no signature match."""
    tampered = BODY[:-1] + bytes([BODY[-1] ^ 1])
    assert "no signature matched" in rejection(case, signed(case), body=tampered)


@pytest.mark.parametrize("case", TIMESTAMPED, ids=str)
def test_a_changed_timestamp_is_rejected(case: Case) -> None:
    """Moving the signed timestamp by one second (still inside the window) breaks the signature."""
    assert case.timestamp_header is not None
    headers = signed(case)
    old, new = f"{case.timestamp_prefix}{T}", f"{case.timestamp_prefix}{T + 1}"
    headers[case.timestamp_header] = headers[case.timestamp_header].replace(old, new)
    assert "no signature matched" in rejection(case, headers)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_a_wrong_secret_is_rejected_without_leaking_secrets(case: Case) -> None:
    """Signed with another secret: rejected, and the message shows neither secret nor signature."""
    message = rejection(case, signed(case, secret=case.secrets[0]))
    assert "no signature matched" in message
    signatures = re.findall(r"[A-Za-z0-9+/]{20,}", signed(case)[case.signature_header])
    assert signatures
    for secret_or_signature in (*case.secrets, *signatures):
        assert secret_or_signature not in message


@pytest.mark.parametrize("case", CASES, ids=str)
def test_rotation_accepts_any_configured_secret(case: Case) -> None:
    """With two secrets configured, a request signed by the second one passes."""
    verify(case, signed(case), secrets=[case.secrets[0], case.secrets[1]])
    verify(case, signed(case, secret=case.secrets[0]), secrets=list(case.secrets))


@pytest.mark.parametrize("case", MULTI, ids=str)
def test_any_of_several_signatures_in_the_header_may_match(case: Case) -> None:
    """A header carrying old- and new-secret signatures passes with only the new secret."""
    assert case.multi_separator is not None
    old = signed(case, secret=case.secrets[0])[case.signature_header]
    new = signed(case)[case.signature_header]
    if case.timestamp_header == case.signature_header:  # "t=…,v1=…": append only the v1 item
        new = new.split(case.multi_separator, 1)[1]
    headers = signed(case)
    headers[case.signature_header] = f"{old}{case.multi_separator}{new}"
    verify(case, headers)


@pytest.mark.parametrize("case", TIMESTAMPED, ids=str)
@pytest.mark.parametrize(("offset", "word"), [(301, "stale"), (-301, "future")])
def test_timestamps_outside_the_window_are_rejected(case: Case, offset: int, word: str) -> None:
    """301 s too old or too new is rejected, saying which way, by how much, and the window."""
    message = rejection(case, signed(case), now=T + offset)
    assert word in message
    assert "301 s" in message
    assert "window" in message


@pytest.mark.parametrize("case", TIMESTAMPED, ids=str)
@pytest.mark.parametrize("offset", [300, -300])
def test_timestamps_at_the_window_edge_are_accepted(case: Case, offset: int) -> None:
    """Exactly 300 s of skew either way is still inside the window."""
    verify(case, signed(case), now=T + offset)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_missing_signature_header_is_named(case: Case) -> None:
    """Without the signature header the message names that header."""
    headers = {k: v for k, v in signed(case).items() if k.lower() != case.signature_header.lower()}
    message = rejection(case, headers)
    assert case.signature_header in message
    assert "missing" in message


@pytest.mark.parametrize(
    "case", [c for c in TIMESTAMPED if c.timestamp_header != c.signature_header], ids=str
)
def test_missing_timestamp_header_is_named(case: Case) -> None:
    """Without the separate timestamp header the message names it."""
    assert case.timestamp_header is not None
    headers = {k: v for k, v in signed(case).items() if k.lower() != case.timestamp_header.lower()}
    assert case.timestamp_header in rejection(case, headers)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_malformed_signature_header_is_reported(case: Case) -> None:
    """A structurally wrong signature header is reported as malformed."""
    headers = signed(case)
    headers[case.signature_header] = case.malformed
    assert "malformed" in rejection(case, headers)


@pytest.mark.parametrize("case", TIMESTAMPED, ids=str)
def test_non_numeric_timestamp_is_malformed(case: Case) -> None:
    """A timestamp that is not unix seconds is reported as malformed."""
    assert case.timestamp_header is not None
    headers = signed(case)
    old = f"{case.timestamp_prefix}{T}"
    headers[case.timestamp_header] = headers[case.timestamp_header].replace(
        old, f"{case.timestamp_prefix}soon"
    )
    assert "malformed" in rejection(case, headers)


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("secrets", [[], [""]])
def test_no_secrets_configured_is_reported(case: Case, secrets: list[str]) -> None:
    """An empty secret list is its own failure, not a signature mismatch."""
    assert "no secrets configured" in rejection(case, signed(case), secrets=secrets)


def test_a_single_string_instead_of_a_secret_list_is_a_config_error() -> None:
    """Passing one secret string (which would be iterated by character) is refused."""
    with pytest.raises(ConfigError, match="list of strings"):
        providers.get("github").verify({}, b"", "secret", now=T)


def test_stripe_v0_only_is_an_unsupported_scheme() -> None:
    """A Stripe-Signature with only a v0 (test-mode) signature says the scheme is unsupported."""
    headers = {"Stripe-Signature": f"t={T},v0=abcdef"}
    assert "unsupported signature scheme" in rejection(CASES[0], headers)


def test_standard_webhooks_v1a_only_is_an_unsupported_scheme() -> None:
    """Only asymmetric v1a (ed25519) entries: the message says v1a is unsupported."""
    case = next(c for c in CASES if c.provider == "standard-webhooks")
    headers = signed(case)
    headers["webhook-signature"] = "v1a,aGVsbG8= v1a,d29ybGQ="
    message = rejection(case, headers)
    assert "unsupported signature scheme" in message
    assert "v1a" in message


def test_standard_webhooks_accepts_svix_header_names() -> None:
    """svix-id / svix-timestamp / svix-signature are read when the webhook-* ones are absent."""
    case = next(c for c in CASES if c.provider == "standard-webhooks")
    headers = {name.replace("webhook-", "svix-"): value for name, value in signed(case).items()}
    verify(case, headers)


def test_github_sha1_only_is_an_unsupported_scheme() -> None:
    """Only the legacy SHA-1 X-Hub-Signature: unsupported scheme, naming the header we need."""
    message = rejection(CASES[1], {"X-Hub-Signature": "sha1=abc"})
    assert "unsupported signature scheme" in message
    assert "X-Hub-Signature-256" in message


def test_slack_unknown_version_is_an_unsupported_scheme() -> None:
    """A Slack signature with a version other than v0 is reported as unsupported."""
    case = next(c for c in CASES if c.provider == "slack")
    headers = signed(case)
    headers["X-Slack-Signature"] = headers["X-Slack-Signature"].replace("v0=", "v9=")
    assert "unsupported signature scheme" in rejection(case, headers)


def test_square_needs_the_notification_url() -> None:
    """Square signs URL + body: without url verify() says the url is required."""
    headers = sign("square", BODY, "key", timestamp=T, url="https://example.com/hook")
    with pytest.raises(SignatureError, match="url required"):
        providers.get("square").verify(headers, BODY, ["key"], now=T)


def test_square_rejects_another_url() -> None:
    """A Square signature for one URL does not verify for another."""
    headers = sign("square", BODY, "key", timestamp=T, url="https://example.com/hook")
    with pytest.raises(SignatureError, match="no signature matched"):
        providers.get("square").verify(headers, BODY, ["key"], now=T, url="https://example.com/other")


def test_generic_without_a_scheme_refuses_to_verify() -> None:
    """A generic source with no signature_header cannot be verified, and says so."""
    provider = providers.get("generic", key_header="X-Id")
    with pytest.raises(SignatureError, match="generic source has no signature scheme configured"):
        provider.verify({"X-Id": "1"}, BODY, ["secret"], now=T)


def test_a_secret_that_is_not_base64_is_a_config_error() -> None:
    """A secret that does not decode is named by position, never by value."""
    case = next(c for c in CASES if c.provider == "standard-webhooks")
    with pytest.raises(ConfigError, match="secret #1") as caught:
        verify(case, signed(case), secrets=["whsec_!!!!"])
    assert "!!!!" not in str(caught.value)
