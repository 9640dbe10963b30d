"""Replays for backfills: re-process the input topics from a time, with fresh state, into a
separate set of output topics.

The replay runs the very ``Processor`` the worker runs, with plain dicts as tables. Because
the processor holds events until the watermark passes them and then works in event-time order,
the replay's outputs are the live run's outputs — same ids, same contents, same order per key —
whatever order this reader happens to read the partitions in.

Why several processes: the inputs are co-partitioned by execution id, and the processor keeps
its stream time and its state per partition, so partition ``p`` of every input topic is a
replay of its own. ``processes`` child processes each replay a share of the partitions: one
Python process is bound by one core, and a backfill should use the machine. The outputs are the
same: every key lives in one partition, hence in one process, and keeps its order.
"""

from __future__ import annotations

import multiprocessing as mp
import time
import traceback
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from streams.contracts.codec import AvroCodec
from streams.contracts.envelope import Envelope, open_envelope
from streams.contracts.models.events import ClockTick
from streams.engine import flow
from streams.engine.processor import Emission, Processor, Stores
from streams.kafka.admin import create_topics, prepare_registry
from streams.kafka.clients import RecordProducer
from streams.kafka.topics import Topics
from streams.local_join import LocalJoin, route
from streams.settings import Settings


@dataclass
class ReplaySummary:
    records_read: int = 0
    outputs_written: int = 0
    outputs_by_topic: dict[str, int] = field(default_factory=dict)
    anomalies: int = 0
    dead_letters: int = 0
    held: int = 0
    #: retry links the in-process claims join decided (blind retries across executions)
    retry_links: int = 0
    #: whether the replay ran the claims join (one process replaying every partition)
    joined: bool = False
    seconds: float = 0.0
    output_topics: tuple[str, ...] = ()
    processes: int = 1

    def add(self, other: ReplaySummary) -> None:
        """Fold in the summary of another share of the partitions."""
        self.records_read += other.records_read
        self.outputs_written += other.outputs_written
        for topic, n in other.outputs_by_topic.items():
            self.outputs_by_topic[topic] = self.outputs_by_topic.get(topic, 0) + n
        self.anomalies += other.anomalies
        self.dead_letters += other.dead_letters
        self.held += other.held
        self.retry_links += other.retry_links


def _ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


#: records between two writes of the replay's state from its cache to its (in-memory) tables.
#: An execution's entry is parsed and serialized once per interval, however many of its
#: records fall in it: 20,000 replays 15 % faster than 2,000 (BENCHMARKS.md, step 3); the
#: cache holds at most the executions of one interval.
REPLAY_FLUSH_EVERY = 20_000
#: records between two progress reports of a child process to the parent's bar.
PROGRESS_EVERY = 2_000
#: records asked of the consumer at a time.
CONSUME_BATCH = 1_000
#: how long one ask waits for a full batch: it returns early only once it has one, and the
#: last records of the log (or of a partition resumed after a pause, fetched again) are fewer;
#: the loop asks again at once, so a short wait costs nothing and a long one is idle time.
CONSUME_WAIT_S = 0.05
#: the outputs producer waits this long to fill its batches: a replay is about throughput, and
#: fewer, larger produce requests leave the broker more of the machine.
REPLAY_LINGER_MS = 50

Progressed = Callable[[int], None]
T = TypeVar("T")


def default_processes(settings: Settings) -> int:
    """One: only a process that replays every partition sees every execution's claims, so only
    it can join blind retries across executions (``streams/local_join.py``), and a replay must
    give the live run's answers. More processes (``--processes``) are for a backfill that may
    go without that join, in exchange for speed."""
    del settings
    return 1


def shares(partitions: int, processes: int) -> list[list[int]]:
    """Partitions dealt round robin to ``processes`` shares (none empty)."""
    n = max(1, min(processes, partitions))
    return [list(range(i, partitions, n)) for i in range(n)]


