"""The emitter: DLQ records (bounded keys, truncated values), their audit records and counts, and rerouted copies."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import orjson

from pipeline.contract import Delivery
from pipeline.dead_letter import DLQ_MIN_MAX_BYTES
from pipeline.headers import RECEIVED_AT_HEADER, REROUTED_FROM_HEADER, SOURCE_HEADER
from pipeline.worker.emitter import MAX_DLQ_KEY_BYTES, Emitter

from .fakes import TOPICS, outputs

T = 1_700_000_000_000


@dataclass
class _Emitted:
    """One record handed to the transaction."""

    topic: str
    partition: int
    key: bytes | None
    value: bytes
    timestamp: int
    headers: list[tuple[str, bytes]] | None

    def json(self) -> dict[str, Any]:
        parsed: dict[str, Any] = orjson.loads(self.value)
        return parsed


@dataclass
class _Txn:
    """A partition transaction that keeps what it is handed."""

    records: list[_Emitted] = field(default_factory=list)

    def emit(
        self,
        topic: str,
        partition: int,
        *,
        key: bytes | None,
        value: bytes,
        timestamp: int,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None:
        self.records.append(_Emitted(topic, partition, key, value, timestamp, headers))

    def to(self, topic: str) -> list[_Emitted]:
        return [r for r in self.records if r.topic == topic]


@dataclass
class _Counts:
    """A recorder that notes every call."""

    calls: list[tuple[str, Any]] = field(default_factory=list)

    def outcome(self, source: str | None, outcome: str, count: int = 1) -> None:
        self.calls.append(("outcome", (source, outcome, count)))

    def command(self, topic: str, count: int = 1) -> None:
        self.calls.append(("command", (topic, count)))

    def dlq(self, reason: str, count: int = 1) -> None:
        self.calls.append(("dlq", (reason, count)))

    def skewed(self, count: int = 1) -> None:
        self.calls.append(("skewed", count))


def _emitter(limits: dict[str, int] | None = None) -> tuple[Emitter, _Txn, _Counts]:
    txn, counts = _Txn(), _Counts()
    return Emitter(txn, topics=TOPICS, outputs=outputs(limits), recorder=counts), txn, counts  # type: ignore[arg-type]


def _delivery(
    key: bytes | None, *, partition: int = 3, offset: int = 9, value: bytes = b"not json", headers: Any = None
) -> Delivery:
    if headers is None:
        headers = [(SOURCE_HEADER, b"stripe"), (RECEIVED_AT_HEADER, str(T - 5).encode())]
    return Delivery(TOPICS.input, partition, offset, T, key, value, headers)


def test_a_dlq_record_keeps_the_record_key_on_the_partition_of_its_input_and_audits_it_invalid() -> None:
    """The DLQ record: the input's key, its partition, its timestamp; one audit record with key, source, reason, extra."""
    emitter, txn, counts = _emitter()
    delivery = _delivery(b"stripe:evt_1")
    emitter.dlq(
        delivery,
        reason="bad-body",
        error="the body is not JSON",
        key="stripe:evt_1",
        source="stripe",
        extra={"replayed_from": "dlq:0:4"},
    )
    (dlq,) = txn.to(TOPICS.dlq)
    assert (dlq.partition, dlq.key, dlq.timestamp) == (3, b"stripe:evt_1", T)
    value = dlq.json()
    assert (value["reason"], value["error"], value["offset"], value["value"]) == (
        "bad-body",
        "the body is not JSON",
        9,
        "not json",
    )
    (audit,) = txn.to(TOPICS.audit)
    assert audit.key == b"stripe:evt_1"
    assert audit.json() == {
        "key": "stripe:evt_1",
        "outcome": "invalid",
        "partition": 3,
        "offset": 9,
        "received_at": T - 5,
        "first_seen_at": None,
        "source": "stripe",
        "event_type": None,
        "expires_at": None,
        "reason": "bad-body",
        "replayed_from": "dlq:0:4",
    }
    assert counts.calls == [("dlq", ("bad-body", 1))]


def test_a_dlq_record_larger_than_the_dlq_takes_is_truncated_to_fit() -> None:
    """With the DLQ topic's limit at its minimum, a large body is cut and hashed, the record within the limit."""
    emitter, txn, _ = _emitter({TOPICS.dlq: DLQ_MIN_MAX_BYTES})
    body = b"x" * (4 * DLQ_MIN_MAX_BYTES)
    emitter.dlq(_delivery(b"k", value=body), reason="bad-body", error="no", key="k", source=None)
    (dlq,) = txn.to(TOPICS.dlq)
    value = dlq.json()
    assert value["truncated"] is True
    assert value["value_bytes"] == len(body)
    assert value["value_sha256"] == hashlib.sha256(body).hexdigest()
    assert len(dlq.value) + len(b"k") <= DLQ_MIN_MAX_BYTES


def test_a_key_of_at_most_16_kib_is_kept_and_a_longer_one_replaced_by_its_hash() -> None:
    """A DLQ record keeps a key of exactly MAX_DLQ_KEY_BYTES; one byte more and key and audit key are sha256:<hex>."""
    emitter, txn, _ = _emitter()
    at_limit = b"k" * MAX_DLQ_KEY_BYTES
    over = b"k" * (MAX_DLQ_KEY_BYTES + 1)
    hashed = b"sha256:" + hashlib.sha256(over).hexdigest().encode()
    emitter.dlq(_delivery(at_limit), reason="unknown-source", error="e", key=at_limit.decode(), source=None)
    emitter.dlq(_delivery(over), reason="unknown-source", error="e", key=over.decode(), source=None)
    assert [r.key for r in txn.to(TOPICS.dlq)] == [at_limit, hashed]
    audits = txn.to(TOPICS.audit)
    assert [r.key for r in audits] == [at_limit, hashed]
    assert audits[1].json()["key"] == hashed.decode()


def test_a_keyless_dlq_record_stays_keyless() -> None:
    """A record without a key goes to the DLQ without one, and its audit record too."""
    emitter, txn, _ = _emitter()
    emitter.dlq(_delivery(None), reason="missing-key", error="no key", key=None, source="stripe")
    assert [r.key for r in txn.records] == [None, None]
    assert txn.to(TOPICS.audit)[0].partition == 3  # keyless: the audit follows the input partition


def test_a_rerouted_copy_keeps_body_and_timestamp_and_names_only_its_latest_origin() -> None:
    """The copy goes to the owner partition keyed by the scoped key, stamped as the input was; an older
    rerouted-from header (any case) is replaced by this record's partition and offset."""
    emitter, txn, _ = _emitter()
    headers = [
        (SOURCE_HEADER, b"stripe"),
        ("Rerouted-From", b"5:1"),
        (REROUTED_FROM_HEADER, b"4:2"),
        (RECEIVED_AT_HEADER, b"17"),
    ]
    delivery = _delivery(b"evt_1", value=b'{"id": "evt_1"}', headers=headers)
    emitter.reroute(delivery, key="stripe:evt_1", partition=1)
    (copy,) = txn.records
    assert (copy.topic, copy.partition, copy.key, copy.value, copy.timestamp) == (
        TOPICS.input,
        1,
        b"stripe:evt_1",
        b'{"id": "evt_1"}',
        T,
    )
    assert copy.headers == [
        (SOURCE_HEADER, b"stripe"),
        (RECEIVED_AT_HEADER, b"17"),
        (REROUTED_FROM_HEADER, b"3:9"),
    ]
