"""Schemes that sign ``timestamp + separator + body`` (Stripe, Paddle, webhooker, Slack)."""

# Parts implement shared Protocols, so some take arguments they do not use.
# ruff: noqa: ARG002

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.errors import SignatureError
from pipeline.providers import _hmac
from pipeline.providers._headers import HeaderView


@dataclass(frozen=True, slots=True)
class KeyValueHeaderVerifier:
    """One header of ``key=value`` items: a timestamp and one or more signatures.

    Stripe: ``Stripe-Signature: t=…,v1=…[,v1=…][,v0=…]`` over ``f"{t}.{body}"``.
    Paddle: ``Paddle-Signature: ts=…;h1=…[;h1=…]`` over ``f"{ts}:{body}"``.
    Signatures are hex HMAC-SHA256 keyed by the secret string as given (UTF-8).
    Several signature items may be present (the sender rotating its secret); any may match.
    """

    header: str
    item_separator: str
    timestamp_field: str
    signature_field: str
    message_separator: str
    tolerance: int

    def _parse(self, value: str) -> tuple[str, list[str], list[str]]:
        """``(timestamp text, signatures, other scheme names)`` from the header value."""
        timestamp: str | None = None
        signatures: list[str] = []
        others: list[str] = []
        for position, item in enumerate(value.split(self.item_separator), start=1):
            name, equals, text = item.strip().partition("=")
            if not equals or not name:
                raise SignatureError(f"{self.header} is malformed: item {position} is not key=value")
            if name == self.timestamp_field:
                timestamp = timestamp if timestamp is not None else text
            elif name == self.signature_field:
                signatures.append(text.strip().lower())
            elif name not in others:
                others.append(name)
        if timestamp is None:
            raise SignatureError(f"{self.header} is malformed: no {self.timestamp_field}= timestamp")
        return timestamp, signatures, others

    def _message(self, timestamp: str, body: bytes) -> bytes:
        return f"{timestamp}{self.message_separator}".encode("ascii") + body

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
        """Raise SignatureError unless some secret signed this body at this (recent) time."""
        keys = _hmac.utf8_keys(secrets, provider)
        value = headers.get(self.header)
        if value is None:
            raise SignatureError(f"header {self.header} missing")
        timestamp_text, signatures, others = self._parse(value)
        timestamp = _hmac.parse_timestamp(timestamp_text, self.header)
        if not signatures:
            if others:
                raise SignatureError(
                    f"unsupported signature scheme: {self.header} carries only"
                    f" {', '.join(others)} signature(s); {provider} verification needs"
                    f" {self.signature_field} (HMAC-SHA256)"
                )
            raise SignatureError(f"{self.header} is malformed: no {self.signature_field}= signature")
        message = self._message(timestamp_text.strip(), body)
        expected = (_hmac.encode(_hmac.digest(key, message), "hex") for key in keys)
        if not _hmac.any_match(expected, [_hmac.as_bytes(s) for s in signatures]):
            raise SignatureError(
                f"no signature matched: none of the {len(signatures)} {self.signature_field}"
                f" signature(s) in {self.header} matches under any of the {len(keys)}"
                " configured secret(s)"
            )
        _hmac.check_window(timestamp, now, self.tolerance, self.header)

    def sign(
        self, body: bytes, secret: str, *, timestamp: int, msg_id: str, url: str | None
    ) -> dict[str, str]:
        """``{header: "<ts field>=<t><sep><sig field>=<hex>"}``."""
        signature = _hmac.digest(_hmac.as_bytes(secret), self._message(str(timestamp), body))
        value = (
            f"{self.timestamp_field}={timestamp}{self.item_separator}{self.signature_field}={signature.hex()}"
        )
        return {self.header: value}

    def secret_problem(self, secret: str) -> str | None:
        """What is wrong with ``secret`` for this scheme (used verbatim), or None."""
        return _hmac.text_secret_problem(secret)


@dataclass(frozen=True, slots=True)
class SlackVerifier:
    """Slack: ``X-Slack-Signature: v0=<hex>`` over ``f"v0:{timestamp}:{body}"``.

    The timestamp travels in ``X-Slack-Request-Timestamp``.
    """

    signature_header: str = "X-Slack-Signature"
    timestamp_header: str = "X-Slack-Request-Timestamp"
    version: str = "v0"
    tolerance: int = 300

    def _message(self, timestamp: str, body: bytes) -> bytes:
        return f"{self.version}:{timestamp}:".encode("ascii") + body

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
        """Raise SignatureError unless some signing secret signed this body at this time."""
        keys = _hmac.utf8_keys(secrets, provider)
        for name in (self.signature_header, self.timestamp_header):
            if name not in headers:
                raise SignatureError(f"header {name} missing")
        value = (headers.get(self.signature_header) or "").strip()
        timestamp_text = (headers.get(self.timestamp_header) or "").strip()
        timestamp = _hmac.parse_timestamp(timestamp_text, self.timestamp_header)
        scheme, equals, candidate = value.partition("=")
        if not equals or not candidate:
            raise SignatureError(f"{self.signature_header} is malformed: expected '{self.version}=<hex>'")
        if scheme != self.version:
            raise SignatureError(
                f"unsupported signature scheme: {self.signature_header} uses {scheme!r};"
                f" only {self.version} is supported"
            )
        message = self._message(timestamp_text, body)
        expected = (_hmac.encode(_hmac.digest(key, message), "hex") for key in keys)
        if not _hmac.any_match(expected, [_hmac.as_bytes(candidate.strip().lower())]):
            raise SignatureError(
                f"no signature matched: {self.signature_header} does not match"
                f" under any of the {len(keys)} configured secret(s)"
            )
        _hmac.check_window(timestamp, now, self.tolerance, self.timestamp_header)

    def sign(
        self, body: bytes, secret: str, *, timestamp: int, msg_id: str, url: str | None
    ) -> dict[str, str]:
        """The two Slack headers."""
        signature = _hmac.digest(_hmac.as_bytes(secret), self._message(str(timestamp), body))
        return {
            self.timestamp_header: str(timestamp),
            self.signature_header: f"{self.version}={signature.hex()}",
        }

    def secret_problem(self, secret: str) -> str | None:
        """What is wrong with ``secret`` for this scheme (used verbatim), or None."""
        return _hmac.text_secret_problem(secret)
