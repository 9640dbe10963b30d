"""Every attempt that still blocks a retry, in the console's view (without Kafka): attempt 1
UNKNOWN under a VERIFIED attempt 2 is counted, filtered and reviewable; the attempts follow
from the rows whatever order the topics are read in; an alert written before its kind was
ended is not counted as firing (docs/rules.md#alert-lifecycle)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streams.console.attempts import WorkItem, blocks_retry, derive
from streams.console.review import ReviewAction, ReviewRequest, decide
from streams.console.view import ConsoleView, Incoming
from streams.contracts.models.base import replace
from streams.contracts.models.enums import (
    AlertKind,
    AlertStatus,
    EvidenceSource,
    OperationEventKind,
    OperationStatus,
    Severity,
    WorkItemKind,
)
from streams.contracts.models.events import ClockTick, OperationEvent
from streams.contracts.models.outputs import (
    Alert,
    OperationState,
    ReconciliationWorkItem,
    WorkItemResolution,
)
from streams.engine.processor import Processor, Stores
from streams.kafka.partitioning import partition_of
from tests.test_processor import TOPICS, env

S = OperationStatus
K = OperationEventKind
T0 = datetime(2026, 7, 26, 16, 0, tzinfo=UTC)
EX, OP = "exec-pay", "op-pay-1"
CONSOLE_TOPICS = {
    TOPICS.execution_state.name,
    TOPICS.operation_state.name,
    TOPICS.approval_verdicts.name,
    TOPICS.reconciliation_work.name,
    TOPICS.alerts.name,
}


def op_event(attempt: int, kind: K, seconds: float, key: str, **kw: object) -> OperationEvent:
    return OperationEvent(
        event_id=f"{OP}-{attempt}-{kind}",
        execution_id=EX,
        operation_id=OP,
        attempt=attempt,
        idempotency_key=key,
        connector="payments",
        kind=kind,
        occurred_at=T0 + timedelta(seconds=seconds),
        **kw,  # type: ignore[arg-type]
    )


def outputs(*steps: OperationEvent | datetime) -> list[Incoming]:
    """The steps (events, and ticks at the given times) through the pure Processor: the
    console topics' records with the partitions and offsets a broker would give them."""
    proc = Processor(TOPICS, Stores())
    emissions = []
    for s in steps:
        if isinstance(s, datetime):
            for spec in TOPICS.inputs():
                for p in range(3):
                    tick = ClockTick(ticker_id="t", partition=p, occurred_at=s)
                    emissions += proc.handle(env(tick, spec.name, key="", partition=p))
        else:
            emissions += proc.handle(env(s))
    offsets: dict[tuple[str, int], int] = {}
    out = []
    for e in emissions:
        if e.topic not in CONSOLE_TOPICS:
            continue
        p = partition_of(e.key or "", 3)
        o = offsets.get((e.topic, p), 0)
        offsets[(e.topic, p)] = o + 1
        out.append(Incoming(e.topic, p, o, e.record))
    return out


#: attempt 1 times out (UNKNOWN); attempt 2, under another key, is sent, times out, and is
#: verified at the source: the operation is VERIFIED, its retry still FORBIDDEN by attempt 1
STORY = outputs(
    op_event(1, K.SENT, 0, "k-1"),
    T0 + timedelta(seconds=40),
    op_event(2, K.SENT, 60, "k-2"),
    T0 + timedelta(seconds=100),
    op_event(2, K.VERIFIED, 120, "k-2", evidence_source=EvidenceSource.CONNECTOR),
    T0 + timedelta(seconds=121),
)


@pytest.fixture
def view(tmp_path: Path) -> ConsoleView:
    v = ConsoleView(tmp_path / "console.sqlite3", clock=lambda: T0.timestamp() + 3600)
    yield v
    v.close()


def test_an_unknown_attempt_under_a_verified_one_is_counted_listed_and_filtered(
    view: ConsoleView,
) -> None:
    view.apply(STORY)
    (op,) = view.query("operations", {"execution_id": EX}).items
    assert (op["attempt"], op["status"], op["retry"]) == (2, "VERIFIED", "FORBIDDEN")
    assert op["attempts"] == [
        {
            "attempt": 1,
            "status": "UNKNOWN",
            "blocks_retry": True,
            "open_work_item_id": op["open_work_item_id"],
        },
        {"attempt": 2, "status": "VERIFIED", "blocks_retry": False, "open_work_item_id": None},
    ]
    assert op["blocking"] is True and op["owner"] == "CONNECTOR_OWNER"
    summary = view.summary()
    assert summary["operations_by_status"] == {"VERIFIED": 1}  # the latest attempts
    assert summary["attempts_blocking_by_status"] == {"UNKNOWN": 1}
    assert summary["operations_blocking"] == 1
    for params in ({"status": "UNKNOWN"}, {"status": "VERIFIED"}, {"blocking": "true"}):
        assert [o["operation_id"] for o in view.query("operations", params).items] == [OP]
    assert view.query("operations", {"blocking": "false"}).items == []
    assert view.query("operations", {"status": "FAILED"}).items == []
    assert view.attempts(EX, OP) == {1: S.UNKNOWN, 2: S.VERIFIED}


