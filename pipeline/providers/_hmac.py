"""Shared signature helpers: HMAC-SHA256, constant-time matching, timestamp windows.

Every comparison goes through :func:`hmac.compare_digest` on bytes. Messages never contain
a secret or a computed signature, only header names, counts and time differences.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Iterable, Sequence
from typing import Literal

from pipeline.errors import ConfigError, SignatureError

Encoding = Literal["hex", "base64"]

# A unix timestamp in seconds: ASCII digits only (no sign, no fraction, no spaces).
_MAX_TIMESTAMP_DIGITS = 12


def digest(key: bytes, message: bytes) -> bytes:
    """HMAC-SHA256 of ``message`` keyed by ``key``."""
    return hmac.new(key, message, hashlib.sha256).digest()


def encode(raw: bytes, encoding: Encoding) -> bytes:
    """``raw`` as lowercase hex or standard padded base64, as ASCII bytes."""
    if encoding == "hex":
        return raw.hex().encode("ascii")
    return base64.b64encode(raw)


def as_bytes(text: str) -> bytes:
    """A header value as bytes for comparison (never raises on odd characters)."""
    return text.encode("utf-8", "surrogateescape")


def any_match(expected: Iterable[bytes], candidates: Sequence[bytes]) -> bool:
    """Whether any expected signature equals any candidate, comparing every pair in constant time.

    All pairs are compared (no early exit), so the time taken does not tell which secret or
    which candidate matched.
    """
    matched = False
    for mine in expected:
        for theirs in candidates:
            matched |= hmac.compare_digest(mine, theirs)
    return matched


def utf8_keys(secrets: Sequence[str], provider: str) -> list[bytes]:
    """Secrets used verbatim (UTF-8) as HMAC keys; raises SignatureError when none is configured."""
    return [as_bytes(secret) for secret in checked_secrets(secrets, provider)]


def base64_keys(secrets: Sequence[str], provider: str) -> list[bytes]:
    """Standard Webhooks secrets: ``whsec_`` stripped if present, the rest base64-decoded.

    Unpadded base64 is accepted, as in the reference library. A secret that does not
    decode is a configuration problem, reported by position only.
    """
    keys = []
    for position, secret in enumerate(checked_secrets(secrets, provider), start=1):
        text = secret.removeprefix("whsec_")
        try:
            key = base64.b64decode(text + "==")
        except (binascii.Error, ValueError):
            raise ConfigError(
                f"{provider} secret #{position} is not base64 (expected 'whsec_<base64>')"
            ) from None
        if not key:
            raise ConfigError(f"{provider} secret #{position} decodes to an empty key")
        keys.append(key)
    return keys


def checked_secrets(secrets: Sequence[str], provider: str) -> list[str]:
    """The non-empty secrets; SignatureError when there are none."""
    if isinstance(secrets, str):
        raise ConfigError(f"{provider} secrets must be a list of strings, not a single string")
    usable = [secret for secret in secrets if secret]
    if not usable:
        raise SignatureError(f"no secrets configured for {provider}: cannot verify signatures")
    return usable


def parse_timestamp(raw: str, header: str) -> int:
    """A unix-seconds timestamp from header ``header``; SignatureError 'malformed' otherwise."""
    text = raw.strip()
    if not (text.isascii() and text.isdigit() and len(text) <= _MAX_TIMESTAMP_DIGITS):
        raise SignatureError(f"{header} is malformed: timestamp is not a unix time in seconds")
    return int(text)


def check_window(timestamp: int, now: float, tolerance: int, header: str) -> None:
    """Reject a timestamp more than ``tolerance`` seconds before or after ``now``."""
    skew = now - timestamp
    if skew > tolerance:
        raise SignatureError(
            f"{header} timestamp is stale: {skew:.0f} s older than now, outside the ±{tolerance} s window"
        )
    if -skew > tolerance:
        raise SignatureError(
            f"{header} timestamp is in the future by {-skew:.0f} s, outside the ±{tolerance} s window"
        )
