"""Classifying input records: DLQ reasons, key derivation, rerouting and worker-side verification."""

from __future__ import annotations

import orjson
import pytest

from pipeline import topology
from pipeline.contract import Delivery
from pipeline.kafka.partitioner import owner_partition
from pipeline.providers.signing import sign
from pipeline.worker.classify import Accepted, Classifier, Invalid, Reroute

PARTS = 4
SECRET = "whsec_test_secret"
TOPO = topology.parse(
    {
        "sources": {
            "stripe": {"verify": "none"},
            "github": {"secrets": ["GH_SECRET"], "verify": "worker"},
            "paid": {"provider": "stripe", "secrets": ["ST_SECRET"], "verify": "worker"},
        }
    }
)


@pytest.fixture
def classifier() -> Classifier:
    return Classifier(
        TOPO, owner_partition, input_partitions=PARTS, environ={"GH_SECRET": SECRET, "ST_SECRET": SECRET}
    )


def _delivery(
    key: bytes | None, value: bytes, headers: list[tuple[str, bytes]], partition: int | None = None
) -> Delivery:
    if partition is None:
        partition = owner_partition(key, PARTS) if key else 0
    return Delivery.from_record("raw", partition, 1, 1_700_000_000_000, key, value, headers)


STRIPE = [("source", b"stripe")]
BODY = orjson.dumps({"id": "evt_1", "type": "charge.succeeded", "data": {"object": {"id": "ch_1"}}})


def test_a_well_formed_record_is_accepted_with_its_event_type(classifier: Classifier) -> None:
    """A keyed record on its own partition is accepted, parsed and typed."""
    result = classifier.classify(_delivery(b"stripe:evt_1", BODY, STRIPE))
    assert isinstance(result, Accepted)
    assert result.key == "stripe:evt_1"
    assert result.key_bytes == b"stripe:evt_1"
    assert result.source.name == "stripe"
    assert result.event_type == "charge.succeeded"
    assert result.body == BODY


@pytest.mark.parametrize(
    ("key", "value", "headers", "reason"),
    [
        (b"stripe:evt_1", BODY, [], "unknown-source"),
        (b"gitlab:1", BODY, [("source", b"gitlab")], "unknown-source"),
        (None, b'{"no": "id"}', STRIPE, "missing-key"),
        (b"stripe:evt_1", b"not json", STRIPE, "bad-body"),
        (b"stripe:evt_1", b"[1, 2]", STRIPE, "bad-body"),
    ],
)
def test_unusable_records_are_invalid_with_a_reason(
    classifier: Classifier, key: bytes | None, value: bytes, headers: list[tuple[str, bytes]], reason: str
) -> None:
    """No source, an unknown source, no key and a non-object body each get their DLQ reason."""
    result = classifier.classify(_delivery(key, value, headers))
    assert isinstance(result, Invalid)
    assert result.reason == reason
    assert result.error


def test_a_keyless_record_takes_its_key_from_the_header_then_the_provider(classifier: Classifier) -> None:
    """The idempotency-key header wins over the provider's event id; both are scoped by source."""
    owner = owner_partition(b"stripe:evt_1", PARTS)
    from_body = classifier.classify(_delivery(None, BODY, STRIPE, partition=owner))
    assert isinstance(from_body, Accepted)
    assert from_body.key == "stripe:evt_1"
    header_key = b"stripe:custom"
    from_header = classifier.classify(
        _delivery(
            None,
            BODY,
            [*STRIPE, ("idempotency-key", b"custom")],
            partition=owner_partition(header_key, PARTS),
        )
    )
    assert isinstance(from_header, Accepted)
    assert from_header.key == "stripe:custom"


def test_a_record_on_the_wrong_partition_is_rerouted_to_its_owner(classifier: Classifier) -> None:
    """A key that hashes elsewhere (murmur2) is moved, not deduped here."""
    owner = owner_partition(b"stripe:evt_1", PARTS)
    result = classifier.classify(_delivery(b"stripe:evt_1", BODY, STRIPE, partition=(owner + 1) % PARTS))
    assert result == Reroute(key="stripe:evt_1", partition=owner, source="stripe")


def test_an_unscoped_key_is_prefixed_with_its_source(classifier: Classifier) -> None:
    """A raw provider id as record key is scoped to '<source>:<id>'."""
    result = classifier.classify(
        _delivery(b"evt_1", BODY, STRIPE, partition=owner_partition(b"stripe:evt_1", PARTS))
    )
    assert isinstance(result, Accepted)
    assert result.key == "stripe:evt_1"


