"""The worker's Kafka clients (``pipeline.worker.clients``): the exact settings its consumer and producer get.

No broker is reached: aiokafka's classes are replaced by recorders of the keyword
arguments the worker builds them with.
"""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path
from typing import Any

import pytest
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.producer import sender as aiokafka_sender

from pipeline.kafka.settings import MAX_MESSAGE_BYTES
from pipeline.worker import clients
from pipeline.worker.settings import WorkerSettings


class Recorder:
    """Stands in for an aiokafka client class: keeps the keyword arguments of each construction."""

    def __init__(self) -> None:
        self.made: list[dict[str, Any]] = []

    def __call__(self, **kwargs: Any) -> dict[str, Any]:
        self.made.append(kwargs)
        return kwargs


@pytest.fixture
def consumer_kwargs(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    """The keyword arguments ``worker_consumer`` hands aiokafka's consumer."""
    recorder = Recorder()
    monkeypatch.setattr(clients, "AIOKafkaConsumer", recorder)
    return recorder


@pytest.fixture
def producer_kwargs(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    """The keyword arguments ``transactional_producer`` hands aiokafka's producer."""
    recorder = Recorder()
    monkeypatch.setattr(clients, "AIOKafkaProducer", recorder)
    monkeypatch.setattr(aiokafka_sender, "BACKOFF_OVERRIDE", None)  # restored after the test
    return recorder


def _settings(**changes: Any) -> WorkerSettings:
    values: dict[str, Any] = {
        "bootstrap": "k1:9092,k2:9092",
        "topology": Path("t.toml"),
        "state_dir": Path("/var/state"),
        "group": "hooks",
    }
    values.update(changes)
    return WorkerSettings(**values)


def test_the_consumer_reads_committed_records_and_never_commits_by_itself(consumer_kwargs: Recorder) -> None:
    """Every setting of the group consumer, as the settings and the exactly-once design give them."""
    settings = _settings(
        poll_records=700,
        max_batch=900,
        fetch_max_bytes=3 * 1024 * 1024,
        max_partition_fetch_bytes=1024 * 1024 + 1,
        check_crcs=True,
        session_timeout_ms=10_003,
        instance_id="pod-7",
    )
    clients.worker_consumer(settings)
    assert consumer_kwargs.made == [
        {
            "bootstrap_servers": "k1:9092,k2:9092",
            "group_id": "hooks",
            "enable_auto_commit": False,
            "isolation_level": "read_committed",
            "auto_offset_reset": "earliest",
            "max_poll_records": 700,
            "fetch_max_bytes": 3 * 1024 * 1024,
            "max_partition_fetch_bytes": 1024 * 1024 + 1,
            "check_crcs": True,
            "session_timeout_ms": 10_003,
            "group_instance_id": "pod-7",
            "heartbeat_interval_ms": 2000,  # a fifth of the session, whole milliseconds
            "client_id": "pipeline-worker-hooks",
            "partition_assignment_strategy": (RoundRobinPartitionAssignor,),
        }
    ]
    heartbeat = consumer_kwargs.made[0]["heartbeat_interval_ms"]
    assert type(heartbeat) is int


def test_the_consumer_defaults_follow_the_settings(consumer_kwargs: Recorder) -> None:
    """Defaults: CRCs unchecked, no static member id, the fetch count capped by max_batch."""
    clients.worker_consumer(_settings(poll_records=5000, max_batch=800))
    made = consumer_kwargs.made[0]
    assert made["check_crcs"] is False
    assert made["group_instance_id"] is None
    assert made["max_poll_records"] == 800
    assert made["fetch_max_bytes"] == 16 * 1024 * 1024
    assert made["max_partition_fetch_bytes"] == 4 * 1024 * 1024


@pytest.mark.parametrize(
    ("session_ms", "heartbeat_ms"), [(1000, 300), (1500, 300), (1505, 301), (60_000, 12_000)]
)
def test_the_heartbeat_is_a_fifth_of_the_session_but_never_under_300_ms(
    consumer_kwargs: Recorder, session_ms: int, heartbeat_ms: int
) -> None:
    """heartbeat.interval.ms: session // 5, at least 300."""
    clients.worker_consumer(_settings(session_timeout_ms=session_ms))
    assert consumer_kwargs.made[0]["heartbeat_interval_ms"] == heartbeat_ms


def test_the_consumer_takes_the_assignor_it_is_given(consumer_kwargs: Recorder) -> None:
    """A given assignor is the consumer's only strategy; without one, aiokafka's round-robin."""
    assignor = object()
    clients.worker_consumer(_settings(), assignor=assignor)
    clients.worker_consumer(_settings(), assignor=None)
    strategies = [made["partition_assignment_strategy"] for made in consumer_kwargs.made]
    assert strategies == [(assignor,), (RoundRobinPartitionAssignor,)]


def test_the_producer_is_idempotent_transactional_and_named_by_its_id(producer_kwargs: Recorder) -> None:
    """Every setting of the transactional producer: acks=all, idempotent, the largest batch, the settings' timeouts."""
    clients.transactional_producer(_settings(linger_ms=7, transaction_timeout=12.5), "app-hooks-worker-pod-7")
    assert producer_kwargs.made == [
        {
            "bootstrap_servers": "k1:9092,k2:9092",
            "transactional_id": "app-hooks-worker-pod-7",
            "acks": "all",
            "enable_idempotence": True,
            "max_batch_size": MAX_MESSAGE_BYTES,
            "max_request_size": MAX_MESSAGE_BYTES,
            "linger_ms": 7,
            "transaction_timeout_ms": 12_500,
            "client_id": "app-hooks-worker-pod-7",
        }
    ]


def test_making_the_producer_shortens_aiokafkas_concurrent_transactions_wait(
    producer_kwargs: Recorder,
) -> None:
    """aiokafka's sender asks again after 5 ms, not its own 20 ms, while the last transaction's markers are written."""
    clients.transactional_producer(_settings(), "t")
    assert aiokafka_sender.BACKOFF_OVERRIDE == clients.CONCURRENT_TXN_RETRY_S == 0.005


def test_the_transactional_id_is_the_apps_the_groups_and_the_instances() -> None:
    """With a static member id, the id names it; a legacy partition id names topic and partition."""
    assert clients.worker_transactional_id(_settings(instance_id="pod-7"), "app") == "app-hooks-worker-pod-7"
    assert clients.legacy_transactional_id("app", "g", "events", 3) == "app-g-events-3"


def test_without_an_instance_id_the_transactional_id_names_the_host_and_state_dir_by_16_hex_digits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No --instance-id: the instance is the first 16 hex digits of sha256("<host>:<state dir>"), the same on every
    start (a restart must abort what the last run left open), another for another state dir."""
    monkeypatch.setattr(socket, "gethostname", lambda: "node-1")
    expected = hashlib.sha256(f"node-1:{Path('/var/state').resolve()}".encode()).hexdigest()[:16]
    assert clients.worker_transactional_id(_settings(), "app") == f"app-hooks-worker-{expected}"
    assert clients.worker_transactional_id(_settings(state_dir=Path("/var/other")), "app") != (
        f"app-hooks-worker-{expected}"
    )
