"""Standard Webhooks (https://www.standardwebhooks.com/, Svix) and its Sweego variant.

Headers ``webhook-id``, ``webhook-timestamp``, ``webhook-signature`` (Svix also sends
``svix-*``). The signature header is a space-separated list of ``<version>,<base64>``
entries; ``v1`` is HMAC-SHA256 over ``f"{id}.{timestamp}.{body}"`` keyed by the secret's
base64-decoded bytes (``whsec_`` prefix stripped). ``v1a`` is ed25519 (asymmetric) and is
not supported here.
"""

# Parts implement shared Protocols, so some take arguments they do not use.
# ruff: noqa: ARG002

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.errors import SignatureError
from pipeline.providers import _hmac
from pipeline.providers._headers import HeaderView


@dataclass(frozen=True, slots=True)
class StandardWebhooksVerifier:
    """Verifies Standard Webhooks signatures; ``bare_signatures`` also accepts unversioned entries.

    Sweego sends ``webhook-signature: <base64>`` without the ``v1,`` prefix (see
    https://learn.sweego.io/docs/webhooks/webhook_signature); with ``bare_signatures`` such an
    entry is read as ``v1`` and :meth:`sign` emits it that way.
    """

    id_headers: tuple[str, ...] = ("webhook-id", "svix-id")
    timestamp_headers: tuple[str, ...] = ("webhook-timestamp", "svix-timestamp")
    signature_headers: tuple[str, ...] = ("webhook-signature", "svix-signature")
    tolerance: int = 300
    bare_signatures: bool = False

    @staticmethod
    def _required(headers: HeaderView, names: tuple[str, ...]) -> tuple[str, str]:
        found = headers.first(names)
        if found is None or not found[1].strip():
            also = f" (or {', '.join(names[1:])})" if len(names) > 1 else ""
            raise SignatureError(f"header {names[0]}{also} missing")
        return found

    def _candidates(self, header: str, value: str, provider: str) -> list[bytes]:
        v1: list[bytes] = []
        others: list[str] = []
        for position, entry in enumerate(value.split(), start=1):
            version, comma, signature = entry.partition(",")
            if not comma:
                if not self.bare_signatures:
                    raise SignatureError(
                        f"{header} is malformed: entry {position} is not '<version>,<base64>'"
                    )
                version, signature = "v1", entry
            if not version or not signature:
                raise SignatureError(f"{header} is malformed: entry {position} is not '<version>,<base64>'")
            if version == "v1":
                v1.append(_hmac.as_bytes(signature))
            elif version not in others:
                others.append(version)
        if v1:
            return v1
        if not others:
            raise SignatureError(f"{header} is malformed: no signature entries")
        detail = " (v1a is asymmetric ed25519)" if "v1a" in others else ""
        raise SignatureError(
            f"unsupported signature scheme: {header} carries only {', '.join(others)}"
            f" signature(s){detail}; {provider} verification supports v1 (HMAC-SHA256) only"
        )

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
        """Raise SignatureError unless some secret signed ``id.timestamp.body`` recently."""
        keys = _hmac.base64_keys(secrets, provider)
        _, msg_id = self._required(headers, self.id_headers)
        timestamp_header, timestamp_text = self._required(headers, self.timestamp_headers)
        signature_header, signature_value = self._required(headers, self.signature_headers)
        timestamp = _hmac.parse_timestamp(timestamp_text, timestamp_header)
        candidates = self._candidates(signature_header, signature_value, provider)
        message = _hmac.as_bytes(f"{msg_id}.{timestamp_text.strip()}.") + body
        expected = (_hmac.encode(_hmac.digest(key, message), "base64") for key in keys)
        if not _hmac.any_match(expected, candidates):
            raise SignatureError(
                f"no signature matched: none of the {len(candidates)} v1 signature(s) in"
                f" {signature_header} matches under any of the {len(keys)} configured secret(s)"
            )
        _hmac.check_window(timestamp, now, self.tolerance, timestamp_header)

    def sign(
        self, body: bytes, secret: str, *, timestamp: int, msg_id: str, url: str | None
    ) -> dict[str, str]:
        """The three ``webhook-*`` headers."""
        (key,) = _hmac.base64_keys([secret], "signing")
        message = _hmac.as_bytes(f"{msg_id}.{timestamp}.") + body
        signature = _hmac.encode(_hmac.digest(key, message), "base64").decode("ascii")
        return {
            self.id_headers[0]: msg_id,
            self.timestamp_headers[0]: str(timestamp),
            self.signature_headers[0]: signature if self.bare_signatures else f"v1,{signature}",
        }

    def secret_problem(self, secret: str) -> str | None:
        """What is wrong with ``secret`` (``whsec_`` + standard base64), or None."""
        try:
            _hmac.base64_secret(secret)
        except ValueError as exc:
            return str(exc)
        return None