@pytest.mark.parametrize(
    ("record_key", "key"),
    [
        (b"stripe:evt_1", "stripe:evt_1"),
        (b"  stripe:evt_1\n", "stripe:evt_1"),
        ("stripe:evt_1\u2003".encode(), "stripe:evt_1"),  # Unicode whitespace is stripped too
        (b"stripe:evt_\xff", "stripe:evt_\ufffd"),  # not UTF-8: decoded with replacement
        (b"stripe:", None),  # a scope without an id: the DLQ, not the provider's id
    ],
)
def test_record_keys_are_stripped_and_decoded_the_same_way_on_every_path(
    classifier: Classifier, record_key: bytes, key: str | None
) -> None:
    """Whitespace around a record key never makes a second key for one event, however it is spelled."""
    partition = owner_partition(key.encode(), PARTS) if key else 0
    result = classifier.classify(_delivery(record_key, BODY, STRIPE, partition=partition))
    if key is None:
        assert isinstance(result, Invalid)
        assert result.reason == "missing-key"
        return
    assert isinstance(result, Accepted)
    assert result.key == key
    assert result.key_bytes == key.encode()


def _github(body: bytes, secret: str, received_at_ms: int) -> list[tuple[str, bytes]]:
    signed = sign("github", body, secret, timestamp=received_at_ms / 1000, msg_id="d-1", event_type="push")
    headers = [("source", b"github"), ("received-at", str(received_at_ms).encode())]
    return headers + [(f"http-{name.lower()}", value.encode()) for name, value in signed.items()]


def test_worker_side_verification_accepts_a_good_signature(classifier: Classifier) -> None:
    """A source verified in the worker accepts a correctly signed record."""
    body = b'{"ref": "refs/heads/main"}'
    result = classifier.classify(_delivery(b"github:d-1", body, _github(body, SECRET, 1_700_000_000_000)))
    assert isinstance(result, Accepted)


def test_worker_side_verification_sends_forgeries_to_the_dlq(classifier: Classifier) -> None:
    """A forged record is invalid with the signature reason and is never accepted."""
    body = b'{"ref": "refs/heads/main"}'
    result = classifier.classify(
        _delivery(b"github:d-1", body, _github(body, "wrong-secret", 1_700_000_000_000))
    )
    assert isinstance(result, Invalid)
    assert result.reason == "bad-signature"


RECEIVED_MS = 1_700_000_000_000
BODY_A = orjson.dumps({"id": "evt_A", "type": "invoice.paid"})
BODY_B = orjson.dumps({"id": "evt_B", "type": "invoice.paid"})


def _paid(body: bytes, *, idempotency_key: bytes | None = None) -> list[tuple[str, bytes]]:
    """Kafka headers of a Stripe request to the worker-verified source ``paid``, validly signed."""
    signed = sign("stripe", body, SECRET, timestamp=RECEIVED_MS / 1000)
    headers = [("source", b"paid"), ("received-at", str(RECEIVED_MS).encode())]
    headers += [(f"http-{name.lower()}", value.encode()) for name, value in signed.items()]
    if idempotency_key is not None:
        headers.append(("idempotency-key", idempotency_key))
    return headers


@pytest.mark.parametrize(
    ("record_key", "idempotency_key"),
    [
        (b"paid:evt_A", None),  # already scoped: the fast path must not trust it
        (b"evt_A", None),  # unscoped
        (b"  paid:evt_A\n", None),  # spelled with whitespace
        (None, b"evt_A"),  # keyless, the idempotency-key header claims A
        (b"paid:evt_A", b"evt_B"),  # the record key is the claim, whatever the header says
    ],
)
def test_a_signed_body_of_b_filed_under_a_is_a_key_mismatch_never_accepted(
    classifier: Classifier, record_key: bytes | None, idempotency_key: bytes | None
) -> None:
    """With verify = "worker", a validly signed body of event B under key A goes to the DLQ as key-mismatch."""
    partition = owner_partition(b"paid:evt_A", PARTS)
    result = classifier.classify(
        _delivery(record_key, BODY_B, _paid(BODY_B, idempotency_key=idempotency_key), partition)
    )
    assert isinstance(result, Invalid)
    assert result.reason == "key-mismatch"
    assert "paid:evt_A" in result.error
    assert "paid:evt_B" in result.error


def test_a_key_mismatch_is_refused_where_it_lands_not_rerouted(classifier: Classifier) -> None:
    """A mismatched record on A's partition or on B's is invalid there; it is never moved to either owner."""
    for partition in range(PARTS):
        result = classifier.classify(_delivery(b"paid:evt_A", BODY_B, _paid(BODY_B), partition))
        assert isinstance(result, Invalid), partition
        assert result.reason == "key-mismatch"


