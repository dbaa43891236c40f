"""The Java client's default partitioner (murmur2), so every client agrees where a key lives.

Pure: no broker, no aiokafka.
"""

from __future__ import annotations

import struct

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (``org.apache.kafka.common.utils.Utils.murmur2``) as an unsigned 32-bit int.

    The same hash as ``aiokafka.partitioner.murmur2``, about twice as fast: the
    4-byte words are unpacked in one call instead of byte by byte.
    """
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    words = length >> 2
    for word in struct.unpack_from(f"<{words}I", data):
        k = (word * _M) & _MASK
        k ^= k >> 24
        h = ((h * _M) & _MASK) ^ ((k * _M) & _MASK)
    tail = length & 3
    if tail:
        i = words << 2
        if tail == 3:
            h ^= data[i + 2] << 16
        if tail >= 2:
            h ^= data[i + 1] << 8
        h ^= data[i]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    return h ^ (h >> 15)


def owner_partition(key: bytes, partitions: int) -> int:
    """The partition the Java client's default partitioner gives ``key`` (murmur2)."""
    return int(murmur2(key) & 0x7FFFFFFF) % partitions


class KeyPartitioner:
    """:func:`owner_partition` that hashes each key once.

    A record's key is placed on the input, audit, command and changelog topics;
    murmur2 in pure Python is the costliest step of that, so recent hashes are
    kept (bounded; cleared when full).
    """

    def __init__(self, max_keys: int = 65_536) -> None:
        self._hashes: dict[bytes, int] = {}
        self._max_keys = max_keys

    def __call__(self, key: bytes, partitions: int) -> int:
        """The partition of ``key`` among ``partitions``."""
        hashed = self._hashes.get(key)
        if hashed is None:
            if len(self._hashes) >= self._max_keys:
                self._hashes.clear()
            hashed = self._hashes[key] = int(murmur2(key) & 0x7FFFFFFF)
        return hashed % partitions
