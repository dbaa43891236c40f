"""The HTTP ingress without a broker: the produce step is a fake sink that crosses nothing."""

from __future__ import annotations

import asyncio
import gzip
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from pipeline import topology
from pipeline.errors import BrokerUnavailableError, ConfigError
from pipeline.ingress.server import Ingress, IngressSettings, build_app
from pipeline.ingress.sink import OutgoingRecord, Produced
from pipeline.kafka.partitioner import owner_partition
from pipeline.providers.signing import sign

PARTS = 4
STRIPE_SECRET = "whsec_unit_test_secret_0123456789"
SQUARE_SECRET = "sq_unit_test_secret_abcdef"
ENVIRON = {"STRIPE_SECRET": STRIPE_SECRET, "SQUARE_SECRET": SQUARE_SECRET, "SVIX_SECRET": "whsec_AAAA"}
TOPO = topology.parse(
    {
        "topics": {"input": "unit.raw", "partitions": PARTS},
        "sources": {
            "stripe": {"provider": "stripe", "secrets": ["STRIPE_SECRET"]},
            "plain": {"provider": "stripe", "verify": "none"},
            "github": {"provider": "github", "verify": "none"},
            "later": {"provider": "stripe", "secrets": ["STRIPE_SECRET"], "verify": "worker"},
            "nosecret": {"provider": "stripe", "secrets": ["NOT_SET_ANYWHERE"]},
            "square": {"provider": "square", "secrets": ["SQUARE_SECRET"]},
        },
    }
)


def stripe_body(event_id: str = "evt_1", *, size: int = 0) -> bytes:
    return orjson.dumps({"id": event_id, "object": "event", "type": "invoice.paid", "pad": "x" * size})


class FakeSink:
    """Records what would be produced; optionally fails or hangs."""

    def __init__(self) -> None:
        self.records: list[OutgoingRecord] = []
        self.is_ready = True
        self.fail: BaseException | None = None
        self.hold: asyncio.Event | None = None
        self.started = False
        self.stopped = False

    @property
    def partitions(self) -> int:
        return PARTS

    async def send(self, record: OutgoingRecord) -> Produced:
        if self.hold is not None:
            await self.hold.wait()
        if self.fail is not None:
            raise self.fail
        self.records.append(record)
        return Produced(record.partition, len(self.records) - 1)

    async def ready(self) -> bool:
        return self.is_ready

    async def start(self, *, timeout: float = 30.0) -> None:
        self.started = True

    async def stop(self) -> None:
        self.stopped = True


MakeClient = Callable[..., Awaitable[TestClient[web.Request, web.Application]]]


@pytest.fixture
def sink() -> FakeSink:
    return FakeSink()


@pytest.fixture
async def make_client(sink: FakeSink) -> AsyncIterator[MakeClient]:
    clients: list[TestClient[web.Request, web.Application]] = []

    async def make(**options: object) -> TestClient[web.Request, web.Application]:
        options.setdefault("environ", ENVIRON)
        client = TestClient(TestServer(build_app(TOPO, sink, **options)))  # type: ignore[arg-type]
        await client.start_server()
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()


async def test_a_signed_stripe_webhook_is_produced_per_the_contract(
    make_client: MakeClient, sink: FakeSink
) -> None:
    """A valid Stripe delivery answers 202 with key/partition/offset and produces key, raw body and headers."""
    client = await make_client(clock=lambda: 1_700_000_000.123)
    body = stripe_body("evt_abc")
    headers = sign("stripe", body, STRIPE_SECRET, timestamp=1_700_000_000)
    response = await client.post("/webhooks/stripe", data=body, headers=headers)
    assert response.status == 202
    answer = await response.json()
    expected_partition = owner_partition(b"stripe:evt_abc", PARTS)
    assert answer == {"key": "stripe:evt_abc", "partition": expected_partition, "offset": 0}
    (record,) = sink.records
    assert record.key == b"stripe:evt_abc"
    assert record.value == body
    assert record.partition == expected_partition
    assert record.timestamp_ms == 1_700_000_000_123
    produced = dict(record.headers)
    assert produced["source"] == b"stripe"
    assert produced["received-at"] == b"1700000000123"
    assert produced["http-stripe-signature"] == headers["Stripe-Signature"].encode()


async def test_unknown_source_is_404_with_a_json_reason(make_client: MakeClient, sink: FakeSink) -> None:
    """A source the topology does not have answers 404 reason unknown-source and produces nothing."""
    client = await make_client()
    response = await client.post("/webhooks/gitlab", data=b"{}")
    assert response.status == 404
    assert (await response.json())["reason"] == "unknown-source"
    assert sink.records == []


