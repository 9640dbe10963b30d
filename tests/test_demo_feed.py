"""``vigil demo``'s live feed (``streams.local.demo.Feed``), without Kafka: each read's lines in
event-time order whatever order the topics gave them, a record read again shown once, and a
RESOLVED alert naming the alert it ends (its kind, the verdict that fired it), not only the
verdict it moves to."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from streams.contracts.models.enums import (
    AlertKind,
    AlertStatus,
    EvidenceSource,
    ExecutionStatus,
    OperationStatus,
    Owner,
    RetryVerdict,
    Severity,
    WorkItemKind,
)
from streams.contracts.models.events import ClockTick
from streams.contracts.models.outputs import (
    Alert,
    ExecutionState,
    OperationState,
    ReconciliationWorkItem,
    WorkItemResolution,
)
from streams.engine.processor import Processor, Stores
from streams.local.demo import Feed, describe
from streams.local.scenario import Tick, demo_scenario
from tests.test_processor import TOPICS, env

T = datetime(2026, 7, 26, 16, 0, tzinfo=UTC)


def at(minutes: float) -> datetime:
    return T + timedelta(minutes=minutes)


def retry_alert(status: AlertStatus, minutes: float, **kw: object) -> Alert:
    fields: dict[str, object] = dict(
        alert_id="alert-fr",
        kind=AlertKind.FORBIDDEN_RETRY,
        status=status,
        severity=Severity.CRITICAL,
        execution_id="exec-refund",
        subject_id="op-refund-1",
        verdict="UNKNOWN",
        owner=Owner.RUNTIME_OWNER,
        next_step="stop the duplicate",
        occurred_at=at(minutes),
    )
    fields.update(kw)
    return Alert(**fields)  # type: ignore[arg-type]


def test_a_reads_lines_come_in_event_time_order() -> None:
    state = ExecutionState(
        execution_id="exec-1",
        status=ExecutionStatus.RUNNING,
        since=at(5),
        first_seen_at=at(0),
        last_event_at=at(5),
        last_sequence=2,
        terminal=False,
        state_id="s-1",
    )
    op = OperationState(
        operation_id="op-1",
        execution_id="exec-1",
        attempt=1,
        connector="sms",
        status=OperationStatus.UNKNOWN,
        retry=RetryVerdict.FORBIDDEN,
        since=at(3),
        state_id="o-1",
    )
    item = ReconciliationWorkItem(
        work_item_id="wi-1",
        operation_id="op-1",
        execution_id="exec-1",
        attempt=1,
        connector="sms",
        kind=WorkItemKind.REPLY_TIMEOUT,
        deadline=at(3),
        created_at=at(3),
    )
    resolution = WorkItemResolution(
        resolution_id="wr-1",
        work_item_id="wi-1",
        operation_id="op-1",
        execution_id="exec-1",
        attempt=1,
        outcome=OperationStatus.VERIFIED,
        evidence_source=EvidenceSource.RECONCILER,
        resolved_at=at(4),
    )
    feed = Feed()
    for record in (state, resolution, op, item):  # as the topics gave them
        assert feed.add(record)
    lines = feed.lines()
    assert [(line[0], line[1]) for line in lines] == [
        ("16:03:00", "operation"),
        ("16:03:00", "work item"),
        ("16:04:00", "resolved"),
        ("16:05:00", "execution"),
    ]
    # the resolution, read before its work item, still says what it ends
    assert lines[2][3].startswith("ends attempt 1's UNKNOWN (REPLY_TIMEOUT work item)")
    assert not feed.add(op) and feed.lines() == []  # read again: shown once


def test_a_resolved_alert_names_the_alert_it_ends() -> None:
    fired = retry_alert(AlertStatus.FIRING, 3)
    ended = retry_alert(
        AlertStatus.RESOLVED,
        9,
        alert_id="alert-fr-end",
        severity=Severity.INFO,
        verdict="VERIFIED",
        next_step="none: every attempt it named is settled",
        resolves_alert_id="alert-fr",
    )
    feed = Feed()
    feed.add(ended)
    feed.add(fired)
    first, second = feed.lines()
    assert first[1] == "alert firing" and "CRITICAL FORBIDDEN_RETRY UNKNOWN" in first[3]
    assert second[1] == "alert resolved"
    assert second[3] == (
        "ends the CRITICAL FORBIDDEN_RETRY UNKNOWN fired 16:03:00 → VERIFIED: "
        "none: every attempt it named is settled"
    )
    unseen = (describe(ended) or ("", "", "", ""))[3]
    assert unseen.startswith("ends the FORBIDDEN_RETRY alert alert-fr → VERIFIED")


def test_the_demo_scenarios_outputs_read_topic_by_topic_come_out_in_time_order() -> None:
    """The bundled scenario's outputs, read one topic after another as a consumer of all
    of them may get them: the feed shows them in the order they took effect."""
    proc = Processor(TOPICS, Stores())
    out = []
    for s in demo_scenario():
        if isinstance(s, Tick):
            for spec in TOPICS.inputs():
                for p in range(3):
                    tick = ClockTick(ticker_id="t", partition=p, occurred_at=s.at)
                    out += proc.handle(env(tick, spec.name, key="", partition=p))
        else:
            out += proc.handle(env(s))
    by_topic = sorted(out, key=lambda e: e.topic)
    feed = Feed()
    for e in by_topic:
        feed.add(e.record)
    lines = feed.lines()
    assert len(lines) > 20
    times = [line[0] for line in lines if line[0] != "-"]
    assert times == sorted(times)
    resolved = [line for line in lines if line[1] == "alert resolved"]
    assert resolved and all(line[3].startswith("ends the ") for line in resolved)
    assert not any("alert alert-" in line[3] for line in resolved)  # each names its alert
