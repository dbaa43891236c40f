"""Shared signature helpers: HMAC-SHA256, constant-time matching, timestamp windows.

Every comparison goes through :func:`hmac.compare_digest` on bytes. Messages never contain
a secret or a computed signature, only header names, counts and time differences.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import re
from collections.abc import Iterable, Sequence
from typing import Literal

from pipeline.errors import ConfigError, SignatureError

Encoding = Literal["hex", "base64"]

# Standard base64 with optional padding; the length is checked separately.
_BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")
# A unix timestamp in seconds: ASCII digits only (no sign, no fraction, no spaces).
_MAX_TIMESTAMP_DIGITS = 12


def digest(key: bytes, message: bytes) -> bytes:
    """HMAC-SHA256 of ``message`` keyed by ``key`` (the standard library's one-shot C path)."""
    return hmac.digest(key, message, "sha256")


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

    Unpadded base64 is accepted, as in the reference library; anything else that is not
    standard base64 is refused (see :func:`base64_secret`). A secret that does not decode
    is a configuration problem, reported by position only.
    """
    keys = []
    for position, secret in enumerate(checked_secrets(secrets, provider), start=1):
        try:
            keys.append(base64_secret(secret))
        except ValueError as exc:
            raise ConfigError(f"{provider} secret #{position} {exc}") from None
    return keys


def base64_secret(secret: str) -> bytes:
    """The HMAC key a Standard Webhooks secret names: ``whsec_`` stripped, the rest decoded.

    Strict: only the standard alphabet (``A-Z a-z 0-9 + /``) with optional ``=`` padding.
    The reference libraries silently drop other characters, so a secret with ``-``, ``_``
    or spaces would sign with a different key than the one configured. Raises
    ``ValueError`` saying what is wrong, never showing the secret.
    """
    text = secret.removeprefix("whsec_")
    if not text:
        raise ValueError("is empty after its 'whsec_' prefix (expected 'whsec_<base64>')")
    if text != text.strip() or secret != secret.strip():
        raise ValueError("has leading or trailing whitespace (a pasted newline?)")
    if "-" in text or "_" in text:
        raise ValueError(
            "is not standard base64: it has '-' or '_' (URL-safe base64 or another"
            " scheme's secret); expected 'whsec_' followed by base64 of A-Z, a-z, 0-9, '+', '/'"
        )
    if not _BASE64.fullmatch(text):
        raise ValueError("is not base64 (expected 'whsec_' followed by A-Z, a-z, 0-9, '+', '/', '=')")
    body = text.rstrip("=")
    if len(body) % 4 == 1:
        raise ValueError("is not base64: its length is not a whole number of bytes (cut short?)")
    try:
        key = base64.b64decode(body + "=" * (-len(body) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("is not base64 (expected 'whsec_<base64>')") from None
    if not key:
        raise ValueError("decodes to an empty key")
    return key


def text_secret_problem(secret: str) -> str | None:
    """What is wrong with a secret used verbatim as an HMAC key, or None.

    Such a secret is any text, but one with surrounding whitespace is almost always a
    pasted newline, and would fail every signature.
    """
    if secret != secret.strip():
        return "has leading or trailing whitespace (a pasted newline?)"
    return None


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