async def test_an_oversized_body_is_413_by_content_length(make_client: MakeClient, sink: FakeSink) -> None:
    """A declared Content-Length over the limit answers 413 too-large without producing."""
    client = await make_client(max_body_bytes=1000)
    response = await client.post("/webhooks/plain", data=stripe_body(size=2000))
    assert response.status == 413
    assert (await response.json())["reason"] == "too-large"
    assert sink.records == []


async def test_an_oversized_chunked_body_is_413(make_client: MakeClient, sink: FakeSink) -> None:
    """A chunked body (no Content-Length) over the limit is cut off with 413 too-large."""
    client = await make_client(max_body_bytes=1000)

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(10):
            yield b"x" * 500

    response = await client.post("/webhooks/plain", data=chunks())
    assert response.status == 413
    assert (await response.json())["reason"] == "too-large"
    assert sink.records == []


async def test_a_forged_signature_is_401_with_the_reason(make_client: MakeClient, sink: FakeSink) -> None:
    """A body signed with another secret answers 401 bad-signature saying which check failed."""
    client = await make_client()
    body = stripe_body("evt_forged")
    headers = sign("stripe", body, "whsec_attacker", timestamp=time.time())
    response = await client.post("/webhooks/stripe", data=body, headers=headers)
    assert response.status == 401
    answer = await response.json()
    assert answer["reason"] == "bad-signature"
    assert "no signature matched" in answer["error"]
    assert sink.records == []


async def test_a_stale_timestamp_is_401(make_client: MakeClient, sink: FakeSink) -> None:
    """A correctly signed delivery whose timestamp is an hour old is refused 401."""
    client = await make_client()
    body = stripe_body("evt_old")
    headers = sign("stripe", body, STRIPE_SECRET, timestamp=time.time() - 3600)
    response = await client.post("/webhooks/stripe", data=body, headers=headers)
    assert response.status == 401
    assert (await response.json())["reason"] == "bad-signature"
    assert sink.records == []


async def test_a_missing_key_is_400(make_client: MakeClient, sink: FakeSink) -> None:
    """A GitHub delivery without X-GitHub-Delivery answers 400 missing-key."""
    client = await make_client()
    response = await client.post("/webhooks/github", data=b"{}", headers={"X-GitHub-Event": "push"})
    assert response.status == 400
    answer = await response.json()
    assert answer["reason"] == "missing-key"
    assert "X-GitHub-Delivery" in answer["error"]
    assert sink.records == []


async def test_an_unparseable_body_is_400(make_client: MakeClient, sink: FakeSink) -> None:
    """A Stripe body that is not JSON cannot give a key: 400 bad-body."""
    client = await make_client()
    response = await client.post("/webhooks/plain", data=b"not json")
    assert response.status == 400
    assert (await response.json())["reason"] == "bad-body"


async def test_verify_none_is_accepted_unsigned(make_client: MakeClient, sink: FakeSink) -> None:
    """A source with verify = "none" takes an unsigned delivery."""
    client = await make_client()
    response = await client.post(
        "/webhooks/github", data=b'{"zen": "hi"}', headers={"X-GitHub-Delivery": "guid-1"}
    )
    assert response.status == 202
    assert (await response.json())["key"] == "github:guid-1"
    assert sink.records[0].key == b"github:guid-1"


async def test_verify_worker_is_left_to_the_worker(make_client: MakeClient, sink: FakeSink) -> None:
    """A source with verify = "worker" is produced unverified, signature headers included, for the worker."""
    client = await make_client()
    body = stripe_body("evt_later")
    headers = sign("stripe", body, "whsec_whoever", timestamp=time.time())
    response = await client.post("/webhooks/later", data=body, headers=headers)
    assert response.status == 202
    assert dict(sink.records[0].headers)["http-stripe-signature"] == headers["Stripe-Signature"].encode()


async def test_no_secret_configured_is_401_not_500(make_client: MakeClient, sink: FakeSink) -> None:
    """A verified source whose secret variable is unset refuses with 401 'no secret configured'."""
    client = await make_client()
    body = stripe_body("evt_ns")
    headers = sign("stripe", body, STRIPE_SECRET, timestamp=time.time())
    response = await client.post("/webhooks/nosecret", data=body, headers=headers)
    assert response.status == 401
    answer = await response.json()
    assert answer == {"error": "no secret configured for source nosecret", "reason": "no-secret"}
    assert sink.records == []


