"""Reading a webhook request defensively: its body, its content coding and its event id.

Every way a request can be malformed maps to a :class:`~pipeline.errors.PipelineError` with a
stable ``reason`` and an HTTP status (:data:`STATUS`), so the ingress answers 4xx with that
reason, never 5xx:

- a body over the limit, declared or streamed (also after decompression): 413 ``too-large``;
- a ``Content-Encoding`` aiohttp does not decode (``compress``, ``x-gzip``, ``gzip, gzip``,
  several ``Content-Encoding`` lines…): 415 ``unsupported-encoding``, since the stored body
  would otherwise be the still-encoded bytes;
- a body that does not decode as its declared coding (``gzip`` over plain JSON): 400
  ``bad-encoding``;
- a body cut short or badly chunked: 400 ``bad-body``;
- an event id that is not valid UTF-8 (a raw ``\\xff`` in ``X-GitHub-Delivery``): 400
  ``bad-header``, since a record key is text.
"""

from __future__ import annotations

from aiohttp import hdrs, web
from aiohttp.http_exceptions import ContentEncodingError

from pipeline.errors import BodyError, InvalidHeaderError

#: The codings aiohttp decodes before the handler reads the body (``br`` and ``zstd`` only with
#: their optional libraries; without them aiohttp itself answers 400 before the handler runs).
DECODED_CODINGS = frozenset({"gzip", "deflate", "br", "zstd"})
#: Codings that leave the body as sent.
IDENTITY_CODINGS = frozenset({"", "identity"})


class BodyTooLargeError(BodyError):
    """The request body is larger than the ingress accepts."""

    reason = "too-large"


class UnsupportedEncodingError(BodyError):
    """The request's ``Content-Encoding`` is one the ingress does not decode."""

    reason = "unsupported-encoding"


class BadEncodingError(BodyError):
    """The request body does not decode as its ``Content-Encoding`` says."""

    reason = "bad-encoding"


#: The HTTP status of each refusal raised here (any other BodyError is 400).
STATUS: dict[type[BodyError], int] = {
    BodyTooLargeError: 413,
    UnsupportedEncodingError: 415,
    BadEncodingError: 400,
}


def check_content_encoding(request: web.Request) -> None:
    """Refuse a content coding that would leave the body undecoded (415)."""
    values = request.headers.getall(hdrs.CONTENT_ENCODING, ())
    if not values:
        return
    if len(values) > 1:
        raise UnsupportedEncodingError(
            f"{len(values)} Content-Encoding headers: send one coding (gzip, deflate) or none"
        )
    coding = values[0].strip()
    if not coding.isascii() or coding.lower() not in DECODED_CODINGS | IDENTITY_CODINGS:
        raise UnsupportedEncodingError(
            "Content-Encoding is not one of identity, gzip, deflate (a single coding)"
        )


async def read_body(request: web.Request, max_body_bytes: int) -> bytes:
    """The decoded body, bounded by ``max_body_bytes``; a refusal from this module otherwise."""
    declared = request.content_length
    if declared is not None and declared > max_body_bytes:
        raise BodyTooLargeError(f"body of {declared} bytes is over the {max_body_bytes}-byte limit")
    try:
        return await request.read()  # bounded by the app's client_max_size, after decoding
    except web.HTTPRequestEntityTooLarge:
        raise BodyTooLargeError(f"body is over the {max_body_bytes}-byte limit") from None
    except web.RequestPayloadError as exc:
        if isinstance(exc.__cause__, ContentEncodingError):
            coding = request.headers.get(hdrs.CONTENT_ENCODING, "").strip().lower()
            raise BadEncodingError(f"the body is not valid {coding} data") from None
        raise BodyError("the body is incomplete or its chunked framing is malformed") from None


def check_event_id(event_id: str) -> str:
    """``event_id`` when it can be a record key (UTF-8 text); InvalidHeaderError otherwise.

    aiohttp decodes header bytes that are not UTF-8 as lone surrogates; such an id cannot be
    encoded as a key (and is not what any provider sends).
    """
    try:
        event_id.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidHeaderError("the event id is not valid UTF-8") from None
    return event_id
