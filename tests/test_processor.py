"""The shell without Kafka: envelopes in, emissions out, dicts as tables."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import count

import pytest

from streams.contracts.envelope import Envelope
from streams.contracts.models.base import Record
from streams.contracts.models.enums import (
    AnomalyKind,
    ExecutionStatus,
    OperationEventKind,
    OperationStatus,
    RetryVerdict,
)
from streams.contracts.models.events import ClockTick, ExecutionStatusChanged, OperationEvent
from streams.contracts.models.outputs import (
    Alert,
    Anomaly,
    DeadLetter,
    ExecutionState,
    OperationState,
    ReconciliationWorkItem,
    WorkItemResolution,
)
from streams.engine.processor import Processor, Stores
from streams.engine.scheduler import epoch_ms, from_ms
from streams.kafka.partitioning import partition_of
from streams.kafka.topics import Topics
from streams.settings import Settings

T0 = datetime(2026, 7, 26, 16, 0, tzinfo=UTC)
TOPICS = Topics.from_settings(Settings(partitions=3))
_offsets = count()


def env(
    record: Record, topic: str | None = None, key: str | None = None, partition: int | None = None
) -> Envelope:
    if topic is None:
        topic = next(t.name for t in TOPICS.inputs() if type(record) in t.value_types)
    k = key if key is not None else getattr(record, "execution_id", None)
    p = partition if partition is not None else partition_of(k or "", 3)
    return Envelope(topic, p, next(_offsets), None, k.encode() if k else None, b"", record, None)


def ticks(proc: Processor, at: datetime) -> list[Record]:
    out = []
    for spec in TOPICS.inputs():
        for p in range(3):
            tick = ClockTick(ticker_id="t", partition=p, occurred_at=at)
            out += [e.record for e in proc.handle(env(tick, spec.name, key="", partition=p))]
    return out


def sent(
    op: str,
    attempt: int = 1,
    minutes: float = 0,
    ex: str = "ex-1",
    kind: OperationEventKind = OperationEventKind.SENT,
    **kw,
) -> OperationEvent:
    return OperationEvent(
        event_id=f"{op}-{attempt}-{kind}-{minutes}",
        execution_id=ex,
        operation_id=op,
        attempt=attempt,
        idempotency_key=f"idem-{op}",
        connector="sms",
        kind=kind,
        occurred_at=T0 + timedelta(minutes=minutes),
        **kw,
    )


@pytest.fixture
def proc() -> Processor:
    return Processor(TOPICS, Stores())


def handle(proc: Processor, record: Record, **kw) -> list[Record]:
    """One record, then ticks just past the instant it is placed at (its time, or, written
    behind the ticks of its topic, theirs: docs/rules.md#time): the watermark releases it."""
    e = env(record, **kw)
    placed = from_ms(proc.scheduler.place(e, epoch_ms(record.occurred_at)))
    out = [em.record for em in proc.handle(e)]
    return out + ticks(proc, placed + timedelta(milliseconds=1))


def test_quiet_partition_times_out_by_ticks_alone(proc: Processor) -> None:
    handle(
        proc,
        ExecutionStatusChanged(
            event_id="s1",
            execution_id="ex-1",
            sequence=1,
            status=ExecutionStatus.RUNNING,
            occurred_at=T0,
        ),
    )
    out = handle(proc, sent("op-1", reply_due_at=T0 + timedelta(seconds=30)))
    assert [type(r) for r in out] == [OperationState, ExecutionState]
    assert ticks(proc, T0 + timedelta(seconds=10)) == []
    fired = ticks(proc, T0 + timedelta(seconds=31))
    states = [r for r in fired if isinstance(r, OperationState)]
    items = [r for r in fired if isinstance(r, ReconciliationWorkItem)]
    assert [s.status for s in states] == [OperationStatus.UNKNOWN]
    assert states[0].retry == RetryVerdict.FORBIDDEN
    assert len(items) == 1 and items[0].created_at == T0 + timedelta(seconds=30)
    assert any(isinstance(r, Alert) for r in fired)
    assert ticks(proc, T0 + timedelta(seconds=40)) == []  # fires once


def test_late_verification_resolves_the_work_item(proc: Processor) -> None:
    handle(proc, sent("op-1", reply_due_at=T0 + timedelta(seconds=30)))
    fired = ticks(proc, T0 + timedelta(minutes=1))
    item = next(r for r in fired if isinstance(r, ReconciliationWorkItem))
    out = handle(
        proc,
        sent("op-1", minutes=2, kind=OperationEventKind.VERIFIED, evidence_source="RECONCILER"),
    )
    res = [r for r in out if isinstance(r, WorkItemResolution)]
    assert len(res) == 1 and res[0].work_item_id == item.work_item_id
    assert res[0].outcome == OperationStatus.VERIFIED


def test_reply_after_deadline_in_topic_order_is_late_even_without_ticks(proc: Processor) -> None:
    handle(proc, sent("op-1", reply_due_at=T0 + timedelta(seconds=30)))
    out = handle(
        proc,
        sent("op-1", minutes=1, kind=OperationEventKind.ACKNOWLEDGED, evidence_source="CONNECTOR"),
    )
    statuses = [r.status for r in out if isinstance(r, OperationState)]
    assert statuses[0] == OperationStatus.UNKNOWN
    assert OperationStatus.ACKNOWLEDGED not in statuses


def test_forbidden_retry_raises_one_alert(proc: Processor) -> None:
    handle(proc, sent("op-1", reply_due_at=T0 + timedelta(seconds=30)))
    out = handle(proc, sent("op-1", attempt=2, minutes=0.1))
    alerts = [r for r in out if isinstance(r, Alert) and r.kind == "FORBIDDEN_RETRY"]
    assert len(alerts) == 1


def test_key_mismatch_and_garbage(proc: Processor) -> None:
    rec = ExecutionStatusChanged(
        event_id="s1",
        execution_id="ex-1",
        sequence=1,
        status=ExecutionStatus.RUNNING,
        occurred_at=T0,
    )
    out = handle(proc, rec, key="ex-2")[:2]
    assert [type(r) for r in out] == [Anomaly, Alert] and out[0].kind == AnomalyKind.KEY_MISMATCH
    assert out[1].kind == "ANOMALY" and out[1].owner == "OPERATOR"
    bad = Envelope(TOPICS.execution_status.name, 0, 99, 1000, b"k", b"\x01xx", None, "boom")
    (dl,) = [e.record for e in proc.handle(bad)]
    assert isinstance(dl, DeadLetter) and dl.original_value == b"\x01xx" and dl.reason == "boom"
    assert proc.counters.dead_letters == 1


def test_restart_rebuilds_timer_index_from_tables() -> None:
    stores = Stores()
    first = Processor(TOPICS, stores)
    handle(first, sent("op-1", reply_due_at=T0 + timedelta(seconds=30)))
    ticks(first, T0 + timedelta(seconds=5))
    second = Processor(TOPICS, stores)  # a restart: same tables, nothing in memory
    fired = ticks(second, T0 + timedelta(seconds=31))
    assert len([r for r in fired if isinstance(r, ReconciliationWorkItem)]) == 1


def test_decision_for_a_request_that_never_comes_is_an_orphan_anomaly(proc: Processor) -> None:
    from streams.contracts.models.enums import DecisionCode
    from streams.contracts.models.events import ApprovalDecision

    d = ApprovalDecision(
        event_id="d1",
        execution_id="ex-9",
        request_id="req-never",
        occurred_at=T0,
        decision=DecisionCode.ACCEPT,
    )
    assert [r for r in handle(proc, d) if isinstance(r, Anomaly)] == []
    assert [r for r in ticks(proc, T0 + timedelta(minutes=59)) if isinstance(r, Anomaly)] == []
    out = ticks(proc, T0 + timedelta(hours=1, seconds=1))
    (orphan,) = [r for r in out if isinstance(r, Anomaly)]
    assert orphan.kind == AnomalyKind.ORPHAN_FACT and "req-never" in orphan.reason
    (fired,) = [r for r in out if isinstance(r, Alert) and r.kind == "ANOMALY"]
    # reported once; its alert ends VIGIL_ANOMALY_ALERT_TTL (1 h) after the anomaly
    (ended,) = ticks(proc, T0 + timedelta(hours=3))
    assert isinstance(ended, Alert) and ended.resolves_alert_id == fired.alert_id
    assert ended.occurred_at == orphan.detected_at + timedelta(hours=1)
    assert ticks(proc, T0 + timedelta(hours=4)) == []


def test_unreadable_decision_code_is_an_anomaly(proc: Processor) -> None:
    from streams.contracts.models.enums import DecisionCode
    from streams.contracts.models.events import ApprovalDecision

    d = ApprovalDecision(
        event_id="d1",
        execution_id="ex-9",
        request_id="r",
        occurred_at=T0,
        decision=DecisionCode.UNRECOGNIZED,
    )
    (anomaly,) = [r for r in handle(proc, d) if isinstance(r, Anomaly)]
    assert anomaly.kind == AnomalyKind.UNRECOGNIZED_SYMBOL


def test_far_future_record_is_refused_at_once(proc: Processor) -> None:
    """An event time far ahead of its record timestamp (a producer with a broken clock) is
    refused at once, even before the partition has a watermark, and stamped with its own
    (acceptable) record timestamp."""
    far = ExecutionStatusChanged(
        event_id="f",
        execution_id="ex-far",
        sequence=1,
        status=ExecutionStatus.CREATED,
        occurred_at=T0 + timedelta(days=3650),
    )
    e = env(far)
    e = Envelope(e.topic, e.partition, e.offset, int(T0.timestamp() * 1000), e.key, b"", far, None)
    out = [em.record for em in proc.handle(e)]
    anomalies = [r for r in out if isinstance(r, Anomaly)]
    assert [a.kind for a in anomalies] == [AnomalyKind.TIME_OUT_OF_RANGE]
    assert anomalies[0].detected_at == T0
    ok = ExecutionStatusChanged(
        event_id="ok",
        execution_id="ex-far",
        sequence=1,
        status=ExecutionStatus.CREATED,
        occurred_at=T0,
    )
    states = [r for r in handle(proc, ok) if isinstance(r, ExecutionState)]
    assert states and states[0].last_event_at == T0  # the far one was not applied


def test_closed_executions_are_forgotten_after_the_retention() -> None:
    from datetime import timedelta as td

    proc = Processor(TOPICS, Stores(), closed_retention=td(hours=2))
    for seq, st in enumerate([ExecutionStatus.RUNNING, ExecutionStatus.FAILED], 1):
        handle(
            proc,
            ExecutionStatusChanged(
                event_id=f"c{seq}",
                execution_id="ex-c",
                sequence=seq,
                status=st,
                occurred_at=T0 + td(minutes=seq),
            ),
        )
    assert "ex-c" in proc.closed and "ex-c" not in proc.inflight
    late = ExecutionStatusChanged(
        event_id="c3",
        execution_id="ex-c",
        sequence=3,
        status=ExecutionStatus.RUNNING,
        occurred_at=T0 + td(hours=1),
    )
    assert [r.kind for r in handle(proc, late) if isinstance(r, Anomaly)] == ["AFTER_TERMINAL"]
    ticks(proc, T0 + td(hours=3))
    assert "ex-c" not in proc.closed


def test_restart_keeps_stream_time_so_redelivered_events_need_no_new_ticks() -> None:
    """Ticks already acknowledged are not delivered again after a restart: the partition's
    clock is kept in a table, so an event Kafka delivers again is not stuck waiting for the
    other topics to tick again; its own topic's next record releases it, as it would have."""
    stores = Stores()
    first = Processor(TOPICS, stores, write_behind=True)
    event = sent("op-1", reply_due_at=T0 + timedelta(seconds=30))
    ticks(first, T0 - timedelta(seconds=1))  # the watermark exists, but is before the event
    held = env(event)
    p = held.partition
    first.handle(held)  # held, never acknowledged
    for spec in TOPICS.inputs():  # the other topics move on, acknowledged
        if spec.name != held.topic:
            tick = ClockTick(ticker_id="t", partition=p, occurred_at=T0 + timedelta(minutes=1))
            assert first.handle(env(tick, spec.name, key="", partition=p)) == []
    first.flush()
    first.flush_clocks()
    second = Processor(TOPICS, stores)  # restart: memory gone, tables kept
    out = [e.record for e in second.handle(held)]  # Kafka delivers it again
    tick = ClockTick(ticker_id="t", partition=p, occurred_at=T0 + timedelta(minutes=1))
    out += [e.record for e in second.handle(env(tick, held.topic, key="", partition=p))]
    assert any(isinstance(r, OperationState) for r in out)