async def test_hop_by_hop_headers_are_not_copied(make_client: MakeClient, sink: FakeSink) -> None:
    """Connection, Keep-Alive, Content-Length, credentials and Connection-named headers stay out of Kafka."""
    client = await make_client()
    response = await client.post(
        "/webhooks/plain",
        data=stripe_body("evt_hop"),
        headers={
            "Connection": "keep-alive, X-Hop-Only",
            "Keep-Alive": "timeout=5",
            "X-Hop-Only": "1",
            "Authorization": "Basic c2VjcmV0OnNlY3JldA==",
            "X-Request-Id": "req-7",
            "User-Agent": "Stripe/1.0",
        },
    )
    assert response.status == 202
    names = {name for name, _ in sink.records[0].headers}
    assert {"http-x-request-id", "http-user-agent", "http-content-type", "http-host"} <= names
    for dropped in ("connection", "keep-alive", "x-hop-only", "authorization", "content-length"):
        assert f"http-{dropped}" not in names


async def test_transfer_encoding_is_not_copied(make_client: MakeClient, sink: FakeSink) -> None:
    """A chunked delivery's Transfer-Encoding header is not copied; the body arrives whole."""
    client = await make_client()
    body = stripe_body("evt_chunked", size=3000)

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 700):
            yield body[start : start + 700]

    response = await client.post("/webhooks/plain", data=chunks())
    assert response.status == 202
    (record,) = sink.records
    assert record.value == body
    assert "http-transfer-encoding" not in {name for name, _ in record.headers}


async def test_a_compressed_delivery_is_stored_decoded(make_client: MakeClient, sink: FakeSink) -> None:
    """aiohttp decodes a gzip body; the record holds the decoded body and no Content-Encoding header."""
    client = await make_client()
    body = stripe_body("evt_gzip", size=500)
    response = await client.post(
        "/webhooks/plain", data=gzip.compress(body), headers={"Content-Encoding": "gzip"}
    )
    assert response.status == 202
    (record,) = sink.records
    assert record.value == body
    assert "http-content-encoding" not in {name for name, _ in record.headers}


async def test_secrets_never_appear_in_responses_or_logs(
    make_client: MakeClient, sink: FakeSink, caplog: pytest.LogCaptureFixture
) -> None:
    """Neither accepted, forged nor stale deliveries put the secret in an answer or a log line."""
    caplog.set_level(logging.DEBUG)
    client = await make_client()
    body = stripe_body("evt_secret")
    answers = []
    for headers in (
        sign("stripe", body, STRIPE_SECRET, timestamp=time.time()),
        sign("stripe", body, "whsec_other", timestamp=time.time()),
        sign("stripe", body, STRIPE_SECRET, timestamp=time.time() - 3600),
        {},
    ):
        response = await client.post("/webhooks/stripe", data=body, headers=headers)
        answers.append(await response.text())
    assert "stripe:evt_secret" in answers[0]
    for text in [*answers, caplog.text]:
        assert STRIPE_SECRET not in text
        assert STRIPE_SECRET[len("whsec_") :] not in text
    assert "key=stripe:evt_secret" in caplog.text


async def test_a_hanging_broker_answers_503_quickly(make_client: MakeClient, sink: FakeSink) -> None:
    """A produce that never completes gives 503 with Retry-After within the timeout, every time."""
    client = await make_client(produce_timeout=0.2, retry_after=7)
    sink.hold = asyncio.Event()
    for event_id in ("evt_h1", "evt_h2"):
        started = time.monotonic()
        response = await client.post("/webhooks/plain", data=stripe_body(event_id))
        assert response.status == 503
        assert response.headers["Retry-After"] == "7"
        assert (await response.json())["reason"] == "broker-unavailable"
        assert time.monotonic() - started < 2.0


async def test_a_broker_error_answers_503(make_client: MakeClient, sink: FakeSink) -> None:
    """A sink that reports the broker unavailable gives 503 broker-unavailable."""
    client = await make_client()
    sink.fail = BrokerUnavailableError("connection refused")
    response = await client.post("/webhooks/plain", data=stripe_body("evt_down"))
    assert response.status == 503
    assert "Retry-After" in response.headers
    assert await response.json() == {"error": "connection refused", "reason": "broker-unavailable"}