def test_the_genuine_event_keeps_its_key_after_a_mismatched_copy(classifier: Classifier) -> None:
    """After B's body was refused under A's key, the genuine A is accepted as paid:evt_A."""
    owner = owner_partition(b"paid:evt_A", PARTS)
    forged = classifier.classify(_delivery(b"paid:evt_A", BODY_B, _paid(BODY_B), owner))
    genuine = classifier.classify(_delivery(b"paid:evt_A", BODY_A, _paid(BODY_A), owner))
    assert isinstance(forged, Invalid)
    assert isinstance(genuine, Accepted)
    assert (genuine.key, genuine.key_bytes) == ("paid:evt_A", b"paid:evt_A")


def test_a_keyless_worker_verified_record_takes_the_verified_event_id(classifier: Classifier) -> None:
    """Without a key or header the key is the verified body's id: accepted on its owner, rerouted elsewhere."""
    owner = owner_partition(b"paid:evt_B", PARTS)
    accepted = classifier.classify(_delivery(None, BODY_B, _paid(BODY_B), owner))
    assert isinstance(accepted, Accepted)
    assert accepted.key == "paid:evt_B"
    moved = classifier.classify(_delivery(None, BODY_B, _paid(BODY_B), (owner + 1) % PARTS))
    assert moved == Reroute(key="paid:evt_B", partition=owner, source="paid")


def test_a_forged_signature_is_refused_before_the_key_is_compared(classifier: Classifier) -> None:
    """A bad signature under a mismatched key is bad-signature: nothing is read from an unverified request."""
    headers = _paid(BODY_B)
    headers = [
        (n, b"t=1700000000,v1=" + b"0" * 64 if n == "http-stripe-signature" else v) for n, v in headers
    ]
    result = classifier.classify(
        _delivery(b"paid:evt_A", BODY_B, headers, owner_partition(b"paid:evt_A", PARTS))
    )
    assert isinstance(result, Invalid)
    assert result.reason == "bad-signature"


def test_a_keyless_record_of_a_header_keyed_provider_takes_the_delivery_header_as_key() -> None:
    """With no record key, a GitHub source not verified here is keyed by its X-GitHub-Delivery header."""
    topo = topology.parse({"sources": {"hub": {"provider": "github", "verify": "none"}}})
    classifier = Classifier(topo, owner_partition, input_partitions=PARTS, environ={})
    headers = [("source", b"hub"), ("http-x-github-delivery", b"d-7")]
    result = classifier.classify(_delivery(None, b"{}", headers, owner_partition(b"hub:d-7", PARTS)))
    assert isinstance(result, Accepted)
    assert result.key == "hub:d-7"


def test_a_record_without_any_key_says_where_none_was_found(classifier: Classifier) -> None:
    """A scope without an id is missing-key, and the error names the three places a key is looked for."""
    result = classifier.classify(_delivery(b"stripe:", BODY, STRIPE))
    assert result == Invalid(
        "missing-key",
        "the record has no key, no idempotency-key header and no provider event id",
        "stripe:",
        "stripe",
    )


def test_a_worker_verified_request_without_an_event_id_is_missing_key(classifier: Classifier) -> None:
    """A validly signed body whose event id is blank is missing-key, with the verified request named."""
    blank = orjson.dumps({"id": "  ", "type": "invoice.paid"})
    result = classifier.classify(_delivery(None, blank, _paid(blank), 0))
    assert isinstance(result, Invalid)
    assert (result.reason, result.error) == ("missing-key", "the verified request's event id is empty")


def test_a_claimed_key_not_utf8_is_decoded_with_replacement_and_compared(classifier: Classifier) -> None:
    """A record key of invalid UTF-8 on a worker-verified source is a key-mismatch that quotes it decoded."""
    owner = owner_partition(b"paid:evt_A", PARTS)
    result = classifier.classify(_delivery(b"paid:evt_\xff", BODY_A, _paid(BODY_A), owner))
    assert isinstance(result, Invalid)
    assert result.error == "the record key 'paid:evt_\ufffd' is not the verified request's key 'paid:evt_A'"


@pytest.mark.parametrize(
    ("length", "shown"),
    [(120, "'paid:" + "x" * 115 + "'"), (121, "'paid:" + "x" * 115 + "'…")],
)
def test_a_mismatched_key_is_quoted_in_full_up_to_120_characters_then_cut(
    classifier: Classifier, length: int, shown: str
) -> None:
    """The key-mismatch error quotes a claimed key of 120 characters whole; a longer one cut at 120 with '…'."""
    claimed = ("paid:" + "x" * (length - 5)).encode()
    owner = owner_partition(b"paid:evt_A", PARTS)
    result = classifier.classify(_delivery(claimed, BODY_A, _paid(BODY_A), owner))
    assert isinstance(result, Invalid)
    assert result.error == f"the record key {shown} is not the verified request's key 'paid:evt_A'"
