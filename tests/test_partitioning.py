"""The partitioner: Kafka's murmur2, byte for byte.

Every table entry, timer and claim is placed by ``partition_of``; a key it places differently
from the producers would have its state governed by the wrong partition's stream time. The
Java client's own test vectors (``UtilsTest.testMurmur2``) pin the function, and hypothesis
holds it equal to aiokafka's reference implementation (the byte-by-byte port of the Java one)
on any bytes, every tail length included. That the producers agree is the real-broker tests'
(tests/test_worker_kafka.py).
"""

from __future__ import annotations

from aiokafka.partitioner import murmur2 as reference_murmur2
from hypothesis import given
from hypothesis import strategies as st

from streams.kafka.partitioning import murmur2, partition_of

#: Kafka's ``UtilsTest.testMurmur2`` (signed 32-bit results there).
JAVA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


def test_the_java_clients_vectors() -> None:
    for data, signed in JAVA_VECTORS.items():
        assert murmur2(data) == signed & 0xFFFFFFFF, data


@given(st.binary(max_size=80))
def test_equal_to_the_reference_on_any_bytes(data: bytes) -> None:
    assert murmur2(data) == reference_murmur2(data)


@given(st.text(max_size=60), st.integers(min_value=1, max_value=64))
def test_partition_of_is_the_default_partitioners(key: str, partitions: int) -> None:
    expected = (reference_murmur2(key.encode()) & 0x7FFFFFFF) % partitions
    assert partition_of(key, partitions) == expected
    assert partition_of(key, partitions) == expected  # remembered, the same answer


def test_every_tail_length() -> None:
    base = bytes(range(1, 40))
    for n in range(len(base)):
        assert murmur2(base[:n]) == reference_murmur2(base[:n])
