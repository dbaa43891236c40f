"""The ``generic`` preset: any sender, configured by options (see :func:`generic`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from pipeline.errors import ConfigError
from pipeline.providers._verify_body import BodyHmacVerifier, NoSignatureVerifier
from pipeline.providers.base import (
    BodyKey,
    BodyType,
    FieldsHashKey,
    FirstType,
    HeaderKey,
    HeaderType,
    KeySource,
    NoType,
    Preset,
    TypeSource,
    Verifier,
    default_ttl_for,
)


def _optional_str(name: str, value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"option {name!r} must be a non-empty string, got {value!r}")
    return value


def _retry_window(value: object) -> timedelta:
    if isinstance(value, timedelta):
        if value <= timedelta(0):
            raise ConfigError("option 'retry_window' must be positive")
        return value
    from pipeline.durations import parse_duration  # noqa: PLC0415  (only generic needs it)

    try:
        return parse_duration(value)
    except ValueError as exc:
        raise ConfigError(f"option 'retry_window': {exc}") from None


def generic(
    *,
    key_header: str | None = None,
    key_path: str | None = None,
    key_fields: Sequence[str] | None = None,
    signature_header: str | None = None,
    signature_prefix: str = "",
    encoding: str = "hex",
    type_header: str | None = None,
    type_path: str | None = None,
    retry_window: object = "3d",
) -> Preset:
    """Any sender, configured by options.

    Key: ``key_header`` if set, else the body field ``key_path``, else sha256 (hex) of the
    canonical JSON of the body fields ``key_fields``. One of them is required: hashing the
    whole body would treat a redelivery whose body differs by a receipt time or attempt count
    as a new event, and nothing else is safe to guess. Verify: hex or base64 HMAC-SHA256 of
    the body in ``signature_header`` after ``signature_prefix``; without ``signature_header``
    verify() refuses, and callers decide whether to verify at all. ``retry_window`` (a
    duration such as ``"3d"``) defaults to 3 days.
    """
    key_header = _optional_str("key_header", key_header)
    key_path = _optional_str("key_path", key_path)
    signature_header = _optional_str("signature_header", signature_header)
    type_header = _optional_str("type_header", type_header)
    type_path = _optional_str("type_path", type_path)
    if not isinstance(signature_prefix, str):
        raise ConfigError(f"option 'signature_prefix' must be a string, got {signature_prefix!r}")
    if encoding not in ("hex", "base64"):
        raise ConfigError(f"option 'encoding' must be 'hex' or 'base64', got {encoding!r}")
    key: KeySource
    if key_header is not None:
        key = HeaderKey((key_header,))
    elif key_path is not None:
        key = BodyKey(key_path)
    elif key_fields is not None:
        if isinstance(key_fields, str) or not key_fields:
            raise ConfigError("option 'key_fields' must be a non-empty list of body field paths")
        fields = tuple(key_fields)
        if not all(isinstance(field, str) and field for field in fields):
            raise ConfigError("option 'key_fields' must be a non-empty list of body field paths")
        key = FieldsHashKey(fields)
    else:
        raise ConfigError(
            "generic provider needs one of key_header, key_path or key_fields"
            " (the whole body is never hashed: it may differ between deliveries of one event)"
        )
    verifier: Verifier
    if signature_header is None:
        verifier = NoSignatureVerifier("generic source has no signature scheme configured")
    else:
        verifier = BodyHmacVerifier(
            header=signature_header,
            encoding="hex" if encoding == "hex" else "base64",
            prefix=signature_prefix,
        )
    types: list[TypeSource] = []
    if type_header is not None:
        types.append(HeaderType(type_header))
    if type_path is not None:
        types.append(BodyType(type_path))
    type_source: TypeSource = FirstType(tuple(types)) if types else NoType()
    window = _retry_window(retry_window)
    return Preset(
        name="generic",
        retry_window=window,
        default_ttl=default_ttl_for(window),
        key=key,
        verifier=verifier,
        type_source=type_source,
    )
