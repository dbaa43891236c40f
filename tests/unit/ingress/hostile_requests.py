"""The harness of the hostile-request tests: a topology with every provider, raw HTTP exchanges.

Requests are written byte for byte on a socket to the aiohttp test server, so header values can
hold bytes that are not UTF-8 (written here as lone surrogates, ``\\udcff`` = byte 0xff) and the
framing (Content-Length, chunks) can be wrong. Each :class:`Case` names the statuses it may get;
:func:`check_answer` holds what every answer must satisfy.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import time
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import orjson
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from pipeline import topology
from pipeline.ingress.app import build_app
from pipeline.ingress.sink import OutgoingRecord, Produced
from pipeline.providers.signing import sign

NOW = int(time.time())
HOST = "hooks.test"
MAX_BODY = 64 * 1024
SECRETS = {
    "stripe": "whsec_hostile_stripe_secret",
    "github": "gh_hostile_secret",
    "shopify": "shpss_hostile_secret",
    "standard-webhooks": "whsec_" + base64.b64encode(b"k" * 32).decode(),
    "sweego": "whsec_" + base64.b64encode(b"s" * 32).decode(),
    "slack": "slack_hostile_secret",
    "square": "square_hostile_secret",
    "paddle": "pdl_hostile_secret",
    "webhooker": "webhooker_hostile_secret",
}
ENVIRON = {name.upper().replace("-", "_") + "_SECRET": secret for name, secret in SECRETS.items()}
TOPO = topology.parse(
    {
        "topics": {"input": "hostile.raw", "partitions": 3},
        "sources": {
            **{
                name: {"provider": name, "secrets": [name.upper().replace("-", "_") + "_SECRET"]}
                for name in SECRETS
            },
            "github-open": {"provider": "github", "verify": "none"},
            "stripe-open": {"provider": "stripe", "verify": "none"},
            "generic-open": {"provider": "generic", "options": {"key_path": "id"}, "verify": "none"},
        },
    }
)


class Sink:
    """Accepts every record (the broker is not what these tests probe)."""

    def __init__(self) -> None:
        self.records: list[OutgoingRecord] = []

    @property
    def partitions(self) -> int:
        return 3

    async def send(self, record: OutgoingRecord) -> Produced:
        self.records.append(record)
        return Produced(record.partition, len(self.records) - 1)

    async def ready(self) -> bool:
        return True

    async def start(self, *, timeout: float = 30.0) -> None:
        return None

    async def stop(self) -> None:
        return None


@dataclass(frozen=True)
class Case:
    """One request and the status it must get; ``raw`` replaces the whole request when set."""

    name: str
    expected: frozenset[int]
    path: str = "/webhooks/github-open"
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""
    framing: str = "length"  # "length" (correct Content-Length), "chunked", "none" (headers give it)
    method: str = "POST"
    raw: bytes | None = None
    host: str = HOST

    def request(self) -> bytes:
        if self.raw is not None:
            return self.raw
        lines = [f"{self.method} {self.path} HTTP/1.1", f"Host: {self.host}", "Connection: close"]
        lines += [f"{name}: {value}" for name, value in self.headers]
        body = self.body
        if self.framing == "length":
            lines.append(f"Content-Length: {len(body)}")
        elif self.framing == "chunked":
            lines.append("Transfer-Encoding: chunked")
            body = b"".join(
                f"{len(body[i : i + 1000]):x}\r\n".encode() + body[i : i + 1000] + b"\r\n"
                for i in range(0, len(body), 1000)
            )
            body += b"0\r\n\r\n"
        head = "\r\n".join(lines) + "\r\n\r\n"
        return head.encode("utf-8", "surrogateescape") + body


def ok(*statuses: int) -> frozenset[int]:
    return frozenset(statuses)


def signed(provider: str, body: bytes, **kwargs: object) -> tuple[tuple[str, str], ...]:
    headers = sign(provider, body, SECRETS[provider], timestamp=kwargs.pop("timestamp", NOW), **kwargs)  # type: ignore[arg-type]
    return tuple(headers.items())


def replaced(headers: tuple[tuple[str, str], ...], name: str, value: str) -> tuple[tuple[str, str], ...]:
    return tuple((n, value if n.lower() == name.lower() else v) for n, v in headers)


def without(headers: tuple[tuple[str, str], ...], name: str) -> tuple[tuple[str, str], ...]:
    return tuple((n, v) for n, v in headers if n.lower() != name.lower())


EVT = orjson.dumps({"id": "evt_hostile", "object": "event", "type": "invoice.paid"})
SLACK = orjson.dumps({"event_id": "Ev1", "event": {"type": "message"}})
SQUARE = orjson.dumps({"event_id": "sq-1", "type": "payment.updated"})
PADDLE = orjson.dumps({"event_id": "evt_pdl", "event_type": "transaction.paid"})
WEBHOOKER = orjson.dumps({"type": "order.created"})
SWEEGO = orjson.dumps({"event_id": "sw-1", "event_type": "delivered"})
SQUARE_URL = f"http://{HOST}/webhooks/square"
GH = (("X-GitHub-Delivery", "guid-1"),)
STRIPE_SIG = signed("stripe", EVT)
STRIPE_FORGED = tuple(sign("stripe", EVT, "whsec_attacker", timestamp=NOW).items())
NESTED = b'{"id": "deep", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}"
BOMB = gzip.compress(b'{"id": "bomb", "pad": "' + b"0" * (4 * MAX_BODY) + b'"}')


def deflate(data: bytes) -> bytes:
    return zlib.compress(data)


async def exchange(port: int, case: Case) -> tuple[int, bytes, bytes]:
    """Send ``case`` on a fresh connection; the status, the raw head and the body of the answer."""
    data = case.request()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        length = next(
            (
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ),
            None,
        )
        read = reader.read() if length is None else reader.readexactly(length)
        body = await asyncio.wait_for(read, 10)
    finally:
        writer.close()
    return int(head.split(b" ", 2)[1]), head, body


@asynccontextmanager
async def serve() -> AsyncIterator[tuple[int, Sink]]:
    """The ingress app on a test server: its port and its sink."""
    sink = Sink()
    app = build_app(TOPO, sink, max_body_bytes=MAX_BODY, environ=ENVIRON, clock=lambda: float(NOW))
    client: TestClient[web.Request, web.Application] = TestClient(TestServer(app))
    await client.start_server()
    try:
        assert client.port is not None
        yield client.port, sink
    finally:
        await client.close()


async def check_answer(port: int, sink: Sink, case: Case) -> None:
    """``case`` gets one of its statuses, never 5xx; a refusal says why and produces nothing."""
    status, head, body = await exchange(port, case)
    assert status < 500, body
    assert status in case.expected, (status, body[:300])
    if b"application/json" in head.lower():
        answer = orjson.loads(body)
        if status < 300:
            assert answer["key"]
        else:
            assert answer["reason"]
            assert answer["error"]
    else:  # aiohttp's own answer to a request it cannot parse or route: text saying why
        assert status >= 400
        assert body.strip()
    if status >= 300:
        assert sink.records == []
    else:
        assert len(sink.records) == 1