def in_range(timestamp_ms: int, end_ms: int | None, lateness_ms: int = 0) -> bool:
    """Whether a record stamped ``timestamp_ms`` is read by a replay that ends at ``end_ms``
    (None: no end), with the allowed lateness ``lateness_ms``. The end is inclusive: a replay
    to T judges the facts stamped T, as ``vigil audit --at T`` does. Records up to the
    lateness after it are read too: an event stamped before the end but written within the
    lateness after it is judged before the end live, and so here (one written later is late:
    placed after the end, it stays held)."""
    return end_ms is None or timestamp_ms <= end_ms + lateness_ms


def end_ticks(
    inputs: Topics,
    partitions: Collection[int] | None,
    end: datetime,
    lateness: timedelta = timedelta(0),
) -> list[Envelope]:
    """What closes a replay to ``end``: a tick one millisecond past ``end`` + ``lateness``
    (the allowed lateness, by which the watermark trails the topics' times) on every input
    topic of every partition replayed (``None``: all), handed to the processor and written
    nowhere.

    The watermark then passes ``end``, so everything at or before it is decided in
    event-time order, events before deadlines at equal times: an answer stamped ``end``
    counts, and so does a deadline due at ``end`` ("deadlines are reached at their instant").
    Nothing is stamped after ``end``: the processor stamps outputs with the event's time or
    the deadline's. The replay's last verdict on a request is therefore the evaluator's
    verdict at ``end`` on the facts up to ``end``, which is what ``vigil audit --at`` gives."""
    after_ms = _ms(end + lateness) + 1
    after = datetime.fromtimestamp(after_ms / 1000, UTC)
    return [
        Envelope(
            spec.name,
            p,
            -1,
            after_ms,
            None,
            None,
            ClockTick(ticker_id="replay-end", partition=p, occurred_at=after),
            None,
        )
        for spec in inputs.inputs()
        for p in range(spec.partitions)
        if partitions is None or p in partitions
    ]


