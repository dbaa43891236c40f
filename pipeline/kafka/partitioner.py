"""The Java client's default partitioner (murmur2), so every client agrees where a key lives.

Pure: no broker, no aiokafka. The hash itself comes from the ``murmurhash2``
package (compiled, so much cheaper per key than a Python murmur2; ``bench/hotpath.py``), seeded
as ``org.apache.kafka.common.utils.Utils.murmur2`` is; the Java client's own
test vectors check it (``tests/unit/kafka/test_partitioner.py``).
"""

from __future__ import annotations

from murmurhash2 import murmurhash2 as _murmurhash2

KAFKA_SEED = 0x9747B28C  # the seed Kafka's murmur2 uses


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (``org.apache.kafka.common.utils.Utils.murmur2``) as an unsigned 32-bit int."""
    return _murmurhash2(data, KAFKA_SEED)


def key_hash(key: bytes) -> int:
    """The non-negative hash the default partitioner takes modulo the partition count."""
    return _murmurhash2(key, KAFKA_SEED) & 0x7FFFFFFF


def owner_partition(key: bytes, partitions: int) -> int:
    """The partition the Java client's default partitioner gives ``key`` (murmur2)."""
    return (_murmurhash2(key, KAFKA_SEED) & 0x7FFFFFFF) % partitions


class KeyPartitioner:
    """:func:`owner_partition` as a callable the worker passes around (one per worker)."""

    def __call__(self, key: bytes, partitions: int) -> int:
        """The partition of ``key`` among ``partitions``."""
        return (_murmurhash2(key, KAFKA_SEED) & 0x7FFFFFFF) % partitions
