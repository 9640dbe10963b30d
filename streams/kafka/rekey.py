"""Carry a compacted ``<p>.operation-state`` topic over to scoped keys (``vigil topics rekey``).

Before issue 26 the topic was keyed by the operation id alone; it is keyed by
``scoped_key(execution_id, operation_id)`` now (docs/rules.md#ids-and-keys). A new worker
writes every state under its new key, but an operation that does not change after the upgrade
would keep its last state under the old key for ever, and compaction keeps that stale record
next to the new one once it changes. So the upgrade carries the topic over once, with the old
workers stopped and before the new ones start (topology.md, "Moving to scoped keys"):

- each operation's last state written under an old key is written again under its new key,
  unchanged (same value bytes, same timestamp), unless a state is already there;
- each old key then gets a tombstone, in the partition its records are in, so compaction
  deletes them.

Two executions whose operations shared an id also shared the old key: every state the log
still holds is carried over, by the execution and operation the record itself names, not by
its key; what compaction had already deleted is gone (the next change of that operation
publishes it again under its new key).

``plan`` decides, from the log as read, what to write: a pure function. ``rekey`` reads the
topic to its end and writes the plan. Running it again finds nothing to do. Records that
cannot be decoded are left as they are and counted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from streams.contracts.keys import scoped_key


@dataclass(frozen=True, slots=True)
class Read:
    """One record of the topic, in log order within its partition: its key, value bytes
    (None: a tombstone) and timestamp, and the execution and operation its value names (None:
    a tombstone, or a value that could not be decoded)."""

    partition: int
    key: str | None
    value: bytes | None
    timestamp_ms: int
    ids: tuple[str, str] | None


@dataclass(frozen=True, slots=True)
class Copy:
    """A state written again under its scoped key."""

    key: str
    value: bytes
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class Tombstone:
    key: str
    partition: int


@dataclass
class Plan:
    copies: list[Copy] = field(default_factory=list)
    tombstones: list[Tombstone] = field(default_factory=list)
    #: keys whose last record is a state under its scoped key: nothing to do
    scoped: int = 0
    #: records whose value could not be decoded (left alone)
    unreadable: int = 0
    #: records read
    read: int = 0

    def summary(self) -> dict[str, int]:
        return {
            "read": self.read,
            "carried_over": len(self.copies),
            "tombstoned": len(self.tombstones),
            "already_scoped": self.scoped,
            "unreadable": self.unreadable,
        }


def plan(records: Iterable[Read]) -> Plan:
    """What to write so that every state sits under its scoped key and no old key is left
    with a value. A key is old when its last record is a state whose key is not the scoped
    key of the execution and operation it names (an operation id alone; one that merely looks
    like a scoped key is told apart by its value)."""
    out = Plan()
    last_of_key: dict[str, Read] = {}
    #: per (execution, operation): the last state written under an old key
    last_old: dict[tuple[str, str], Read] = {}
    for r in records:
        out.read += 1
        if r.key is None:
            continue
        if r.value is not None and r.ids is None:
            out.unreadable += 1
        last_of_key[r.key] = r
        if r.ids is not None and r.key != scoped_key(*r.ids):
            last_old[r.ids] = r
    live_scoped: set[str] = set()
    for key, r in last_of_key.items():
        if r.value is None or r.ids is None:
            continue
        if key == scoped_key(*r.ids):
            live_scoped.add(key)
            out.scoped += 1
        else:
            out.tombstones.append(Tombstone(key, r.partition))
    old_keys = {t.key for t in out.tombstones}
    for ids, r in last_old.items():
        new = scoped_key(*ids)
        # Only from a key still old (not carried over by an earlier run), never over a state
        # a new worker wrote.
        if r.key in old_keys and new not in live_scoped:
            assert r.value is not None
            out.copies.append(Copy(new, r.value, r.timestamp_ms))
    # An old key that is also the scoped key of another operation (an operation id that
    # looks like one) gets that operation's copy, which replaces it: no tombstone there.
    targets = {c.key for c in out.copies}
    out.tombstones = [t for t in out.tombstones if t.key not in targets]
    out.copies.sort(key=lambda c: c.key)
    out.tombstones.sort(key=lambda t: (t.partition, t.key))
    return out


def read_topic(settings: Any, codec: Any, topic: str) -> list[Read]:
    """Every record of ``topic`` up to its end when called, in log order per partition."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    from streams.contracts.codec import DecodeError

    consumer = Consumer(
        settings.confluent_conf()
        | {"group.id": "vigil-rekey", "enable.auto.commit": False, "enable.partition.eof": True}
    )
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        if meta.error is not None:
            raise KeyError(f"topic {topic} does not exist")
        ends = {}
        for p in meta.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if high > low:
                ends[p] = high
        consumer.assign([TopicPartition(topic, p, -2) for p in ends])
        out: list[Read] = []
        while ends:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    ends.pop(msg.partition(), None)
                    continue
                raise RuntimeError(str(msg.error()))
            p = msg.partition()
            if p not in ends:
                continue
            value, key = msg.value(), msg.key()
            ids = None
            if value is not None:
                try:
                    record = codec.decode(topic, value)
                    ids = (record.execution_id, record.operation_id)
                except (DecodeError, AttributeError):
                    ids = None
            out.append(
                Read(
                    p,
                    None if key is None else key.decode(errors="surrogateescape"),
                    value,
                    msg.timestamp()[1],
                    ids,
                )
            )
            if msg.offset() + 1 >= ends[p]:
                del ends[p]
        return out
    finally:
        consumer.close()


def rekey(settings: Any, codec: Any, *, dry_run: bool = False) -> Plan:
    """Read the deployment's operation-state topic and write the plan (copies first, then
    the tombstones), waiting for the broker to have them all."""
    from confluent_kafka import Producer

    from streams.kafka.topics import Topics

    topic = Topics.from_settings(settings).operation_state.name
    todo = plan(read_topic(settings, codec, topic))
    if dry_run or not (todo.copies or todo.tombstones):
        return todo
    errors: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    producer = Producer(
        settings.confluent_conf() | {"partitioner": "murmur2_random", "enable.idempotence": True}
    )
    for c in todo.copies:
        key = c.key.encode()  # a scoped key is ASCII: every other character is escaped
        producer.produce(
            topic, key=key, value=c.value, timestamp=c.timestamp_ms, on_delivery=delivered
        )
    if producer.flush(60) or errors:
        raise RuntimeError(f"carrying states over failed: {errors[:3]}")
    for t in todo.tombstones:
        producer.produce(
            topic,
            key=t.key.encode(errors="surrogateescape"),
            value=None,
            partition=t.partition,
            on_delivery=delivered,
        )
    if producer.flush(60) or errors:
        raise RuntimeError(f"tombstones failed: {errors[:3]}")
    return todo