def test_attempt_1_is_reviewable_by_its_number(view: ConsoleView) -> None:
    view.apply(STORY)
    state = OperationState.model_validate_json(
        view.execute_read("SELECT record FROM operations")[0]["record"]
    )
    req = ReviewRequest(ReviewAction.VERIFIED, "statement line 4", "alice", attempt=1)
    event = decide(state, OP, req, T0 + timedelta(hours=1), view.attempts(EX, OP))
    assert isinstance(event, OperationEvent)
    assert (event.attempt, event.kind, event.evidence_source) == (
        1,
        K.VERIFIED,
        EvidenceSource.HUMAN,
    )
    # attempt 2 is settled: the console refuses what the pipeline would
    refused = decide(
        state,
        OP,
        ReviewRequest(ReviewAction.FAILED, "n", "bob", attempt=2),
        T0,
        view.attempts(EX, OP),
    )
    assert not isinstance(refused, OperationEvent) and refused.status == 409
    unknown = decide(state, OP, ReviewRequest(ReviewAction.TAKE, "n", "bob", attempt=7), T0, {})
    assert not isinstance(unknown, OperationEvent) and "knows attempts 2" in unknown.message


def test_a_settled_attempt_stays_settled_whatever_was_read_last(view: ConsoleView) -> None:
    """A resolution read before an older state naming the attempt as holder: settled is
    final, so attempt 1 is VERIFIED however the two topics interleave."""
    story = outputs(
        op_event(1, K.SENT, 0, "k-1"),
        T0 + timedelta(seconds=40),
        op_event(2, K.SENT, 60, "k-2"),
        op_event(1, K.VERIFIED, 70, "k-1", evidence_source=EvidenceSource.RECONCILER),
        T0 + timedelta(seconds=71),
    )
    work = [i for i in story if i.topic == TOPICS.reconciliation_work.name]
    rest = [i for i in story if i.topic != TOPICS.reconciliation_work.name]
    view.apply(work)
    view.apply(rest)
    assert view.attempts(EX, OP) == {1: S.VERIFIED, 2: S.SENT}
    assert view.summary()["attempts_blocking_by_status"] == {"SENT": 1}


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.randoms(use_true_random=False))
def test_the_attempts_follow_from_the_rows_not_the_reading_order(tmp_path_factory, rnd) -> None:
    """The console reads each topic partition in order but the topics in any interleaving:
    the attempts come out the same."""
    by_partition: dict[tuple[str, int], list[Incoming]] = {}
    for item in STORY:
        by_partition.setdefault((item.topic, item.partition), []).append(item)
    queues = [list(q) for q in by_partition.values()]
    mixed: list[Incoming] = []
    while any(queues):
        q = rnd.choice([q for q in queues if q])
        mixed.append(q.pop(0))
    path = tmp_path_factory.mktemp("mix") / "console.sqlite3"
    v = ConsoleView(path)
    try:
        for i in range(0, len(mixed), 3):
            v.apply(mixed[i : i + 3])
        assert v.attempts(EX, OP) == {1: S.UNKNOWN, 2: S.VERIFIED}
        assert v.summary()["attempts_blocking_by_status"] == {"UNKNOWN": 1}
    finally:
        v.close()


def test_derive_prefers_what_says_most() -> None:
    item = ReconciliationWorkItem(
        work_item_id="wi-1",
        operation_id=OP,
        execution_id=EX,
        attempt=1,
        connector="payments",
        kind=WorkItemKind.VERIFICATION_TIMEOUT,
        deadline=T0,
        created_at=T0,
    )
    assert [(a.attempt, a.status) for a in derive(None, [WorkItem(item)])] == [(1, S.ACKNOWLEDGED)]
    resolution = WorkItemResolution(
        resolution_id="wr-1",
        work_item_id="wi-1",
        operation_id=OP,
        execution_id=EX,
        attempt=1,
        outcome=S.FAILED,
        evidence_source=EvidenceSource.CONNECTOR,
        resolved_at=T0,
    )
    (a,) = derive(None, [WorkItem(item, resolution)])
    assert (a.status, a.blocks_retry, a.open_work_item_id) == (S.FAILED, False, None)
    assert blocks_retry(S.UNRECOGNIZED) and not blocks_retry(S.PREPARED)


def test_an_alert_of_a_kind_never_ended_before_is_not_counted_firing(view: ConsoleView) -> None:
    story = outputs(
        op_event(1, K.SENT, 0, "k-1"), op_event(2, K.SENT, 5, "k-1"), T0 + timedelta(seconds=6)
    )
    (retry,) = [
        i
        for i in story
        if isinstance(i.record, Alert) and i.record.kind is AlertKind.FORBIDDEN_RETRY
    ]
    assert isinstance(retry.record, Alert) and retry.record.ends_with_resolved
    old = replace(retry.record, alert_id="alert-old", ends_with_resolved=False)
    view.apply([*story, Incoming(retry.topic, retry.partition, 10_000, old)])
    firing = {a["alert_id"] for a in view.query("alerts", {}).items}
    assert retry.record.alert_id in firing and "alert-old" not in firing
    assert view.summary()["alerts_firing_by_severity"] == {"CRITICAL": 1}
    ended = replace(
        retry.record,
        alert_id="alert-end",
        status=AlertStatus.RESOLVED,
        severity=Severity.INFO,
        resolves_alert_id=retry.record.alert_id,
        ends_with_resolved=False,
    )
    view.apply([Incoming(retry.topic, retry.partition, 10_001, ended)])
    assert view.summary()["alerts_firing_by_severity"] == {}
