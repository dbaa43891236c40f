"""The key partitioner: the Java client's murmur2 placement, hashed fast and once."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from aiokafka.partitioner import murmur2 as aiokafka_murmur2
from aiokafka.producer import sender

from pipeline.kafka.partitioner import KeyPartitioner, key_hash, murmur2, owner_partition
from pipeline.worker.clients import CONCURRENT_TXN_RETRY_S, transactional_producer, worker_consumer
from pipeline.worker.settings import WorkerSettings


@pytest.mark.parametrize("length", range(80))
def test_murmur2_matches_aiokafka_for_every_tail_length(length: int) -> None:
    """Our murmur2 gives aiokafka's hash for keys of every length up to 79 bytes."""
    rng = random.Random(length)
    for _ in range(50):
        data = bytes(rng.randrange(256) for _ in range(length))
        assert murmur2(data) == aiokafka_murmur2(data) & 0xFFFFFFFF


JAVA_MURMUR2 = {  # org.apache.kafka.common.utils.UtilsTest#testMurmur2 (signed 32-bit ints)
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize(("key", "expected"), JAVA_MURMUR2.items())
def test_murmur2_gives_the_java_clients_hashes(key: bytes, expected: int) -> None:
    """The hashes Kafka's own tests expect, so records land where Java producers put them."""
    assert murmur2(key) == expected & 0xFFFFFFFF
    assert owner_partition(key, 7) == (expected & 0x7FFFFFFF) % 7


KEY_HASHES = {  # Utils.toPositive(Utils.murmur2(key)) of JAVA_MURMUR2's keys: the sign bit cleared
    b"21": 1173551340,
    b"foobar": 1357151166,
    b"a-little-bit-long-string": 1161502112,
    b"a-little-bit-longer-string": 661178819,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": 2088585677,
    b"abc": 479470107,
}


@pytest.mark.parametrize(("key", "expected"), KEY_HASHES.items())
def test_key_hash_is_the_java_clients_positive_hash(key: bytes, expected: int) -> None:
    """``key_hash`` is the Java client's ``toPositive(murmur2(key))``: the hash with its sign bit cleared, nothing more."""
    assert expected == JAVA_MURMUR2[key] & 0x7FFFFFFF
    assert key_hash(key) == expected


def test_key_partitioner_places_keys_as_owner_partition_does() -> None:
    """The worker's partitioner gives owner_partition's answer for any key and count."""
    partitioner = KeyPartitioner()
    for key in (b"k1", b"k2", b"k3", b"k1"):
        for count in (1, 4, 12):
            assert partitioner(key, count) == owner_partition(key, count)


async def test_transactional_producers_retry_a_concurrent_transaction_after_5_ms(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Making a transactional producer shortens aiokafka's 20 ms CONCURRENT_TRANSACTIONS wait to 5 ms."""
    assert hasattr(sender, "BACKOFF_OVERRIDE"), "aiokafka no longer has the constant: revisit clients.py"
    monkeypatch.setattr(sender, "BACKOFF_OVERRIDE", 0.02)  # aiokafka's own, whatever ran before
    settings = WorkerSettings(bootstrap="127.0.0.1:1", topology=tmp_path / "t.toml", state_dir=tmp_path)
    producer = transactional_producer(settings, "t-1")
    try:
        assert sender.BACKOFF_OVERRIDE == CONCURRENT_TXN_RETRY_S
    finally:
        await producer.stop()  # never started: only its client is closed (no ResourceWarning)


@pytest.mark.parametrize("check", [False, True])
async def test_the_worker_consumer_checks_crcs_as_configured(tmp_path: Path, *, check: bool) -> None:
    """``check_crcs`` reaches the worker's consumer, whose fetcher checks each batch's CRC32C only when on."""
    settings = WorkerSettings(
        bootstrap="127.0.0.1:1", topology=tmp_path / "t.toml", state_dir=tmp_path, check_crcs=check
    )
    consumer = worker_consumer(settings)
    try:
        assert consumer._check_crcs is check
    finally:
        await consumer.stop()  # never started: only its client is closed (no ResourceWarning)


def test_the_worker_does_not_check_crcs_by_default(tmp_path: Path) -> None:
    """Off unless asked for, as in librdkafka: the broker has checked every batch on produce."""
    settings = WorkerSettings(bootstrap="127.0.0.1:1", topology=tmp_path / "t.toml", state_dir=tmp_path)
    assert settings.check_crcs is False
