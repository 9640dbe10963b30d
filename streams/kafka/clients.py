"""Producing and consuming contract records with confluent-kafka (worker outputs, CLI, tests).

Producers use the murmur2 partitioner: aiokafka (under Faust) hashes keys with murmur2 like the
Java client, while librdkafka defaults to CRC32; disagreeing would split an execution's events
across partitions and break co-partitioning.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from streams.contracts.codec import AvroCodec, DecodeError
from streams.contracts.models.base import Record
from streams.contracts.models.events import ClockTick
from streams.engine.emission import Emission, record_time_ms
from streams.settings import Settings


class DeliveryFailed(RuntimeError):
    """Records the broker refused: ``failed`` holds (topic, value, error) of each, so that the
    caller can tell which of its inputs they came from."""

    def __init__(self, message: str, failed: list[tuple[str, bytes | None, str]]) -> None:
        super().__init__(message)
        self.failed = failed


class RecordProducer:
    """Avro producer whose record timestamp is the event time, never the send time."""

    def __init__(self, settings: Settings, codec: AvroCodec, **extra: Any) -> None:
        conf = settings.confluent_conf() | {
            "partitioner": "murmur2_random",
            "enable.idempotence": True,
            "linger.ms": 5,
            # a delivery report only for a record the broker refused: a Python callback per
            # record delivered costs the event loop's thread (it needs the GIL) for nothing
            "delivery.report.only.error": True,
        }
        conf.update(extra)
        self.producer = Producer(conf)
        self.codec = codec
        self.errors: list[str] = []
        #: (topic, value, error) of every record the broker refused since the last flush
        self.failed: list[tuple[str, bytes | None, str]] = []

    def _on_delivery(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self.errors.append(str(err))
            self.failed.append((msg.topic(), msg.value(), str(err)))

    def send(
        self,
        topic: str,
        record: Record,
        *,
        key: str | None = None,
        partition: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        key = key if key is not None else record.kafka_key()
        if partition is None and isinstance(record, ClockTick):
            # A tick has no key to hash: it goes to the partition it names, the one whose
            # stream time it moves.
            partition = record.partition
        kwargs: dict[str, Any] = {}
        if partition is not None:
            kwargs["partition"] = partition
        ts = record_time_ms(record)
        if ts is not None:
            kwargs["timestamp"] = ts
        if headers:
            kwargs["headers"] = list(headers.items())
        self.producer.produce(
            topic,
            key=key.encode() if key is not None else None,
            value=self.codec.encode(topic, record),
            on_delivery=self._on_delivery,
            **kwargs,
        )
        self.producer.poll(0)

    def send_encoded(
        self,
        topic: str,
        key: bytes | None,
        value: bytes,
        timestamp_ms: int | None,
        headers: list[tuple[str, bytes]] | None,
        partition: int | None = None,
    ) -> None:
        """An already encoded record; waits for room when librdkafka's queue is full."""
        kwargs: dict[str, Any] = {}
        if partition is not None:
            kwargs["partition"] = partition
        if timestamp_ms is not None:
            kwargs["timestamp"] = timestamp_ms
        if headers:
            kwargs["headers"] = headers
        while True:
            try:
                self.producer.produce(
                    topic, value=value, key=key, on_delivery=self._on_delivery, **kwargs
                )
                return
            except BufferError:
                self.producer.poll(0.05)

    def send_emission(self, em: Emission, value: bytes | None = None) -> bytes:
        """One output of the processor (worker and replay alike): encoded, keyed, stamped with
        its event time, its headers as bytes. Returns the value as sent. ``value``: the record
        already encoded (one record sent to several partitions is encoded once)."""
        if value is None:
            value = self.codec.encode(em.topic, em.record)
        self.send_encoded(
            em.topic,
            em.key.encode() if em.key is not None else None,
            value,
            em.timestamp_ms,
            [(k, v.encode()) for k, v in em.headers] or None,
            em.partition,
        )
        return value

    def tick(self, topic: str, partitions: int, at: Any, ticker_id: str) -> None:
        """One clock tick into every partition of ``topic``."""
        for p in range(partitions):
            self.send(
                topic,
                ClockTick(ticker_id=ticker_id, partition=p, occurred_at=at),
                key=None,
                partition=p,
            )

    def flush(self, timeout: float = 30.0) -> None:
        remaining = self.producer.flush(timeout)
        if remaining:
            raise RuntimeError(f"{remaining} records not delivered within {timeout}s")
        if self.errors:
            errors, self.errors = self.errors, []
            failed, self.failed = self.failed, []
            raise DeliveryFailed(f"delivery failed: {errors[:3]}", failed)


@dataclass(frozen=True, slots=True)
class ConsumedRecord:
    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: str | None
    headers: dict[str, str]
    record: Record | None
    error: str | None
    raw: bytes | None


def consume(
    settings: Settings,
    codec: AvroCodec,
    topics: list[str],
    *,
    from_beginning: bool = True,
    max_records: int | None = None,
    idle_timeout: float = 5.0,
    group_id: str | None = None,
) -> Iterator[ConsumedRecord]:
    """Read records until ``max_records`` or until nothing arrives for ``idle_timeout``.

    Without a group id the consumer is assigned every partition directly (no group, no
    commits): reading a topic must not disturb anyone's offsets.
    """
    import time

    conf = settings.confluent_conf() | {
        "group.id": group_id or "vigil-cli-reader",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest" if from_beginning else "latest",
    }
    c = Consumer(conf)
    try:
        meta = c.list_topics(timeout=10)
        tps = []
        for t in topics:
            if t not in meta.topics:
                raise KeyError(f"topic {t} does not exist")
            for p in meta.topics[t].partitions:
                tps.append(TopicPartition(t, p, -2 if from_beginning else -1))
        c.assign(tps)
        seen = 0
        last = time.monotonic()
        while max_records is None or seen < max_records:
            msg = c.poll(0.2)
            if msg is None:
                if time.monotonic() - last > idle_timeout:
                    return
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    continue
                raise RuntimeError(str(msg.error()))
            last = time.monotonic()
            seen += 1
            headers = {k: (v.decode() if v else "") for k, v in (msg.headers() or [])}
            try:
                rec: Record | None = codec.decode(msg.topic(), msg.value())
                err = None
            except DecodeError as exc:
                rec, err = None, str(exc)
            yield ConsumedRecord(
                topic=msg.topic(),
                partition=msg.partition(),
                offset=msg.offset(),
                timestamp_ms=msg.timestamp()[1],
                key=msg.key().decode(errors="replace") if msg.key() is not None else None,
                headers=headers,
                record=rec,
                error=err,
                raw=msg.value(),
            )
    finally:
        c.close()
