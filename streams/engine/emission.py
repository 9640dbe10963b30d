"""What the worker publishes: one output record with its topic, key and headers.

Its own module so that the producer (``streams/kafka/clients.py``) and the processor that makes the
emissions can both use it without importing each other.
"""

from __future__ import annotations

from typing import NamedTuple

from streams.contracts.models.base import Record


def record_time_ms(record: Record) -> int | None:
    """The Kafka timestamp of a record: its event time (see ``Record.time_field``)."""
    value = getattr(record, record.time_field, None) if record.time_field else None
    return int(value.timestamp() * 1000) if value is not None else None


class Emission(NamedTuple):
    """An output record, the topic it goes to, its Kafka key and headers. A named tuple:
    one is made per output, and it is the cheapest immutable record to build."""

    topic: str
    key: str | None
    record: Record
    headers: tuple[tuple[str, str], ...] = ()
    #: the partition to write to, for a record with no key to hash (``ClaimsProgress``,
    #: written to every partition); None: murmur2 of the key
    partition: int | None = None

    @property
    def timestamp_ms(self) -> int | None:
        return record_time_ms(self.record)
