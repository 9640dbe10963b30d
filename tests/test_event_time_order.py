"""Outputs depend on the input records alone, not on how the input topics are read, nor on
where a worker stopped: the pure processor over a log spanning hours of event time.

Each input topic partition is in event-time order (as producers write it). One run reads
the log interleaved by time; the others read it in any other interleaving of the topic
partitions, one topic entirely before the others included, and, with a simulated live worker,
crash anywhere (held events not yet acknowledged) and start again from the committed offsets
with the tables the crash left. Every run must publish the same records (ids and contents),
in the same order per key, and report no event as out of range.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streams.contracts.envelope import Envelope
from streams.contracts.models.events import ClockTick
from streams.engine.processor import Processor, Stores
from streams.kafka.partitioning import partition_of
from streams.kafka.topics import Topics
from streams.settings import Settings
from tests.test_faults_kafka import ID_FIELDS, T0, execution

PARTITIONS = 2
TOPICS = Topics.from_settings(Settings(partitions=PARTITIONS))
INPUTS = [t.name for t in TOPICS.inputs()]
#: executions start every ``SPACING`` seconds of event time: the log spans about 3.5 hours
EXECUTIONS, SPACING, TICK_EVERY = 24, 540.0, 60
TP = tuple[str, int]


def _time(record: Any) -> datetime:
    return record.occurred_at  # type: ignore[no-any-return]


def build_log() -> dict[TP, list[Envelope]]:
    """Per input topic partition, its records in event-time order with the broker's offsets,
    each record's Kafka timestamp its event time (as vigil's producers set it)."""
    events = [e for i in range(EXECUTIONS) for e in execution(i, i * SPACING)]
    end = max(_time(e) for e in events) + timedelta(seconds=60)
    ticks = [
        ClockTick(ticker_id="t", partition=p, occurred_at=T0 + timedelta(seconds=s))
        for s in range(0, int((end - T0).total_seconds()) + TICK_EVERY, TICK_EVERY)
        for p in range(PARTITIONS)
    ]
    routed: dict[TP, list[tuple[datetime, bool, Any]]] = defaultdict(list)
    for e in events:
        topic = next(t.name for t in TOPICS.inputs() if type(e) in t.value_types)
        routed[(topic, partition_of(e.execution_id, PARTITIONS))].append((_time(e), False, e))
    for tick in ticks:
        for topic in INPUTS:
            routed[(topic, tick.partition)].append((tick.occurred_at, True, tick))
    log: dict[TP, list[Envelope]] = {}
    for (topic, p), items in routed.items():
        items.sort(key=lambda x: (x[0], x[1]))  # ticks after the events of their instant
        log[(topic, p)] = [
            Envelope(
                topic,
                p,
                offset,
                int(t.timestamp() * 1000),
                None if is_tick else r.execution_id.encode(),
                b"",
                r,
                None,
            )
            for offset, (t, is_tick, r) in enumerate(items)
        ]
    return log


LOG = build_log()


def by_time() -> list[Envelope]:
    """The log read interleaved by event time (ticks after events of the same instant)."""
    every = [e for records in LOG.values() for e in records]
    return sorted(
        every,
        key=lambda e: (_time(e.record), isinstance(e.record, ClockTick), e.topic, e.offset),
    )


def interleave(choices: Iterable[tuple[int, int]]) -> list[Envelope]:
    """Another read order: each choice takes a burst of records from one topic partition."""
    queues = {tp: list(records) for tp, records in LOG.items()}
    order: list[Envelope] = []
    keys = sorted(queues)
    for which, burst in choices:
        live = [tp for tp in keys if queues[tp]]
        if not live:
            break
        tp = live[which % len(live)]
        order += queues[tp][:burst]
        del queues[tp][:burst]
    for tp in keys:  # whatever the choices left, topic by topic
        order += queues[tp]
    return order


def rid(record: Any) -> str:
    return next(getattr(record, f) for f in ID_FIELDS if hasattr(record, f))


@dataclass
class Published:
    """What a run published: every record by id, and the order of ids per (topic, key)."""

    by_id: dict[str, str] = field(default_factory=dict)
    per_key: dict[tuple[str, str | None], list[str]] = field(default_factory=dict)

    def add(self, topic: str, key: str | None, record: Any) -> None:
        text = record.model_dump_json()
        i = rid(record)
        assert self.by_id.setdefault(i, text) == text, f"id {i} published differently"
        ids = self.per_key.setdefault((topic, key), [])
        if i not in ids:  # a duplicate (after a crash) is the identical record: kept once
            ids.append(i)


def run_straight(order: list[Envelope]) -> Published:
    proc = Processor(TOPICS, Stores())
    out = Published()
    for e in order:
        for em in proc.handle(e):
            out.add(em.topic, em.key, em.record)
    return out


EXPECTED = run_straight(by_time())


def assert_same(got: Published) -> None:
    missing = sorted(set(EXPECTED.by_id) - set(got.by_id))
    extra = sorted(set(got.by_id) - set(EXPECTED.by_id))
    assert not missing, f"{len(missing)} missing, e.g. {[EXPECTED.by_id[m] for m in missing[:2]]}"
    assert not extra, f"{len(extra)} extra, e.g. {[got.by_id[x] for x in extra[:2]]}"
    assert got.by_id == EXPECTED.by_id
    assert got.per_key == EXPECTED.per_key


def test_the_log_spans_hours_and_nothing_is_out_of_range() -> None:
    times = [_time(e.record) for records in LOG.values() for e in records]
    assert max(times) - min(times) > timedelta(hours=3)
    anomalies = [json for json in EXPECTED.by_id.values() if '"kind":"TIME_OUT_OF_RANGE"' in json]
    assert anomalies == []
    # the scenario publishes what it is built to: verdicts, work items, the planted anomalies
    assert any('"verdict":"STUCK_AFTER_DECISION"' in j for j in EXPECTED.by_id.values())
    assert any('"kind":"REPLY_TIMEOUT"' in j for j in EXPECTED.by_id.values())
    assert any('"kind":"DUPLICATE"' in j for j in EXPECTED.by_id.values())


def test_one_topic_read_entirely_before_the_others_changes_nothing() -> None:
    """A backfill: every record of one topic first (here each topic in turn), then the rest.
    The events of the topic read first wait for the watermark; none is judged against a
    watermark hours behind it (that would report them TIME_OUT_OF_RANGE)."""
    for first in INPUTS:
        ahead = [e for tp, records in sorted(LOG.items()) if tp[0] == first for e in records]
        rest = [e for e in by_time() if e.topic != first]
        assert_same(run_straight(ahead + rest))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.integers(0, 7), st.integers(1, 400)),
        max_size=60,
    )
)
def test_any_interleaving_of_the_topics_publishes_the_same_records(
    choices: list[tuple[int, int]],
) -> None:
    assert_same(run_straight(interleave(choices)))


class Crash(Exception):
    pass


PHASES = ("handled", "published", "state", "clocks")


@dataclass
class Broker:
    """A simulated live worker (``vigil_worker/pipeline.py``'s order: handle a batch write-behind,
    publish, flush state, flush clocks, acknowledge) over a broker that commits, per topic
    partition, the acknowledged prefix."""

    order: list[Envelope]
    stores: Stores = field(default_factory=Stores)
    committed: dict[TP, int] = field(default_factory=lambda: defaultdict(int))
    acked: dict[TP, set[int]] = field(default_factory=lambda: defaultdict(set))
    published: Published = field(default_factory=Published)
    topics: Topics = TOPICS
    #: further keyword arguments of the processor (its settings)
    options: dict[str, Any] = field(default_factory=dict)

    def ack(self, envs: list[Envelope]) -> None:
        for e in envs:
            tp = (e.topic, e.partition)
            self.acked[tp].add(e.offset)
            while self.committed[tp] in self.acked[tp]:
                self.committed[tp] += 1

    def run(self, batch: int, crash_at: tuple[int, str] | None) -> None:
        """Deliver every record from the committed offsets, in the read order."""
        proc = Processor(
            self.topics,
            self.stores,
            write_behind=True,
            committed=lambda topic, p: self.committed[(topic, p)],
            **self.options,
        )
        todo = [e for e in self.order if e.offset >= self.committed[(e.topic, e.partition)]]
        for n, start in enumerate(range(0, len(todo), batch)):
            phase = crash_at[1] if crash_at is not None and crash_at[0] == n else None
            out = [em for e in todo[start : start + batch] for em in proc.handle(e, token=e)]
            if phase == "handled":
                raise Crash
            for em in out:
                self.published.add(em.topic, em.key, em.record)
            if phase == "published":
                raise Crash
            proc.flush()
            if phase == "state":
                raise Crash
            proc.flush_clocks()
            if phase == "clocks":
                raise Crash
            self.ack(proc.drain_done())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    choices=st.lists(st.tuples(st.integers(0, 7), st.integers(1, 400)), max_size=40),
    batch=st.integers(50, 800),
    crashes=st.lists(
        st.tuples(st.integers(0, 12), st.sampled_from(PHASES)), min_size=1, max_size=4
    ),
)
def test_a_restart_under_a_backlog_publishes_the_same_records(
    choices: list[tuple[int, int]], batch: int, crashes: list[tuple[int, str]]
) -> None:
    """A topic read far ahead of the others leaves many events held for the watermark,
    unacknowledged. The clock saved with a batch must not include their times: after a
    restart they would come again behind a watermark already past them and be applied out of
    order (outputs missing, reply timeouts that should never fire)."""
    broker = Broker(interleave(choices))
    for crash in crashes:
        with contextlib.suppress(Crash):
            broker.run(batch, crash)
    broker.run(batch, None)
    assert_same(broker.published)


def test_a_restart_with_one_topic_read_first_publishes_the_same_records() -> None:
    """The worst backlog: one topic entirely ahead, a crash in every batch's every phase."""
    first = INPUTS[0]
    order = [e for tp, records in sorted(LOG.items()) if tp[0] == first for e in records]
    order += [e for e in by_time() if e.topic != first]
    for phase in PHASES:
        broker = Broker(order)
        for n in range(0, 30, 3):
            with contextlib.suppress(Crash):
                broker.run(300, (n, phase))
        broker.run(300, None)
        assert_same(broker.published)


def test_how_far_each_input_is_processed_is_stored_with_the_clock() -> None:
    """The floor a worker starts a partition from, whatever the group committed: stored with
    the partition's clock, never lowered, and read back by the next worker."""
    stores = Stores()
    proc = Processor(TOPICS, stores, write_behind=True)
    first = by_time()[:400]
    for e in first:
        proc.handle(e, token=e)
    done = proc.drain_done()
    ends: dict[TP, int] = {}
    for e in done:
        ends[(e.topic, e.partition)] = max(ends.get((e.topic, e.partition), 0), e.offset + 1)
    for (topic, p), offset in ends.items():
        proc.acknowledged(topic, p, offset)
        proc.acknowledged(topic, p, offset - 1)  # never lowered
    proc.flush()
    proc.flush_clocks()
    after = Processor(TOPICS, stores, write_behind=True)
    for (topic, p), offset in ends.items():
        assert after.processed_through(topic, p) == offset
    assert after.processed_through(INPUTS[0], PARTITIONS + 5) is None
