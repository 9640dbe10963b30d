"""The ends of ANOMALY and FORBIDDEN_RETRY alerts through the shell (``streams.engine.processor``),
without Kafka: where an anomaly's end is kept, that it survives a restart, that the live way
(written behind, input positions kept) and a replay publish the same ends
(docs/rules.md#alert-lifecycle)."""

from __future__ import annotations

from datetime import timedelta

from streams.contracts.envelope import Envelope
from streams.contracts.models.base import Record
from streams.contracts.models.enums import (
    AlertKind,
    AlertStatus,
    AnomalyKind,
    EvidenceSource,
    ExecutionStatus,
    OperationEventKind,
)
from streams.contracts.models.events import ExecutionStatusChanged
from streams.contracts.models.outputs import Alert, Anomaly
from streams.core import alerts as al
from streams.engine.processor import Processor, Stores
from streams.engine.scheduler import epoch_ms, from_ms
from streams.engine.state import Entry
from streams.kafka.partitioning import partition_of
from tests.test_processor import T0, TOPICS, env, handle, sent, ticks

HOUR = timedelta(hours=1)


def status(seq: int, minutes: float, ex: str = "ex-1", event_id: str | None = None) -> Record:
    return ExecutionStatusChanged(
        event_id=event_id or f"{ex}-s{seq}",
        execution_id=ex,
        sequence=seq,
        status=ExecutionStatus.RUNNING if seq % 2 else ExecutionStatus.WAITING_FOR_TOOL,
        occurred_at=T0 + timedelta(minutes=minutes),
    )


def alerts(out: list[Record], kind: AlertKind, state: AlertStatus) -> list[Alert]:
    return [r for r in out if isinstance(r, Alert) and r.kind is kind and r.status is state]


def pending(stores: Stores, key: str) -> al.Ends:
    raw = stores.executions.get(key)
    text = None if raw is None else Entry.decode(raw).alerts
    return () if text is None else al.load_ends(text)


def test_an_anomaly_alert_ends_an_hour_of_stream_time_later_even_after_a_restart() -> None:
    stores = Stores()
    proc = Processor(TOPICS, stores)
    handle(proc, status(1, 0))
    out = handle(proc, status(1, 1, event_id="ex-1-s1"))  # the same event again
    (anomaly,) = [r for r in out if isinstance(r, Anomaly)]
    assert anomaly.kind is AnomalyKind.DUPLICATE
    (fired,) = alerts(out, AlertKind.ANOMALY, AlertStatus.FIRING)
    assert fired.ends_with_resolved
    # found applying the input to its execution: the end is kept in that execution's entry
    (end,) = pending(stores, "ex-1")
    assert end.alert_id == fired.alert_id
    assert ticks(proc, anomaly.detected_at + HOUR - timedelta(seconds=1)) == []
    again = Processor(TOPICS, stores)  # a restart: the timers come back from the entries
    (ended,) = ticks(again, anomaly.detected_at + HOUR + timedelta(seconds=1))
    assert isinstance(ended, Alert) and ended.status is AlertStatus.RESOLVED
    assert ended.resolves_alert_id == fired.alert_id
    assert ended.occurred_at == anomaly.detected_at + HOUR
    assert pending(stores, "ex-1") == ()
    assert ticks(again, anomaly.detected_at + 2 * HOUR) == []


def test_an_input_refused_as_it_is_read_keeps_its_end_with_its_partition() -> None:
    """A key that is not the execution's id: the refusal names no execution of this
    partition, so its end is kept in the partition's own entry, which goes once it is due."""
    stores = Stores()
    proc = Processor(TOPICS, stores)
    record = status(1, 0, ex="ex-7")
    p = partition_of("ex-7", 3)
    out = [e.record for e in proc.handle(env(record, key="someone-else", partition=p))]
    (anomaly,) = [r for r in out if isinstance(r, Anomaly)]
    assert anomaly.kind is AnomalyKind.KEY_MISMATCH
    (fired,) = alerts(out, AlertKind.ANOMALY, AlertStatus.FIRING)
    home = proc.partition_home(p)
    assert partition_of(home, 3) == p and home not in ("ex-7", "someone-else")
    assert [e.alert_id for e in pending(stores, home)] == [fired.alert_id]
    (ended,) = ticks(proc, T0 + HOUR + timedelta(seconds=1))
    assert ended.resolves_alert_id == fired.alert_id  # type: ignore[attr-defined]
    assert home not in stores.executions  # nothing left: the entry goes