def run_replay(
    settings: Settings,
    codec: AvroCodec,
    start: datetime,
    end: datetime | None = None,
    output_suffix: str = "-replay",
    show_progress: bool = True,
    processes: int = 1,
) -> ReplaySummary:
    """Replay ``[start, end]`` (see ``in_range``, ``end_ticks``); without ``end``, up to the
    log end as of the start, deciding only what its ticks have passed. With
    ``processes`` > 1 the partitions are shared among that many child processes."""
    if not output_suffix:
        raise ValueError("a replay needs an output suffix: it must not write to the live outputs")
    if processes < 1:
        raise ValueError(f"a replay needs at least one process, not {processes}")
    began = time.monotonic()
    out_settings = replace(settings, output_suffix=output_suffix)
    outputs = Topics.from_settings(out_settings)
    create_topics(out_settings, outputs.outputs())
    prepare_registry(out_settings, codec, outputs.outputs())
    groups = shares(settings.partitions, processes)
    with Progress(
        TextColumn("replay"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        disable=not show_progress,
    ) as bar:
        task = bar.add_task("records", total=None)

        def total(n: int) -> None:
            bar.update(task, total=n)

        if len(groups) == 1:
            summary = replay_partitions(
                settings,
                codec,
                start,
                end,
                output_suffix,
                None,
                lambda n: bar.advance(task, n),
                total,
            )
        else:
            summary = _in_processes(settings, start, end, output_suffix, groups, bar, task)
    summary.output_topics = tuple(t.name for t in outputs.outputs())
    summary.processes = len(groups)
    summary.seconds = time.monotonic() - began
    return summary


def replay_processor(
    out_settings: Settings, partitions: Collection[int] | None
) -> tuple[Processor, LocalJoin | None]:
    """The processor a replay of ``partitions`` (``None``: all) runs, writing to the topics of
    ``out_settings``, and the claims join it runs in-process (``streams/local_join.py``; its
    emissions go through ``route``). The join needs every partition's claims, so only a
    process that replays them all runs it; a share of them runs without (None)."""
    # Write-behind with a flush every few thousand records: each execution's state is parsed
    # and dumped once per flush, not once per record (nothing is redelivered in a replay).
    joined = partitions is None or set(range(out_settings.partitions)) <= set(partitions)
    processor = Processor.from_settings(
        out_settings,
        Topics.from_settings(out_settings),
        Stores(),
        write_behind=True,
        cross_execution=joined,
    )
    if not joined:
        return processor, None
    grace_ms = out_settings.claims_grace // timedelta(milliseconds=1)
    return processor, LocalJoin(out_settings.partitions, grace_ms)


def replay_partitions(
    settings: Settings,
    codec: AvroCodec,
    start: datetime,
    end: datetime | None,
    output_suffix: str,
    partitions: Collection[int] | None,
    progressed: Progressed = lambda n: None,
    total: Progressed = lambda n: None,
) -> ReplaySummary:
    """Replay the given partitions (``None``: all) of every input topic, in this process."""
    inputs = Topics.from_settings(settings)
    out_settings = replace(settings, output_suffix=output_suffix)
    processor, join = replay_processor(out_settings, partitions)
    allowed = {t.name: t.value_types for t in inputs.inputs()}
    producer = RecordProducer(out_settings, codec, **{"linger.ms": REPLAY_LINGER_MS})
    summary = ReplaySummary()
    mine = [
        (t.name, p)
        for t in inputs.inputs()
        for p in range(t.partitions)
        if partitions is None or p in partitions
    ]

    consumer = Consumer(
        settings.confluent_conf()
        | {
            "group.id": f"vigil-replay-{uuid.uuid4().hex[:8]}",  # never commits: assign only
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        found = _retrying(
            lambda: consumer.offsets_for_times(
                [TopicPartition(t, p, _ms(start)) for t, p in mine], timeout=30
            )
        )
        assignment: list[TopicPartition] = []
        remaining: dict[tuple[str, int], int] = {}
        for tp in found:
            _, high = _retrying(
                lambda tp=tp: consumer.get_watermark_offsets(
                    TopicPartition(tp.topic, tp.partition), timeout=30
                )
            )
            if tp.offset < 0 or tp.offset >= high:
                continue  # nothing at or after the start time
            assignment.append(tp)
            remaining[(tp.topic, tp.partition)] = high
        total(sum(remaining[(tp.topic, tp.partition)] - tp.offset for tp in assignment))
        consumer.assign(assignment)

        def emit(emissions: list[Emission]) -> None:
            if join is not None:
                emissions = route(processor, join, emissions)
            for em in emissions:
                producer.send_emission(em)
                summary.outputs_by_topic[em.topic] = summary.outputs_by_topic.get(em.topic, 0) + 1
            summary.outputs_written += len(emissions)

        unreported = 0
        end_ms = _ms(end) if end is not None else None
        lateness_ms = settings.allowed_lateness // timedelta(milliseconds=1)
        paused: set[tuple[str, int]] = set()
        while remaining:
            for msg in consumer.consume(CONSUME_BATCH, CONSUME_WAIT_S):
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
                if not in_range(ts, end_ms, lateness_ms):
                    remaining.pop(tp, None)  # this partition has gone past the end time
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
                unreported += 1
            # Bounded memory: partitions ahead in event time wait for the others (as live);
            # once only paused partitions have records left, nothing else can move time.
            pause, resume = flow.hold_back(
                processor.held_by, paused, processor.held_ahead, settings.max_held
            )
            if pause and not set(remaining) <= paused | set(pause):
                consumer.pause([TopicPartition(t, p) for t, p in pause])
                paused.update(pause)
            if paused and set(remaining) <= paused:
                resume = sorted(paused)
            if resume:
                consumer.resume([TopicPartition(t, p) for t, p in resume])
                paused.difference_update(resume)
            producer.producer.poll(0)  # delivery reports: a failed output fails the replay
            if producer.errors:
                raise RuntimeError(
                    f"{len(producer.errors)} outputs were not delivered: {producer.errors[0]}"
                )
            if unreported >= PROGRESS_EVERY:
                progressed(unreported)
                unreported = 0
        progressed(unreported)
        if end is not None:
            # Decide everything up to the end time: the end is data the operator gave, the
            # same for every replay of this range.
            for env in end_ticks(inputs, partitions, end, settings.allowed_lateness):
                emit(processor.handle(env))
        # What the last watermarks passed, told to the join even where they moved less than
        # the progress interval: nothing comes after, so nothing else would.
        emit(processor.publish_progress())
        processor.flush()
        processor.flush_clocks()
        producer.flush()
        if producer.errors:
            raise RuntimeError(
                f"{len(producer.errors)} outputs were not delivered: {producer.errors[0]}"
            )
    finally:
        consumer.close()
    summary.anomalies = sum(processor.counters.anomalies.values())
    summary.dead_letters = processor.counters.dead_letters
    summary.held = processor.held()
    summary.retry_links = join.links if join is not None else 0
    summary.joined = join is not None
    return summary


#: errors of a metadata or offsets request that pass once the cluster settles.
_TRANSIENT = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
    }
)


def _retrying(call: Callable[[], T], attempts: int = 10) -> T:
    """``call`` again while it fails with a retriable Kafka error (a partition whose leader is
    moving or was just created), waiting a little longer each time."""
    for attempt in range(attempts):
        try:
            return call()
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if not isinstance(error, KafkaError) or not (
                error.retriable() or error.code() in _TRANSIENT
            ):
                raise
            if attempt == attempts - 1:
                raise
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


def _child(
    settings: Settings,
    start: datetime,
    end: datetime | None,
    output_suffix: str,
    partitions: list[int],
    slot: int,
    counts: Any,
    results: Any,
) -> None:
    """One share of a replay, in a child process: its own codec, consumer and producer."""
    from streams.app import tune_gc

    tune_gc()

    def progressed(n: int) -> None:
        with counts.get_lock():
            counts[2 * slot] += n

    def total(n: int) -> None:
        with counts.get_lock():
            counts[2 * slot + 1] = n + 1  # + 1: 0 means "not known yet"

    try:
        codec = AvroCodec.connect(
            settings.registry_config(),
            auto_register=settings.auto_register,
        )
        summary = replay_partitions(
            settings, codec, start, end, output_suffix, partitions, progressed, total
        )
        results.put((slot, summary, None))
    except BaseException as exc:  # reported to the parent, which fails the replay
        results.put((slot, None, f"{exc!r}\n{traceback.format_exc()}"))


def _in_processes(
    settings: Settings,
    start: datetime,
    end: datetime | None,
    output_suffix: str,
    groups: list[list[int]],
    bar: Progress,
    task: Any,
) -> ReplaySummary:
    # spawn, not fork: the parent has librdkafka threads running (topic creation, registry).
    ctx = mp.get_context("spawn")
    counts = ctx.Array("q", 2 * len(groups))
    results = ctx.Queue()
    children = [
        ctx.Process(
            target=_child,
            args=(settings, start, end, output_suffix, group, i, counts, results),
            name=f"vigil-replay-{i}",
            daemon=True,
        )
        for i, group in enumerate(groups)
    ]
    for child in children:
        child.start()
    summary = ReplaySummary()
    done: set[int] = set()
    try:
        while len(done) < len(children):
            try:
                slot, part, error = results.get(timeout=0.2)
            except Exception:  # queue.Empty: report progress, check for a dead child
                slot = None
            if slot is not None:
                if error is not None:
                    raise RuntimeError(f"replay process {slot} failed: {error}")
                summary.add(part)
                done.add(slot)
            with counts.get_lock():
                read = sum(counts[2 * i] for i in range(len(groups)))
                totals = [counts[2 * i + 1] for i in range(len(groups))]
            if all(totals):
                bar.update(task, total=sum(totals) - len(totals))
            bar.update(task, completed=read)
            for i, child in enumerate(children):
                if i not in done and not child.is_alive() and results.empty():
                    raise RuntimeError(
                        f"replay process {i} exited with code {child.exitcode} before reporting"
                    )
    finally:
        for child in children:
            if child.is_alive() and len(done) < len(children):
                child.terminate()
            child.join(timeout=10)
    return summary
