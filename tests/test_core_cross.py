"""The receiving side of a blind retry across executions (streams/core/cross.py): what an
execution keeps of the other execution's attempt, its verdict with that attempt in it, the one
FORBIDDEN_RETRY alert of a conflict (docs/rules.md#blind-retries-across-executions); and the
processor's shell around it (claims and progress out, links in)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from streams.contracts.envelope import Envelope
from streams.contracts.models.enums import (
    AlertKind,
    OperationEventKind,
    OperationStatus,
    RetryVerdict,
)
from streams.contracts.models.events import ClockTick, OperationEvent
from streams.contracts.models.outputs import (
    Alert,
    ClaimsProgress,
    IdempotencyClaim,
    OperationState,
    RetryLink,
)
from streams.core import cross
from streams.engine.processor import Processor, Stores
from streams.kafka.partitioning import partition_of
from streams.kafka.topics import Topics
from streams.settings import Settings

S = OperationStatus
T0 = datetime(2026, 7, 26, 9, 16, 5, tzinfo=UTC)
TOPICS = Topics.from_settings(Settings())


def link(kind: str, role: str, status: S, at: timedelta, n: int = 0, **kw: object) -> RetryLink:
    fields = {
        "link_id": f"link-{kind}-{status}-{n}",
        "conflict_id": "xretry-1",
        "kind": kind,
        "role": role,
        "execution_id": "exec-b",
        "operation_id": "charge-1",
        "attempt": 1,
        "other_execution_id": "exec-a",
        "other_operation_id": "charge-1",
        "other_attempt": 1,
        "other_status": status,
        "connector": "payments",
        "idempotency_key": "order-42",
        "occurred_at": T0 + at,
    } | kw
    return RetryLink(**fields)  # type: ignore[arg-type]


def state(status: S = S.SENT, retry: RetryVerdict = RetryVerdict.WAIT) -> OperationState:
    return OperationState(
        operation_id="charge-1",
        execution_id="exec-b",
        attempt=1,
        idempotency_key="order-42",
        connector="payments",
        status=status,
        retry=retry,
        since=T0,
        state_id="os-base",
    )


def ms(d: timedelta) -> int:
    return int((T0 + d).timestamp() * 1000)


def test_the_other_attempt_holds_the_verdict_while_it_is_unsettled() -> None:
    conflict = link("CONFLICT", "RETRY", S.UNKNOWN, timedelta(minutes=4))
    links, changed = cross.apply_link(None, conflict, ms(timedelta(minutes=4)))
    assert changed
    held = cross.overlay(state(), links)
    assert held.retry is RetryVerdict.FORBIDDEN and held.status is S.SENT
    assert (held.held_by_execution_id, held.held_by_operation_id) == ("exec-a", "charge-1")
    assert (held.held_by_attempt, held.held_by_status) == (1, S.UNKNOWN)
    assert held.state_id != "os-base"
    # the other attempt FAILED: the verdict is the operation's own again
    failed = link("UPDATE", "RETRY", S.FAILED, timedelta(minutes=6))
    links, _ = cross.apply_link(links, failed, ms(timedelta(minutes=6)))
    assert cross.overlay(state(), links) == state()


def test_the_earlier_side_names_the_duplicate_even_when_its_own_status_forbids_more() -> None:
    held_side = link(
        "CONFLICT",
        "HELD",
        S.SENT,
        timedelta(minutes=4),
        execution_id="exec-a",
        other_execution_id="exec-b",
    )
    links, _ = cross.apply_link(None, held_side, ms(timedelta(minutes=4)))
    mine = state(S.UNKNOWN, RetryVerdict.FORBIDDEN).model_copy(update={"execution_id": "exec-a"})
    shown = cross.overlay(mine, links)
    assert shown.retry is RetryVerdict.FORBIDDEN and shown.held_by_status is S.SENT
    assert shown.held_by_execution_id == "exec-b"


def test_a_verified_other_attempt_is_named_and_the_own_wait_stays() -> None:
    links, _ = cross.apply_link(
        None, link("CONFLICT", "RETRY", S.VERIFIED, timedelta(0)), ms(timedelta(0))
    )
    shown = cross.overlay(state(), links)
    assert shown.retry is RetryVerdict.WAIT and shown.held_by_status is S.VERIFIED


def test_a_redelivered_or_older_link_changes_nothing() -> None:
    first = link("CONFLICT", "RETRY", S.UNKNOWN, timedelta(minutes=4))
    links, _ = cross.apply_link(None, first, ms(timedelta(minutes=4)))
    assert cross.apply_link(links, first, ms(timedelta(minutes=4))) == (links, False)
    older = link("UPDATE", "RETRY", S.FAILED, timedelta(minutes=1), n=1)
    after, changed = cross.apply_link(links, older, ms(timedelta(minutes=1)))
    assert changed and cross.overlay(state(), after) == cross.overlay(state(), links)
    assert cross.load_links(cross.dump_links(after)) == after


def test_one_alert_per_conflict_from_the_later_sends_side() -> None:
    retry = link("CONFLICT", "RETRY", S.UNKNOWN, timedelta(minutes=4))
    alert = cross.blind_retry_alert(retry)
    assert alert is not None and alert.kind is AlertKind.FORBIDDEN_RETRY
    assert "previous_execution=exec-a" in alert.evidence and alert.execution_id == "exec-b"
    assert cross.blind_retry_alert(link("CONFLICT", "HELD", S.SENT, timedelta(0))) is None
    assert cross.blind_retry_alert(link("UPDATE", "RETRY", S.FAILED, timedelta(0))) is None


# -- the processor's shell ----------------------------------------------------------------
def _env(topic: str, record: object, offset: int, partition: int | None = None) -> Envelope:
    key = getattr(record, "execution_id", None)
    p = (
        partition
        if partition is not None
        else partition_of(key, TOPICS.execution_status.partitions)
    )
    ts = int(record.occurred_at.timestamp() * 1000)  # type: ignore[attr-defined]
    return Envelope(topic, p, offset, ts, key.encode() if key else None, b"", record, None)  # type: ignore[arg-type]


def test_the_live_processor_claims_publishes_progress_and_applies_links() -> None:
    proc = Processor(TOPICS, Stores(), cross_execution=True)
    sent = OperationEvent(
        event_id="b-1",
        execution_id="exec-b",
        operation_id="charge-1",
        attempt=1,
        idempotency_key="order-42",
        connector="payments",
        kind=OperationEventKind.SENT,
        occurred_at=T0,
    )
    p = partition_of("exec-b", TOPICS.execution_status.partitions)
    out = proc.handle(_env(TOPICS.operation_events.name, sent, 0))
    for i, spec in enumerate(TOPICS.inputs()):
        tick = ClockTick(ticker_id="t", partition=p, occurred_at=T0 + timedelta(seconds=1))
        out += proc.handle(_env(spec.name, tick, 1 + i, p))
    claims = [e for e in out if isinstance(e.record, IdempotencyClaim)]
    assert [(e.key, e.record.status) for e in claims] == [("payments/order-42", S.SENT)]
    progress = [e for e in out if isinstance(e.record, ClaimsProgress)]
    assert sorted(e.partition for e in progress) == list(range(TOPICS.execution_status.partitions))
    assert out.index(claims[0]) < out.index(progress[0])  # claims before the progress
    conflict = link("CONFLICT", "RETRY", S.UNKNOWN, timedelta(minutes=4))
    got = [e.record for e in proc.handle(_env(TOPICS.retry_links.name, conflict, 0, p))]
    states = [r for r in got if isinstance(r, OperationState)]
    alerts = [r for r in got if isinstance(r, Alert)]
    assert [(s.retry, s.held_by_execution_id) for s in states] == [
        (RetryVerdict.FORBIDDEN, "exec-a")
    ]
    assert [a.kind for a in alerts] == [AlertKind.FORBIDDEN_RETRY]
    assert proc.handle(_env(TOPICS.retry_links.name, conflict, 1, p)) == []  # redelivered


def test_the_pure_processor_publishes_no_claims() -> None:
    proc = Processor(TOPICS, Stores())
    sent = OperationEvent(
        event_id="b-1",
        execution_id="exec-b",
        operation_id="charge-1",
        attempt=1,
        idempotency_key="order-42",
        connector="payments",
        kind=OperationEventKind.SENT,
        occurred_at=T0,
    )
    p = partition_of("exec-b", TOPICS.execution_status.partitions)
    out = proc.handle(_env(TOPICS.operation_events.name, sent, 0))
    for i, spec in enumerate(TOPICS.inputs()):
        tick = ClockTick(ticker_id="t", partition=p, occurred_at=T0 + timedelta(seconds=1))
        out += proc.handle(_env(spec.name, tick, 1 + i, p))
    assert not [e for e in out if e.topic in {t.name for t in TOPICS.internal()}]
    assert any(isinstance(e.record, OperationState) for e in out)
