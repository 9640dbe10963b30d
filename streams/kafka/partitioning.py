"""Which partition a key lives in, computed the way the producers and Faust compute it.

aiokafka's default partitioner is murmur2 over the key bytes, like the Java client; our
confluent-kafka producers are configured with ``murmur2_random`` to agree. The worker uses the
same function to know which partition's stream time governs a table entry.
"""

from __future__ import annotations

from aiokafka.partitioner import murmur2


def partition_of(key: str, partitions: int) -> int:
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions
