"""Hostile framing, codings, bodies and paths at the ingress: 4xx with a reason, never 5xx."""

from __future__ import annotations

import gzip
from collections.abc import AsyncIterator

import pytest

from tests.unit.ingress import test_hostile_headers as headers
from tests.unit.ingress.hostile_requests import (
    BOMB,
    GH,
    MAX_BODY,
    NESTED,
    TOPO,
    Case,
    Sink,
    check_answer,
    ok,
    serve,
    signed,
)


@pytest.fixture
async def served() -> AsyncIterator[tuple[int, Sink]]:
    async with serve() as port_and_sink:
        yield port_and_sink


FRAMING = [
    Case(
        "content-length not a number",
        ok(400),
        raw=b"POST /webhooks/github-open HTTP/1.1\r\nHost: h\r\nX-GitHub-Delivery: g\r\nContent-Length: abc\r\n\r\n{}",
    ),
    Case(
        "content-length negative",
        ok(400),
        raw=b"POST /webhooks/github-open HTTP/1.1\r\nHost: h\r\nContent-Length: -1\r\n\r\n{}",
    ),
    Case(
        "content-length list",
        ok(400),
        raw=b"POST /webhooks/github-open HTTP/1.1\r\nHost: h\r\nContent-Length: 2, 3\r\n\r\n{}",
    ),
    Case(
        "content-length twice, different",
        ok(400),
        raw=b"POST /webhooks/github-open HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    ),
    Case(
        "content-length and chunked",
        ok(400),
        raw=b"POST /webhooks/github-open HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    ),
    Case(
        "content-length 20 digits",
        ok(400, 413),
        raw=b"POST /webhooks/github-open HTTP/1.1\r\nHost: h\r\nContent-Length: 99999999999999999999\r\n\r\n{}",
    ),
    Case(
        "content-length over the limit, body not sent",
        ok(413),
        headers=(*GH, ("Content-Length", str(MAX_BODY + 1))),
        framing="none",
    ),
    Case(
        "1000 extra headers",
        ok(400, 431),
        headers=GH + tuple((f"X-Pad-{i}", "v") for i in range(1000)),
        body=b"{}",
    ),
    Case(
        "bad chunk size",
        ok(400),
        raw=b"POST /webhooks/github-open HTTP/1.1\r\nHost: h\r\nX-GitHub-Delivery: g\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    ),
    Case(
        "unknown transfer coding",
        ok(400),
        raw=b"POST /webhooks/github-open HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n\r\n{}",
    ),
    Case(
        "chunked body over the limit",
        ok(413),
        headers=GH,
        body=b'{"p": "' + b"x" * (2 * MAX_BODY) + b'"}',
        framing="chunked",
    ),
    Case(
        "declared body over the limit", ok(413), headers=GH, body=b'{"p": "' + b"x" * (2 * MAX_BODY) + b'"}'
    ),
    Case(
        "header name not ascii",
        ok(400),
        raw=b"POST /webhooks/github-open HTTP/1.1\r\nHost: h\r\nX-\xff: 1\r\nContent-Length: 2\r\n\r\n{}",
    ),
    Case(
        "header value with NUL",
        ok(400),
        raw=b"POST /webhooks/github-open HTTP/1.1\r\nHost: h\r\nX-GitHub-Delivery: a\x00b\r\nContent-Length: 2\r\n\r\n{}",
    ),
    Case(
        "obsolete line folding",
        ok(400),
        raw=b"POST /webhooks/github-open HTTP/1.1\r\nHost: h\r\nX-GitHub-Delivery: a\r\n b\r\nContent-Length: 2\r\n\r\n{}",
    ),
]

ENCODINGS = [
    Case("gzip over plain JSON", ok(400), headers=(*GH, ("Content-Encoding", "gzip")), body=b'{"a": 1}'),
    Case(
        "gzip truncated",
        ok(400),
        headers=(*GH, ("Content-Encoding", "gzip")),
        body=gzip.compress(b'{"a": 1}' * 50)[:30],
    ),
    Case(
        "deflate over plain JSON", ok(400), headers=(*GH, ("Content-Encoding", "deflate")), body=b'{"a": 1}'
    ),
    Case("br over plain JSON", ok(400), headers=(*GH, ("Content-Encoding", "br")), body=b'{"a": 1}'),
    Case("zstd over plain JSON", ok(400), headers=(*GH, ("Content-Encoding", "zstd")), body=b'{"a": 1}'),
    Case("compress coding", ok(415), headers=(*GH, ("Content-Encoding", "compress")), body=b"{}"),
    Case("x-gzip coding", ok(415), headers=(*GH, ("Content-Encoding", "x-gzip")), body=gzip.compress(b"{}")),
    Case("unknown coding", ok(415), headers=(*GH, ("Content-Encoding", "snappy")), body=b"{}"),
    Case("coding not utf-8", ok(415), headers=(*GH, ("Content-Encoding", "gz\udcffip")), body=b"{}"),
    Case(
        "two codings in one header",
        ok(415),
        headers=(*GH, ("Content-Encoding", "gzip, gzip")),
        body=gzip.compress(gzip.compress(b"{}")),
    ),
    Case(
        "two Content-Encoding headers",
        ok(415),
        headers=(*GH, ("Content-Encoding", "gzip"), ("Content-Encoding", "gzip")),
        body=gzip.compress(gzip.compress(b"{}")),
    ),
    Case(
        "gzip bomb over the limit once decoded",
        ok(413),
        headers=(*GH, ("Content-Encoding", "gzip")),
        body=BOMB,
    ),
    Case(
        "gzip of a non-JSON body",
        ok(400),
        headers=(*GH, ("Content-Encoding", "gzip")),
        body=gzip.compress(b"hello"),
    ),
    Case("empty gzip body", ok(400), headers=(*GH, ("Content-Encoding", "gzip")), body=b""),
]

BODIES = [
    Case("empty body, body-borne key", ok(400), "/webhooks/stripe-open"),
    Case("empty body, header-borne key", ok(400), headers=GH),
    Case("not JSON", ok(400), headers=GH, body=b"hello"),
    Case(
        "form-encoded",
        ok(400),
        headers=(*GH, ("Content-Type", "application/x-www-form-urlencoded")),
        body=b"payload=%7B%7D",
    ),
    Case("JSON array", ok(400), headers=GH, body=b"[1, 2]"),
    Case("JSON string", ok(400), headers=GH, body=b'"evt"'),
    Case("JSON null", ok(400), headers=GH, body=b"null"),
    Case("JSON number", ok(400), "/webhooks/stripe-open", body=b"1"),
    Case("deeply nested JSON", ok(400), "/webhooks/stripe-open", body=NESTED),
    Case("deeply nested array", ok(400), headers=GH, body=b"[" * 60_000),
    Case("body not utf-8", ok(400), "/webhooks/stripe-open", body=b'{"id": "\xff"}'),
    Case("body with escaped lone surrogate", ok(400), "/webhooks/stripe-open", body=b'{"id": "\\udcff"}'),
    Case("body with NaN", ok(400), "/webhooks/stripe-open", body=b'{"id": "e", "x": NaN}'),
    Case("body with BOM", ok(400), "/webhooks/stripe-open", body=b'\xef\xbb\xbf{"id": "e"}'),
    Case("id true", ok(400), "/webhooks/generic-open", body=b'{"id": true}'),
    Case("id object", ok(400), "/webhooks/generic-open", body=b'{"id": {"a": 1}}'),
    Case("id empty", ok(400), "/webhooks/generic-open", body=b'{"id": ""}'),
    Case("id blank", ok(400), "/webhooks/generic-open", body=b'{"id": "  "}'),
    Case("id integer out of range", ok(400), "/webhooks/generic-open", body=b'{"id": ' + b"9" * 40 + b"}"),
    Case("signed body that is not JSON", ok(400), "/webhooks/stripe", signed("stripe", b"x"), b"x"),
    Case("signed JSON array", ok(400), "/webhooks/stripe", signed("stripe", b"[]"), b"[]"),
    Case("signed deeply nested JSON", ok(400), "/webhooks/stripe", signed("stripe", NESTED), NESTED),
]

SOURCES = [
    Case("unknown source", ok(404), "/webhooks/gitlab", body=b"{}"),
    Case("source in upper case", ok(404), "/webhooks/STRIPE", body=b"{}"),
    Case("source %00", ok(404), "/webhooks/%00", body=b"{}"),
    Case("source %FF", ok(404), "/webhooks/%FF", body=b"{}"),
    Case("source %C3%A9", ok(404), "/webhooks/%C3%A9", body=b"{}"),
    Case("source with encoded slash", ok(404), "/webhooks/a%2Fb", body=b"{}"),
    Case("source traversal", ok(404), "/webhooks/..%2F..%2Fetc%2Fpasswd", body=b"{}"),
    Case("source with markup", ok(404), "/webhooks/%3Cscript%3E", body=b"{}"),
    Case("source with trailing NUL", ok(404), "/webhooks/stripe%00", body=b"{}"),
    Case("source of 4000 characters", ok(404), "/webhooks/" + "s" * 4000, body=b"{}"),
    Case("source with a control character", ok(404), "/webhooks/%1B%5B31m", body=b"{}"),
    Case("source path with extra segment", ok(404), "/webhooks/stripe/extra", body=b"{}"),
    Case("empty source", ok(404), "/webhooks/", body=b"{}"),
    Case(
        "raw 0xff in the path",
        ok(400),
        raw=b"POST /webhooks/\xff HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n{}",
    ),
    Case("GET on the webhook path", ok(405), "/webhooks/stripe", method="GET", framing="none"),
]


CASES = [*FRAMING, *ENCODINGS, *BODIES, *SOURCES]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
async def test_a_hostile_body_or_path_gets_its_4xx_with_a_reason_never_5xx(
    served: tuple[int, Sink], case: Case
) -> None:
    """The request gets the status its case names (4xx with a reason), never 5xx."""
    await check_answer(*served, case)


def test_the_hostile_lists_cover_every_provider_and_every_status() -> None:
    """Both case lists together reach every configured source and expect each status the ingress gives."""
    cases = [*CASES, *headers.CASES]
    paths = {case.path for case in cases if case.raw is None}
    assert {f"/webhooks/{name}" for name in TOPO.sources} <= paths
    expected = set().union(*(case.expected for case in cases))
    assert {202, 400, 401, 404, 405, 413, 415} <= expected
