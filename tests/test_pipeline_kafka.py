"""Issues 3, 4 and 5 on the real broker and registry, through a running worker subprocess."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from streams.contracts.models.enums import OperationStatus
from streams.contracts.models.outputs import (
    Alert,
    ApprovalVerdict,
    OperationState,
    ReconciliationWorkItem,
    WorkItemResolution,
)
from streams.engine.processor import Processor, Stores
from streams.local.scenario import REFERENCE_AT, Tick, demo_scenario
from tests.support import by_id, deployment, kill_hard, play, worker
from tests.test_processor import env as envelope
from tests.test_processor import sent

pytestmark = pytest.mark.kafka
T0 = datetime(2026, 7, 26, 16, 0, tzinfo=UTC)
EXPECTED = {
    "req-export": "WAITING",
    "req-deletion": "STALE_REQUEST",
    "req-rotation": "UNROUTABLE_WAIT",
    "req-invoice": "ORPHANED_WAIT",
    "req-deploy": "STUCK_AFTER_DECISION",
    "req-message": "CLOSED_BY_DECLINE",
}


def offline(steps, settings) -> dict:
    """What the pure pipeline computes for the same steps (records keyed by their JSON), with
    the offsets the broker will give them: the topics are fresh and produced in this order."""
    from streams.kafka.topics import Topics

    partitions = settings.partitions
    topics = Topics.from_settings(settings)
    proc = Processor(topics, Stores())
    out = {}
    offsets: dict[tuple[str, int], int] = {}

    def offset(topic: str, p: int) -> int:
        offsets[(topic, p)] = offsets.get((topic, p), -1) + 1
        return offsets[(topic, p)]

    from streams.contracts.envelope import Envelope
    from streams.contracts.models.events import ClockTick
    from streams.kafka.partitioning import partition_of

    for s in steps:
        if isinstance(s, Tick):
            for spec in topics.inputs():
                for p in range(partitions):
                    tick = ClockTick(ticker_id="t", partition=p, occurred_at=s.at)
                    for e in proc.handle(
                        Envelope(spec.name, p, offset(spec.name, p), None, None, b"", tick, None)
                    ):
                        out[e.record.model_dump_json()] = e.record
        else:
            spec = next(t for t in topics.inputs() if type(s) in t.value_types)
            p = partition_of(s.execution_id, partitions)
            e0 = Envelope(
                spec.name, p, offset(spec.name, p), None, s.execution_id.encode(), b"", s, None
            )
            for e in proc.handle(e0):
                out[e.record.model_dump_json()] = e.record
    return out


def test_bundled_scenario_through_the_worker_equals_the_core(cluster, tmp_path: Path) -> None:
    dep = deployment(cluster, tmp_path)
    steps = demo_scenario()
    play(dep, steps)
    expected = offline(steps, dep.settings)
    outputs = [t.name for t in dep.topics.outputs()]
    with worker(dep):
        got = dep.read_until(outputs, lambda rs: len(by_id(rs)) >= len(expected), timeout=90)
    live = by_id(got)

    # Everything, execution states included: events are processed in event-time order once
    # the watermark passes them, whatever the interleaving Faust reads the topics in.
    assert sorted(r.model_dump_json() for r in live.values()) == sorted(expected)
    final: dict[str, tuple[datetime, str]] = {}
    for r in live.values():
        if not isinstance(r, ApprovalVerdict) or r.evaluated_at > REFERENCE_AT:
            continue
        if r.request_id not in final or r.evaluated_at >= final[r.request_id][0]:
            final[r.request_id] = (r.evaluated_at, str(r.verdict))
    assert {k: v for k, (_, v) in final.items()} == EXPECTED


def test_connector_that_never_answers(cluster, tmp_path: Path) -> None:
    """One UNKNOWN and one work item, by ticks alone on a quiet partition; the same id after a
    hard kill and restart; a late verification settles it and publishes the resolution."""
    dep = deployment(cluster, tmp_path)
    play(dep, [sent("op-1", reply_due_at=T0 + timedelta(seconds=30)), Tick(T0)])
    play(dep, [Tick(T0 + timedelta(seconds=s)) for s in (10, 20, 29)])
    work = [
        dep.topics.operation_state.name,
        dep.topics.reconciliation_work.name,
        dep.topics.alerts.name,
    ]

    def unknown_seen(rs) -> bool:
        return any(isinstance(r.record, ReconciliationWorkItem) for r in rs)

    # the broker's shortest session: the restarted worker gets the killed one's partitions
    # 6 s after the kill instead of 30
    short = {"VIGIL_SESSION_TIMEOUT": "6s", "BROKER_HEARTBEAT_INTERVAL": "1"}
    with worker(dep, env=short) as w:
        got = dep.read([dep.topics.reconciliation_work.name], idle=4)
        assert got == [], "nothing may time out before the deadline"
        play(dep, [Tick(T0 + timedelta(seconds=31))])
        dep.read_until(work, unknown_seen)
        kill_hard(w)
    play(dep, [Tick(T0 + timedelta(seconds=45))])
    with worker(dep, env=short):
        play(dep, [Tick(T0 + timedelta(seconds=60))])
        late = sent("op-1", minutes=2, kind="VERIFIED", evidence_source="RECONCILER")
        play(dep, [late, Tick(T0 + timedelta(minutes=3))])
        got = dep.read_until(
            work, lambda rs: any(isinstance(r.record, WorkItemResolution) for r in rs)
        )
    records = [r.record for r in got]
    items = {r.work_item_id for r in records if isinstance(r, ReconciliationWorkItem)}
    assert len(items) == 1
    unknown = {
        r.state_id
        for r in records
        if isinstance(r, OperationState) and r.status == OperationStatus.UNKNOWN
    }
    assert len(unknown) == 1
    assert not any(
        isinstance(r, OperationState) and r.status == OperationStatus.FAILED for r in records
    )
    (res,) = {r.resolution_id: r for r in records if isinstance(r, WorkItemResolution)}.values()
    assert res.work_item_id in items and res.outcome == OperationStatus.VERIFIED


def test_forbidden_retry_alerts_once_and_retry_after_failed_does_not(
    cluster, tmp_path: Path
) -> None:
    dep = deployment(cluster, tmp_path)
    play(
        dep,
        [
            sent("op-a", ex="ex-a"),
            sent("op-a", attempt=2, minutes=0.1, ex="ex-a"),  # while attempt 1 is SENT
            sent("op-b", ex="ex-b"),
            sent("op-b", minutes=0.05, ex="ex-b", kind="FAILED", evidence_source="CONNECTOR"),
            sent("op-b", attempt=2, minutes=0.1, ex="ex-b"),  # after FAILED: legitimate
            Tick(T0 + timedelta(minutes=1)),
        ],
    )
    with worker(dep):
        got = dep.read_until(
            [dep.topics.alerts.name, dep.topics.operation_state.name],
            lambda rs: sum(isinstance(r.record, OperationState) for r in rs) >= 5,
        )
        got = dep.read([dep.topics.alerts.name], idle=3)
    alerts = [
        r.record for r in got if isinstance(r.record, Alert) and r.record.kind == "FORBIDDEN_RETRY"
    ]
    assert [a.subject_id for a in alerts] == ["op-a"]
    assert {h for h in (got[0].headers or {})} >= {"kind", "severity", "owner"}


def test_status_sequences_over_all_partitions(cluster, tmp_path: Path) -> None:
    """Scripted sequences with illegal, duplicate and late events for many executions: the
    exact execution states and anomalies the core computes come out."""
    from streams.contracts.models.enums import ExecutionStatus as S
    from streams.contracts.models.events import ExecutionStatusChanged

    dep = deployment(cluster, tmp_path, partitions=4)
    steps = []
    for i in range(24):
        ex = f"run-{i}"
        seq = [
            S.CREATED,
            S.VALIDATING,
            S.RESOLVING_CONTEXT,
            S.PLANNING,
            S.RUNNING,
            S.WAITING_FOR_TOOL,
            S.RUNNING,
            S.VALIDATING_OUTPUT,
            S.COMPLETED,
        ]
        events = [
            ExecutionStatusChanged(
                event_id=f"{ex}-{n}",
                execution_id=ex,
                sequence=n,
                status=st,
                occurred_at=T0 + timedelta(seconds=n),
            )
            for n, st in enumerate(seq, 1)
        ]
        if i % 3 == 0:
            events.insert(3, events[2])  # duplicate
        if i % 4 == 1:
            events.insert(
                5,
                ExecutionStatusChanged(
                    event_id=f"{ex}-bad",
                    execution_id=ex,
                    sequence=100,
                    status=S.CREATED,
                    occurred_at=T0 + timedelta(seconds=5),
                ),
            )  # illegal transition
        if i % 5 == 2:
            events.append(
                ExecutionStatusChanged(
                    event_id=f"{ex}-late",
                    execution_id=ex,
                    sequence=200,
                    status=S.RUNNING,
                    occurred_at=T0 + timedelta(seconds=20),
                )
            )  # after terminal
        if i % 6 == 3:
            # out of order: seq 3 happened (and is written) before seq 2
            events[1], events[2] = (
                events[2].model_copy(update={"occurred_at": events[1].occurred_at}),
                events[1].model_copy(update={"occurred_at": events[2].occurred_at}),
            )
        steps += events
    # Producers write each partition in event-time order (the watermark's assumption); the
    # executions interleave. A late event behind the watermark is covered by the unit tests.
    steps.sort(key=lambda e: e.occurred_at)
    steps.append(Tick(T0 + timedelta(minutes=1)))
    expected = {
        k: r
        for k, r in offline(steps, dep.settings).items()
        if type(r).__name__ in ("ExecutionState", "Anomaly")
    }
    play(dep, steps)
    outputs = [dep.topics.execution_state.name, dep.topics.anomalies.name]
    with worker(dep):
        got = dep.read_until(outputs, lambda rs: len(rs) >= len(expected), timeout=90)
    live = by_id(got)
    assert len(live) == len(expected)
    assert sorted(r.model_dump_json() for r in live.values()) == sorted(expected)
    assert {got_r.partition for got_r in got} == {0, 1, 2, 3}
    _ = envelope


def _metric(base: str, name: str) -> float:
    import httpx

    for line in httpx.get(f"{base}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "_total "):
            return float(line.split()[-1])
    raise AssertionError(f"no metric {name}")


def test_a_topic_far_ahead_is_paused_not_held_in_memory(cluster, tmp_path: Path) -> None:
    """600 operation events and nothing on the other inputs: no watermark, so every event read
    waits. The worker stops reading the topic after VIGIL_MAX_HELD of them instead of holding
    the whole backlog; once the other inputs tick, it reads on, and every event is processed
    once."""
    import time

    dep = deployment(cluster, tmp_path, partitions=1)
    events = [
        sent(f"op-{i}", ex=f"ex-{i}", minutes=i / 600, reply_due_at=T0 + timedelta(hours=1))
        for i in range(600)
    ]
    play(dep, events)
    env = {"VIGIL_MAX_HELD": "50", "VIGIL_BATCH_SIZE": "50", "VIGIL_FETCH_BYTES": "2048"}
    with worker(dep, env=env) as w:
        base = f"http://127.0.0.1:{w.web_port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _metric(base, "vigil_partitions_paused") < 1:
            time.sleep(0.5)
        time.sleep(3)  # what was fetched before the pause is handed over
        assert _metric(base, "vigil_partitions_paused") >= 1
        held = _metric(base, "vigil_events_held")
        assert 50 < held < 400, held  # past the limit by what was in flight, not the backlog
        play(dep, [Tick(T0 + timedelta(minutes=5))])
        got = dep.read_until(
            [dep.topics.operation_state.name],
            lambda rs: len({r.record.state_id for r in rs}) >= len(events),
        )
        assert _metric(base, "vigil_events_held") == 0
    assert len({r.record.operation_id for r in got}) == len(events)
    anomalies = dep.read([dep.topics.anomalies.name], idle=2)
    assert anomalies == []
