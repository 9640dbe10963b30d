"""On the real broker: a backfill, or an input topic read far ahead of the
others, loses nothing and changes nothing.

Each input topic partition is written in event-time order, each record's Kafka timestamp its
event time (as vigil's producers set it), but one topic entirely before the others, and the
live worker reads it before the others exist. No event may be reported TIME_OUT_OF_RANGE;
the approval verdicts must be those the pure ``Processor`` publishes reading the same records
interleaved by time; two replays of the log must publish what the live run did. Before the
fix, the events of the topic read first were judged against the watermark of the topics still
behind (hours behind them), reported TIME_OUT_OF_RANGE and never applied.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient

from streams.contracts.envelope import Envelope
from streams.contracts.models.base import Record
from streams.contracts.models.enums import AnomalyKind
from streams.contracts.models.events import ClockTick
from streams.contracts.models.outputs import Anomaly, ApprovalVerdict
from streams.engine.processor import Processor, Stores
from streams.kafka.clients import ConsumedRecord, consume
from streams.replay import run_replay
from tests.support import Deployment, deployment, worker
from tests.test_faults_kafka import T0, approval, execution

pytestmark = pytest.mark.kafka

DAY = datetime(2026, 7, 26, tzinfo=UTC)
TP = tuple[str, int]
Groups = dict[tuple[str, str | None], list[str]]


def hm(hour: int, minute: int, second: int = 0) -> datetime:
    return DAY + timedelta(hours=hour, minutes=minute, seconds=second)


def tick(topic: str, partition: int, at: datetime) -> tuple[str, Record]:
    return topic, ClockTick(ticker_id="test-ticker", partition=partition, occurred_at=at)


def produce(dep: Deployment, items: Iterable[tuple[str, Record]]) -> None:
    """Each record to its topic, in the order given (a tick to the partition it names)."""
    p = dep.producer()
    for topic, record in items:
        p.send(topic, record)
    p.flush(60)


def ticks(dep: Deployment, topics: Iterable[str], times: Iterable[datetime]) -> list[Any]:
    """Ticks at ``times`` into every partition of ``topics``, each partition in time order."""
    return [tick(t, p, at) for at in times for t in topics for p in range(dep.settings.partitions)]


def topic_of(dep: Deployment, record: Record) -> str:
    return next(t.name for t in dep.topics.inputs() if type(record) in t.value_types)


def metric(w: Any, name: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{w.web_port}/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"no metric {name}")


def wait_held(w: Any, n: int, timeout: float = 40.0) -> None:
    """Until the worker holds ``n`` events for the watermark: it has read them."""
    deadline = time.monotonic() + timeout
    while (held := metric(w, "vigil_events_held")) < n:
        assert time.monotonic() < deadline, f"the worker holds {held} events, not {n}"
        time.sleep(0.3)


def end_offsets(dep: Deployment) -> dict[TP, int]:
    c = Consumer(dep.settings.confluent_conf() | {"group.id": "backfill-reader"})
    try:
        return {
            (t.name, p): c.get_watermark_offsets(TopicPartition(t.name, p), timeout=10)[1]
            for t in dep.topics.inputs()
            for p in range(dep.settings.partitions)
        }
    finally:
        c.close()


def wait_committed(dep: Deployment, ends: dict[TP, int], timeout: float = 40.0) -> None:
    """Until the worker's group has committed every input partition up to ``ends``: the
    worker acknowledges a record only once its outputs are delivered, so they all are."""
    admin = AdminClient(dep.settings.confluent_conf())
    request = ConsumerGroupTopicPartitions(
        dep.settings.app_id, [TopicPartition(t, p) for t, p in ends]
    )
    deadline = time.monotonic() + timeout
    while True:
        result = admin.list_consumer_group_offsets([request])[dep.settings.app_id].result(30)
        behind = {
            (tp.topic, tp.partition): (tp.offset, ends[(tp.topic, tp.partition)])
            for tp in result.topic_partitions
            if tp.offset < ends[(tp.topic, tp.partition)]
        }
        if not behind:
            return
        assert time.monotonic() < deadline, f"committed offsets behind the log: {behind}"
        time.sleep(0.5)


def record_time(record: Any) -> datetime:
    return record.occurred_at  # type: ignore[no-any-return]


def pure(dep: Deployment, inputs: list[ConsumedRecord]) -> list[tuple[str, str | None, Record]]:
    """What the pure ``Processor`` publishes for the input records as the broker holds them
    (offsets, Kafka timestamps), read interleaved by event time (ticks after the events of
    their instant)."""
    order = sorted(
        inputs,
        key=lambda r: (record_time(r.record), isinstance(r.record, ClockTick), r.topic, r.offset),
    )
    proc = Processor(dep.topics, Stores())
    out: list[tuple[str, str | None, Record]] = []
    for r in order:
        env = Envelope(
            r.topic,
            r.partition,
            r.offset,
            r.timestamp_ms,
            r.key.encode() if r.key is not None else None,
            r.raw,
            r.record,
            None,
        )
        out += [(em.topic, em.key, em.record) for em in proc.handle(env)]
    return out


def per_key(records: Iterable[tuple[str, str | None, Record]]) -> Groups:
    """Records grouped by (output topic without suffix, key), in publication order; a record
    published again (identical) counted once."""
    groups: Groups = defaultdict(list)
    for topic, key, record in records:
        base = topic.rsplit(".", 1)[-1].split("-replay")[0]
        text = record.model_dump_json()
        seq = groups[(base, key)]
        if text not in seq:
            seq.append(text)
    return dict(groups)


def read_outputs(dep: Deployment, topics: Iterable[str]) -> Groups:
    got = list(consume(dep.settings, dep.codec, list(topics), idle_timeout=2.0))
    assert all(r.record is not None for r in got), [r.error for r in got if r.record is None]
    return per_key((r.topic, r.key, r.record) for r in got)  # type: ignore[misc]


def out_of_range(groups: Groups) -> list[str]:
    return [
        text
        for (topic, _), texts in groups.items()
        if topic == "anomalies"
        for text in texts
        if Anomaly.model_validate_json(text).kind == AnomalyKind.TIME_OUT_OF_RANGE
    ]


def test_the_issue_reproduction_a_topic_read_hours_ahead(cluster, tmp_path: Path) -> None:
    """A topic read hours ahead: approval-events alone (ticks at 13:58, 15:00 and 16:01,
    then a request at 16:00 and its delivery at 16:00:10), read by the worker; then ticks
    from 13:58 on the other inputs, and 16:30 everywhere. Both facts are applied and their
    verdicts published: a future-skew check against the partition's stream time (13:58) would
    refuse them as TIME_OUT_OF_RANGE and publish no verdict."""
    dep = deployment(cluster, tmp_path, partitions=3)
    approvals = dep.topics.approval_events.name
    others = [t.name for t in dep.topics.inputs() if t.name != approvals]
    requested, _, delivery = approval("run-1", 0, receipt=False)[:3]
    requested = requested.model_copy(update={"occurred_at": hm(16, 0), "expires_at": hm(16, 10)})
    delivery = delivery.model_copy(update={"occurred_at": hm(16, 0, 10)})
    early = [hm(13, 58), hm(15, 0), hm(16, 1)]
    produce(dep, ticks(dep, [approvals], early))
    produce(dep, [(approvals, requested), (approvals, delivery)])
    with worker(dep) as w:
        wait_held(w, 2)
        produce(dep, ticks(dep, others, early))
        produce(dep, ticks(dep, [approvals, *others], [hm(16, 30)]))
        dep.last_tick = hm(16, 30)  # sent again while the worker runs (tests.support.worker)
        ends = end_offsets(dep)
        wait_committed(dep, ends)
    inputs = list(consume(dep.settings, dep.codec, [approvals, *others], idle_timeout=2.0))
    expected = per_key(x for x in pure(dep, inputs) if isinstance(x[2], ApprovalVerdict))
    assert expected, "the pure processor publishes no approval verdict"
    live = read_outputs(dep, [dep.topics.approval_verdicts.name, dep.topics.anomalies.name])
    assert out_of_range(live) == []
    assert {k: v for k, v in live.items() if k[0] == "approval-verdicts"} == expected


#: the log of the second test: executions starting every SPACING seconds of event time (about
#: four hours), ticks every TICK_EVERY seconds, two partitions
EXECUTIONS, SPACING, TICK_EVERY = 20, 720, 120


def test_replays_and_the_live_run_publish_the_same_after_a_backfill(
    cluster, tmp_path: Path
) -> None:
    """A log of about four hours of approval and operation scenarios over all four inputs.
    The operation events (and their topic's ticks) are written, and read by the live worker,
    before anything else; then the other topics, interleaved by time. The live run and two
    replays (one and two processes) publish the same records, in the same order per key, and
    none of them reports an event out of range."""
    dep = deployment(cluster, tmp_path, partitions=2)
    first = dep.topics.operation_events.name
    others = [t.name for t in dep.topics.inputs() if t.name != first]
    events = [e for i in range(EXECUTIONS) for e in execution(i, i * SPACING)]
    end = max(record_time(e) for e in events) + timedelta(seconds=TICK_EVERY)
    span = int((end - T0).total_seconds())
    times = [T0 + timedelta(seconds=s) for s in range(0, span + TICK_EVERY, TICK_EVERY)]
    assert times[-1] - times[0] > timedelta(hours=3)
    # each topic partition in event-time order, ticks after the events of their instant
    log = sorted(
        [(topic_of(dep, e), e) for e in events] + ticks(dep, [first, *others], times),
        key=lambda x: (record_time(x[1]), isinstance(x[1], ClockTick)),
    )
    ahead = [x for x in log if x[0] == first]
    held = sum(1 for _, r in ahead if not isinstance(r, ClockTick))
    produce(dep, ahead)
    live_topics = [t.name for t in dep.topics.outputs()]
    with worker(dep) as w:
        wait_held(w, held)
        produce(dep, [x for x in log if x[0] != first])
        dep.last_tick = times[-1]
        wait_committed(dep, end_offsets(dep))
    live = read_outputs(dep, live_topics)
    assert out_of_range(live) == []
    kinds = {k[0] for k in live}
    assert {"approval-verdicts", "operation-state", "reconciliation-work"} <= kinds, kinds

    replays = []
    for n, processes in ((1, 1), (2, 2)):
        summary = run_replay(
            dep.settings,
            dep.codec,
            T0,
            output_suffix=f"-replay{n}",
            show_progress=False,
            processes=processes,
        )
        assert summary.held == 0 and summary.processes == processes
        replays.append(read_outputs(dep, summary.output_topics))
    for replayed in replays:
        assert out_of_range(replayed) == []
    assert replays[0] == replays[1]
    assert replays[0] == live
