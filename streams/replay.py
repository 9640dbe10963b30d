"""Replays for backfills: re-process the input topics from a time, with fresh state, into a
separate set of output topics.

The replay runs the very ``Processor`` the worker runs, in this process, with plain dicts as
tables. Because the processor holds events until the watermark passes them and then works in
event-time order, the replay's outputs are the live run's outputs — same ids, same contents,
same order per key — whatever order this reader happens to read the partitions in.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime

from confluent_kafka import Consumer, KafkaError, TopicPartition
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from streams.admin import create_topics
from streams.clients import RecordProducer
from streams.codec import AvroCodec
from streams.envelope import Envelope, open_envelope
from streams.models.events import ClockTick
from streams.processor import Emission, Processor, Stores
from streams.settings import Settings
from streams.topics import Topics


@dataclass
class ReplaySummary:
    records_read: int = 0
    outputs_written: int = 0
    outputs_by_topic: dict[str, int] = field(default_factory=dict)
    anomalies: int = 0
    dead_letters: int = 0
    held: int = 0
    seconds: float = 0.0
    output_topics: tuple[str, ...] = ()


def _ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


#: records between two writes of the replay's state from its cache to its (in-memory) tables.
#: An execution's entry is parsed and serialized once per interval, however many of its
#: records fall in it: 20,000 replays 15 % faster than 2,000 (BENCHMARKS.md, step 3); the
#: cache holds at most the executions of one interval.
REPLAY_FLUSH_EVERY = 20_000


def run_replay(
    settings: Settings,
    codec: AvroCodec,
    start: datetime,
    end: datetime | None = None,
    output_suffix: str = "-replay",
    show_progress: bool = True,
) -> ReplaySummary:
    """Replay ``[start, end)``; without ``end``, up to the log end as of the start."""
    if not output_suffix:
        raise ValueError("a replay needs an output suffix: it must not write to the live outputs")
    began = time.monotonic()
    inputs = Topics.from_settings(settings)
    out_settings = replace(settings, output_suffix=output_suffix)
    outputs = Topics.from_settings(out_settings)
    create_topics(out_settings, outputs.outputs())
    # Write-behind with a flush every few thousand records: each execution's state is parsed
    # and dumped once per flush, not once per record (nothing is redelivered in a replay).
    processor = Processor.from_settings(out_settings, outputs, Stores(), write_behind=True)
    allowed = {t.name: t.value_types for t in inputs.inputs()}
    producer = RecordProducer(out_settings, codec)
    summary = ReplaySummary(output_topics=tuple(t.name for t in outputs.outputs()))

    consumer = Consumer(
        settings.confluent_conf()
        | {
            "group.id": f"vigil-replay-{uuid.uuid4().hex[:8]}",  # never commits: assign only
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        wanted = [
            TopicPartition(t.name, p, _ms(start))
            for t in inputs.inputs()
            for p in range(t.partitions)
        ]
        found = consumer.offsets_for_times(wanted, timeout=30)
        assignment: list[TopicPartition] = []
        remaining: dict[tuple[str, int], int] = {}
        for tp in found:
            _, high = consumer.get_watermark_offsets(
                TopicPartition(tp.topic, tp.partition), timeout=30
            )
            if tp.offset < 0 or tp.offset >= high:
                continue  # nothing at or after the start time
            assignment.append(tp)
            remaining[(tp.topic, tp.partition)] = high
        total = sum(
            high - tp.offset for tp, high in zip(assignment, remaining.values(), strict=True)
        )
        consumer.assign(assignment)

        def emit(emissions: list[Emission]) -> None:
            for em in emissions:
                producer.send(em.topic, em.record, key=em.key, headers=dict(em.headers) or None)
                summary.outputs_written += 1
                summary.outputs_by_topic[em.topic] = summary.outputs_by_topic.get(em.topic, 0) + 1

        with Progress(
            TextColumn("replay"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            disable=not show_progress,
        ) as bar:
            task = bar.add_task("records", total=total)
            while remaining:
                msg = consumer.poll(1.0)
                if msg is None:
                    continue
                tp = (msg.topic(), msg.partition())
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        remaining.pop(tp, None)
                        continue
                    raise RuntimeError(str(msg.error()))
                if tp not in remaining:
                    continue
                if msg.offset() >= remaining[tp] - 1:
                    remaining.pop(tp)
                ts = msg.timestamp()[1]
                if end is not None and ts >= _ms(end):
                    remaining.pop(tp, None)  # this partition has reached the end time
                    continue
                env = open_envelope(
                    codec,
                    allowed,
                    msg.topic(),
                    msg.partition(),
                    msg.offset(),
                    ts,
                    msg.key(),
                    msg.value(),
                )
                summary.records_read += 1
                emit(processor.handle(env))
                processor.drain_done()
                if summary.records_read % REPLAY_FLUSH_EVERY == 0:
                    processor.flush()
                    processor.flush_clocks()
                bar.advance(task)
        if end is not None:
            # Decide everything before the end time: the end is data the operator gave, the
            # same for every replay of this range.
            for spec in inputs.inputs():
                for p in range(spec.partitions):
                    tick = ClockTick(ticker_id="replay-end", partition=p, occurred_at=end)
                    emit(
                        processor.handle(
                            Envelope(spec.name, p, -1, _ms(end), None, None, tick, None)
                        )
                    )
        processor.flush()
        processor.flush_clocks()
        producer.flush()
    finally:
        consumer.close()
    summary.anomalies = sum(processor.counters.anomalies.values())
    summary.dead_letters = processor.counters.dead_letters
    summary.held = processor.held()
    summary.seconds = time.monotonic() - began
    return summary
