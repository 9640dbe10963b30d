"""``vigil consume``: read topics the way kcat and kafka-console-consumer do.

The consumer is assigned its partitions directly (no group membership, no commits): reading a
topic never moves anyone's offsets. Where to start is one of: the end (default), the
beginning, an offset (absolute, or the last N of each partition), or a time (the first record
at or after it; record timestamps are event times, so this is event time). Filters on the key
and on headers drop records before ``--max`` counts them.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from streams.cli.errors import BadArgument, KafkaUnreachable, UnknownTopic
from streams.kafka.clients import ConsumedRecord
from streams.settings import Settings

StartKind = Literal["beginning", "end", "offset", "last", "time"]


@dataclass(frozen=True, slots=True)
class Start:
    """Where each assigned partition is read from."""

    kind: StartKind
    #: offset (``offset``), count (``last``) or epoch milliseconds (``time``)
    value: int = 0


_OFFSET_WORDS: dict[str, StartKind] = {
    "beginning": "beginning",
    "earliest": "beginning",
    "end": "end",
    "latest": "end",
}
OFFSET_HELP = "beginning, end, N (that offset of each partition) or -N (the last N records)"


def parse_offset(text: str) -> Start:
    """An ``--offset`` value, or ``BadArgument`` saying what is allowed."""
    value = text.strip().lower()
    if value in _OFFSET_WORDS:
        return Start(_OFFSET_WORDS[value])
    if re.fullmatch(r"\d+", value):
        return Start("offset", int(value))
    if re.fullmatch(r"-\d+", value):
        return Start("last", int(value[1:]))
    raise BadArgument(f"--offset {text!r} is not an offset; allowed: {OFFSET_HELP}")


def parse_header_filters(values: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """``k=v`` pairs of ``--header``; every one must match (a header's value compared as text)."""
    pairs = []
    for value in values:
        name, sep, wanted = value.partition("=")
        if not sep or not name:
            raise BadArgument(f"--header {value!r} is not NAME=VALUE, e.g. owner=RUNTIME_OWNER")
        pairs.append((name, wanted))
    return tuple(pairs)


def matches(
    key: str | None,
    headers: dict[str, str],
    key_filter: str | None,
    header_filters: tuple[tuple[str, str], ...],
) -> bool:
    """Whether a record passes the filters: its key equals ``key_filter`` (when given) and
    each header filter names a header it has, with that value."""
    if key_filter is not None and key != key_filter:
        return False
    return all(headers.get(name) == wanted for name, wanted in header_filters)


def start_from(
    *,
    from_beginning: bool,
    offset: str | None,
    from_time: datetime | None,
) -> Start:
    """The start position the options ask for; at most one of them may be given."""
    given = [
        name
        for name, on in (
            ("--from-beginning", from_beginning),
            ("--offset", offset is not None),
            ("--from-time", from_time is not None),
        )
        if on
    ]
    if len(given) > 1:
        raise BadArgument(f"give one of {', '.join(given)}, not both: each says where to start")
    if from_beginning:
        return Start("beginning")
    if offset is not None:
        return parse_offset(offset)
    if from_time is not None:
        return Start("time", int(from_time.timestamp() * 1000))
    return Start("end")


def resolve(start: Start, low: int, high: int, at_time: int | None = None) -> int:
    """The offset to read a partition from, given its low and high watermarks (and, for a
    time, the offset the broker found for it: -1 when no record is that late). Offsets outside
    the partition are clamped into it, so that a read never silently jumps elsewhere."""
    if start.kind == "beginning":
        return low
    if start.kind == "end":
        return high
    if start.kind == "offset":
        return min(max(start.value, low), high)
    if start.kind == "last":
        return max(high - start.value, low)
    return high if at_time is None or at_time < 0 else min(max(at_time, low), high)


def _quiet(debug: bool) -> dict[str, Any]:
    """librdkafka logs connection failures to stderr itself; the CLI says them in one line."""
    return {} if debug else {"log_level": 0}


def cluster_topics(settings: Settings, *, timeout: float, debug: bool = False) -> dict[str, int]:
    """Topic name → partition count on the cluster, or ``KafkaUnreachable``."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(settings.confluent_conf() | _quiet(debug))
    try:
        meta = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise KafkaUnreachable(
            f"cannot reach the Kafka broker at {settings.bootstrap_servers} within {timeout:g} s "
            f"({exc.args[0].str() if exc.args else exc}); set KAFKA_BOOTSTRAP_SERVERS or "
            "--bootstrap"
        ) from exc
    return {name: len(t.partitions) for name, t in meta.topics.items()}


def require_topics(settings: Settings, names: Sequence[str], existing: dict[str, int]) -> None:
    """``UnknownTopic`` for the first of ``names`` that the cluster does not have, listing the
    deployment's topics that it does have."""
    for name in names:
        if name not in existing:
            prefix = f"{settings.topic_prefix}."
            ours = sorted(t for t in existing if t.startswith(prefix))
            shown = ours[:30] + ([f"… {len(ours) - 30} more"] if len(ours) > 30 else [])
            where = (
                f"not on the cluster at {settings.bootstrap_servers}; "
                "`vigil topics create` creates vigil's"
            )
            raise UnknownTopic(name, shown, where)


def read(
    settings: Settings,
    codec: Any,
    topics: Sequence[str],
    *,
    start: Start,
    partitions: Sequence[int] = (),
    follow: bool = False,
    max_records: int | None = None,
    idle_timeout: float = 5.0,
    key_filter: str | None = None,
    header_filters: tuple[tuple[str, str], ...] = (),
    connect_timeout: float = 10.0,
    debug: bool = False,
) -> Iterator[ConsumedRecord]:
    """The records of ``topics`` that pass the filters, decoded (a record that cannot be
    decoded comes with ``error`` set), until ``max_records`` passed, or nothing arrived for
    ``idle_timeout`` seconds (never, with ``follow``)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    from streams.contracts.codec import DecodeError

    existing = cluster_topics(settings, timeout=connect_timeout, debug=debug)
    require_topics(settings, topics, existing)
    for topic in topics:
        for p in partitions:
            if not 0 <= p < existing[topic]:
                raise BadArgument(
                    f"--partition {p}: {topic} has partitions 0..{existing[topic] - 1}"
                )
    conf = (
        settings.confluent_conf()
        | {
            "group.id": "vigil-cli-reader",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
        | _quiet(debug)
    )
    consumer = Consumer(conf)
    try:
        tps = [TopicPartition(t, p) for t in topics for p in (partitions or range(existing[t]))]
        found: dict[tuple[str, int], int] = {}
        if start.kind == "time":
            asked = [TopicPartition(tp.topic, tp.partition, start.value) for tp in tps]
            for tp in consumer.offsets_for_times(asked, timeout=connect_timeout):
                found[(tp.topic, tp.partition)] = tp.offset
        assigned = []
        for tp in tps:
            low, high = consumer.get_watermark_offsets(tp, timeout=connect_timeout)
            offset = resolve(start, low, high, found.get((tp.topic, tp.partition)))
            assigned.append(TopicPartition(tp.topic, tp.partition, offset))
        consumer.assign(assigned)
        passed = 0
        last = time.monotonic()
        while max_records is None or passed < max_records:
            msg = consumer.poll(0.2)
            if msg is None:
                if not follow and time.monotonic() - last > idle_timeout:
                    return
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaUnreachable(f"reading {msg.topic()}: {msg.error().str()}")
            last = time.monotonic()
            key = msg.key().decode(errors="replace") if msg.key() is not None else None
            headers = {k: (v.decode(errors="replace") if v else "") for k, v in msg.headers() or []}
            if not matches(key, headers, key_filter, header_filters):
                continue
            passed += 1
            try:
                record, error = codec.decode(msg.topic(), msg.value()), None
            except DecodeError as exc:
                record, error = None, str(exc)
            yield ConsumedRecord(
                topic=msg.topic(),
                partition=msg.partition(),
                offset=msg.offset(),
                timestamp_ms=msg.timestamp()[1],
                key=key,
                headers=headers,
                record=record,
                error=error,
                raw=msg.value(),
            )
    finally:
        consumer.close()