def test_live_and_replay_publish_the_same_ends() -> None:
    """Written behind with input positions (the live worker) or flushed at every input (a
    replay): the same anomalies, retry alerts and their ends."""
    K = OperationEventKind
    story: list[Record] = [
        status(1, 0),
        sent("op-1", 1, 0.1),
        sent("op-1", 2, 0.2),  # a forbidden retry
        status(1, 0.3, event_id="ex-1-s1"),  # a duplicate: an anomaly
        sent("op-1", 1, 2, kind=K.FAILED, evidence_source=EvidenceSource.CONNECTOR),
        sent("op-1", 2, 3, kind=K.VERIFIED, evidence_source=EvidenceSource.CONNECTOR),
    ]

    def run(live: bool) -> list[Record]:
        committed: dict[tuple[str, int], int] = {}
        proc = Processor(
            TOPICS,
            Stores(),
            write_behind=live,
            committed=(lambda t, p: committed.get((t, p))) if live else None,
        )
        out: list[Record] = []
        for offset, record in enumerate(story):
            e = env(record)
            e = Envelope(e.topic, e.partition, offset, None, e.key, b"", record, None)
            placed = from_ms(proc.scheduler.place(e, epoch_ms(record.occurred_at)))  # type: ignore[attr-defined]
            out += [em.record for em in proc.handle(e)]
            out += ticks(proc, placed + timedelta(milliseconds=1))
            if live:
                proc.flush()
                proc.flush_clocks()
        out += ticks(proc, T0 + 2 * HOUR)
        return [r for r in out if isinstance(r, Alert)]

    replayed, lived = run(False), run(True)
    assert replayed == lived
    (retry,) = alerts(replayed, AlertKind.FORBIDDEN_RETRY, AlertStatus.FIRING)
    (retry_end,) = alerts(replayed, AlertKind.FORBIDDEN_RETRY, AlertStatus.RESOLVED)
    assert retry_end.resolves_alert_id == retry.alert_id
    assert retry_end.occurred_at == T0 + timedelta(minutes=3)
    (anomaly,) = alerts(replayed, AlertKind.ANOMALY, AlertStatus.FIRING)
    (anomaly_end,) = alerts(replayed, AlertKind.ANOMALY, AlertStatus.RESOLVED)
    assert anomaly_end.resolves_alert_id == anomaly.alert_id


def test_the_ttl_is_a_setting() -> None:
    proc = Processor(TOPICS, Stores(), anomaly_alert_ttl=timedelta(minutes=5))
    handle(proc, status(1, 0))
    out = handle(proc, status(1, 1, event_id="ex-1-s1"))
    (fired,) = alerts(out, AlertKind.ANOMALY, AlertStatus.FIRING)
    (ended,) = alerts(
        ticks(proc, fired.occurred_at + timedelta(minutes=6)),
        AlertKind.ANOMALY,
        AlertStatus.RESOLVED,
    )
    assert ended.occurred_at == fired.occurred_at + timedelta(minutes=5)


def test_a_redelivered_refused_input_finds_its_alerts_end_kept() -> None:
    """The live worker stores the entries, then the clocks, then acknowledges. Killed in
    between, it is given the refused input again, which the entry says it applied: skipped,
    and the end of its anomaly's alert is still there, in the same entry."""
    committed: dict[tuple[str, int], int] = {}
    stores = Stores()

    def live() -> Processor:
        return Processor(
            TOPICS, stores, write_behind=True, committed=lambda t, p: committed.get((t, p))
        )

    proc = live()
    first = status(1, 0)
    dup = status(1, 1, event_id="ex-1-s1")
    e1, e2 = env(first), env(dup)
    proc.handle(e1)
    ticks(proc, first.occurred_at + timedelta(milliseconds=1))  # type: ignore[attr-defined]
    out = [em.record for em in proc.handle(e2)]
    out += ticks(proc, dup.occurred_at + timedelta(milliseconds=1))  # type: ignore[attr-defined]
    (fired,) = alerts(out, AlertKind.ANOMALY, AlertStatus.FIRING)
    proc.flush()  # the entries stored; the clocks not: a crash here
    again = live()
    assert [em.record for em in again.handle(e2)] == []
    ticks(again, dup.occurred_at + timedelta(milliseconds=1))  # type: ignore[attr-defined]
    assert again.counters.redelivered == 1
    out = ticks(again, fired.occurred_at + HOUR + timedelta(seconds=1))
    assert [a.resolves_alert_id for a in alerts(out, AlertKind.ANOMALY, AlertStatus.RESOLVED)] == [
        fired.alert_id
    ]