async def test_health_and_readiness(make_client: MakeClient, sink: FakeSink) -> None:
    """/healthz is 200 always; /readyz follows the sink's readiness."""
    client = await make_client()
    assert (await client.get("/healthz")).status == 200
    assert (await client.get("/readyz")).status == 200
    sink.is_ready = False
    assert (await client.get("/healthz")).status == 200
    assert (await client.get("/readyz")).status == 503


async def test_metrics_count_requests_by_source_and_status(make_client: MakeClient) -> None:
    """/metrics shows requests by source and status, latency and body-size histograms."""
    client = await make_client()
    await client.post("/webhooks/plain", data=stripe_body("evt_m"))
    await client.post("/webhooks/nope", data=b"{}")
    text = await (await client.get("/metrics")).text()
    assert 'pipeline_ingress_requests_total{source="plain",status="202"} 1.0' in text
    assert 'pipeline_ingress_requests_total{source="-",status="404"} 1.0' in text
    assert 'pipeline_ingress_request_seconds_count{source="plain"} 1.0' in text
    assert "pipeline_ingress_body_bytes_count 1.0" in text


async def test_forwarded_headers_are_used_only_when_trusted(make_client: MakeClient, sink: FakeSink) -> None:
    """Square signs the public URL: it verifies behind a proxy only with trust_forwarded on."""
    public = "https://hooks.example.com/webhooks/square?x=1"
    body = orjson.dumps({"event_id": "sq-evt-1", "type": "payment.updated"})
    headers = sign("square", body, SQUARE_SECRET, timestamp=time.time(), url=public)
    headers |= {"X-Forwarded-Proto": "https", "X-Forwarded-Host": "hooks.example.com"}
    untrusting = await make_client()
    response = await untrusting.post("/webhooks/square?x=1", data=body, headers=headers)
    assert response.status == 401
    trusting = await make_client(trust_forwarded=True)
    response = await trusting.post("/webhooks/square?x=1", data=body, headers=headers)
    assert response.status == 202, await response.text()
    assert sink.records[0].key == b"square:sq-evt-1"


def test_settings_are_validated() -> None:
    """Invalid settings raise one ConfigError listing every problem."""
    with pytest.raises(ConfigError) as caught:
        IngressSettings(bootstrap=" ", topology=Path("t.toml"), port=70000, produce_timeout=0)
    message = str(caught.value)
    assert "bootstrap" in message
    assert "port" in message
    assert "produce timeout" in message


async def test_stop_drains_in_flight_requests_then_stops_the_sink(sink: FakeSink) -> None:
    """stop() finishes a request waiting for its ack, refuses new connections, then stops the sink."""
    settings = IngressSettings(bootstrap="unused:9092", topology=Path("unused.toml"), port=0)
    ingress = Ingress(settings, TOPO, environ=ENVIRON, sink=sink)
    await ingress.start()
    assert sink.started
    url = f"http://127.0.0.1:{ingress.port}"
    runner = asyncio.create_task(ingress.run())
    sink.hold = asyncio.Event()
    async with aiohttp.ClientSession() as session:
        pending = asyncio.create_task(session.post(f"{url}/webhooks/plain", data=stripe_body("evt_drain")))
        await asyncio.sleep(0.3)  # the request is now waiting for its "ack"
        assert not pending.done()
        ingress.stop()
        await asyncio.sleep(0.2)
        assert not runner.done()
        sink.hold.set()
        response = await asyncio.wait_for(pending, 5)
        assert response.status == 202
        await asyncio.wait_for(runner, 5)
        assert sink.stopped
        with pytest.raises(aiohttp.ClientConnectionError):
            await session.post(f"{url}/webhooks/plain", data=stripe_body("evt_late"))


async def test_a_refused_webhooks_key_and_source_stay_on_one_log_line(
    make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    """A source or event id holding a newline or a bidi override is written escaped in the refusal's line."""
    caplog.set_level(logging.WARNING, logger="pipeline.ingress")
    client = await make_client()
    await client.post("/webhooks/no%0Asuch%E2%80%AE", data=b"{}")
    body = orjson.dumps({"id": "evt_1\nINFO forged", "type": "x"})
    await client.post("/webhooks/stripe", data=body, headers={"Stripe-Signature": "t=1,v1=00"})
    lines = [r.getMessage() for r in caplog.records if "refused webhook" in r.getMessage()]
    assert len(lines) == 2
    assert all("\n" not in line for line in lines)
    assert "no\\nsuch\\u202e" in lines[0]
    assert "key=stripe:evt_1\\nINFO forged" in lines[1]
