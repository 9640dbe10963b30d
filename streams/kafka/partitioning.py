"""Which partition a key lives in, computed the way the producers and Faust compute it.

Kafka's default partitioner (the Java client's, aiokafka's, and librdkafka's
``murmur2_random``, which our confluent-kafka producers are configured with) is murmur2 over
the key bytes. The worker uses the same function to know which partition's stream time
governs a table entry, and asks it several times per record (an input's execution, the
schedule of its deadlines, the claims it publishes), so the function is written for speed:
the key's whole 32-bit words are read in one ``struct`` call instead of byte by byte, and the
answers for recent keys are remembered (a bounded cache: an execution's records come close
together).
"""

from __future__ import annotations

import struct
from functools import lru_cache

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF
_unpack_from = struct.unpack_from

#: Keys whose partition is remembered: a fixed cost of 2 to 3 MiB (the keys it keeps alive
#: included), whatever the number of executions in flight, and enough to cover the records
#: that come close together.
CACHED_KEYS = 16_384


def murmur2(data: bytes) -> int:
    """MurmurHash2 of ``data`` as Kafka computes it (``Utils.murmur2``), unsigned 32-bit."""
    length = len(data)
    h = _SEED ^ length
    words = length >> 2
    if words:
        for k in _unpack_from(f"<{words}I", data):
            k = (k * _M) & _MASK
            k ^= k >> 24
            h = ((h * _M) & _MASK) ^ ((k * _M) & _MASK)
    tail = length & 3
    if tail:
        base = length - tail
        if tail == 3:
            h ^= data[base + 2] << 16
        if tail >= 2:
            h ^= data[base + 1] << 8
        h = ((h ^ data[base]) * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    return h ^ (h >> 15)


@lru_cache(maxsize=CACHED_KEYS)
def partition_of(key: str, partitions: int) -> int:
    """The partition of ``partitions`` that Kafka's default partitioner gives ``key``."""
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions
