"""Schemes that sign the raw body alone (GitHub, Shopify, generic) or URL + body (Square)."""

# Parts implement shared Protocols, so some take arguments they do not use.
# ruff: noqa: ARG002

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.errors import ConfigError, SignatureError
from pipeline.providers import _hmac
from pipeline.providers._headers import HeaderView


@dataclass(frozen=True, slots=True)
class BodyHmacVerifier:
    """One header holding ``prefix + encode(HMAC-SHA256(secret, [url +] body))``. No timestamp.

    ``legacy`` names headers of older schemes the provider may still send (e.g. GitHub's
    SHA-1 ``X-Hub-Signature``); when only those are present the error says the scheme is
    unsupported rather than that the header is missing.
    """

    header: str
    encoding: _hmac.Encoding
    prefix: str = ""
    sign_url: bool = False
    legacy: tuple[tuple[str, str], ...] = ()

    def _message(self, body: bytes, url: str | None, provider: str) -> bytes:
        if not self.sign_url:
            return body
        if not url:
            raise SignatureError(
                f"url required: {provider} signs the notification URL followed by the body,"
                " and no url was given to verify()"
            )
        return _hmac.as_bytes(url) + body

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
        """Raise SignatureError unless the header matches the body under some secret."""
        keys = _hmac.utf8_keys(secrets, provider)
        message = self._message(body, url, provider)
        value = headers.get(self.header)
        if value is None:
            for legacy_header, description in self.legacy:
                if legacy_header in headers:
                    raise SignatureError(
                        f"unsupported signature scheme: only {legacy_header} ({description}) is"
                        f" present; {provider} verification needs header {self.header}"
                    )
            raise SignatureError(f"header {self.header} missing")
        value = value.strip()
        if not value.startswith(self.prefix) or not value[len(self.prefix) :].strip():
            raise SignatureError(
                f"{self.header} is malformed: expected '{self.prefix}<{self.encoding} signature>'"
            )
        candidate = value[len(self.prefix) :].strip()
        if self.encoding == "hex":
            candidate = candidate.lower()
        expected = (_hmac.encode(_hmac.digest(key, message), self.encoding) for key in keys)
        if not _hmac.any_match(expected, [_hmac.as_bytes(candidate)]):
            raise SignatureError(
                f"no signature matched: {self.header} does not match the body"
                f" under any of the {len(keys)} configured secret(s)"
            )

    def sign(
        self, body: bytes, secret: str, *, timestamp: int, msg_id: str, url: str | None
    ) -> dict[str, str]:
        """``{header: prefix + signature}``."""
        if self.sign_url and not url:
            raise ConfigError("url required: this scheme signs the notification URL + body")
        message = self._message(body, url, "this provider")
        signature = _hmac.encode(_hmac.digest(_hmac.as_bytes(secret), message), self.encoding)
        return {self.header: self.prefix + signature.decode("ascii")}

    def secret_problem(self, secret: str) -> str | None:
        """What is wrong with ``secret`` for this scheme (used verbatim), or None."""
        return _hmac.text_secret_problem(secret)


@dataclass(frozen=True, slots=True)
class NoSignatureVerifier:
    """For sources without a configured scheme: verify() always refuses, saying so."""

    reason: str

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
        """Always raises SignatureError(reason)."""
        raise SignatureError(self.reason)

    def sign(
        self, body: bytes, secret: str, *, timestamp: int, msg_id: str, url: str | None
    ) -> dict[str, str]:
        """No signature headers."""
        return {}

    def secret_problem(self, secret: str) -> str | None:
        """Never a problem: there is no scheme to use a secret (see ``Preset.verifies``)."""
        return None
