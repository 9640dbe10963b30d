"""The operations core: examples for every rule, then properties."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.contracts.models.base import Record
from streams.contracts.models.enums import (
    AlertKind,
    AlertStatus,
    AnomalyKind,
    EvidenceSource,
    OperationEventKind,
    OperationStatus,
    Owner,
    RetryVerdict,
    Severity,
    WorkItemKind,
)
from streams.contracts.models.events import OperationEvent
from streams.contracts.models.outputs import (
    Alert,
    OperationState,
    ReconciliationWorkItem,
    WorkItemResolution,
)
from streams.core.executions import from_ms, to_ms
from streams.core.operations import (
    NEXT_STEP_FORBIDDEN,
    NEXT_STEP_UNKNOWN,
    SETTLED,
    SOURCE_EVIDENCE,
    VERIFIED_BY_SHARED_KEY,
    AttemptRecord,
    OperationBook,
    OperationConfig,
    OperationStep,
    advance,
    apply_event,
    dump_book,
    load_book,
    next_deadline,
    open_operation_ids,
    operation_alert_id,
    resolution_id,
    retry_verdict,
    work_item_id,
)

K = OperationEventKind
S = OperationStatus
E = EvidenceSource
T0 = datetime(2026, 7, 26, 16, 0, tzinfo=UTC)
CFG = OperationConfig()
EXE = "exe-1"

#: the table of docs/rules.md#statuses-and-the-retry-verdict, written out independently of
#: the implementation.
TABLE = {
    S.PREPARED: RetryVerdict.NOTHING_SENT,
    S.SENT: RetryVerdict.WAIT,
    S.ACKNOWLEDGED: RetryVerdict.WAIT,
    S.VERIFIED: RetryVerdict.NOT_NEEDED,
    S.UNKNOWN: RetryVerdict.FORBIDDEN,
    S.FAILED: RetryVerdict.SAFE,
    S.MANUAL_REVIEW: RetryVerdict.OWNER_DECIDES,
    S.RECONCILING: RetryVerdict.WAIT,
    S.CANCELLED: RetryVerdict.SAFE,
}

_ids = itertools.count()


def ev(
    kind: K,
    seconds: float = 0,
    *,
    op: str = "op-1",
    attempt: int = 1,
    key: str | None = "key-1",
    source: E = E.RUNTIME,
    event_id: str | None = None,
    connector: str = "sms",
    **extra: object,
) -> OperationEvent:
    return OperationEvent(
        event_id=event_id or f"ev-{next(_ids)}",
        execution_id=EXE,
        operation_id=op,
        attempt=attempt,
        idempotency_key=key,
        connector=connector,
        kind=kind,
        occurred_at=T0 + timedelta(seconds=seconds),
        evidence_source=source,
        **extra,  # type: ignore[arg-type]
    )


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def ms(seconds: float) -> int:
    """``at(seconds)`` in epoch milliseconds, as the book keeps times."""
    return to_ms(at(seconds))


def run(*events: OperationEvent, book: OperationBook | None = None) -> OperationStep:
    """Apply events in order; the step holds the final book and everything emitted."""
    outputs: list[Record] = []
    anomalies = []
    for e in events:
        step = apply_event(book, e, CFG)
        book = step.book
        outputs += step.outputs
        anomalies += step.anomalies
    assert book is not None
    return OperationStep(book, tuple(outputs), tuple(anomalies))


def of(step: OperationStep, cls: type[Record]) -> list:
    return [o for o in step.outputs if isinstance(o, cls)]


def status(book: OperationBook, op: str = "op-1", attempt: int = 1) -> S:
    return book.operations[op].attempts[attempt].status


def unknown_book() -> OperationBook:
    """op-1 attempt 1 sent at T0 and never answered: UNKNOWN at T0+30 s."""
    book = run(ev(K.PREPARED), ev(K.SENT)).book
    return advance(book, ms(60)).book


# --- retry verdicts -------------------------------------------------------------------------


@pytest.mark.parametrize("st_", list(TABLE))
def test_retry_verdict_is_the_table(st_: S) -> None:
    assert retry_verdict(st_) is TABLE[st_]


def test_unrecognized_status_is_not_retryable() -> None:
    assert retry_verdict(S.UNRECOGNIZED) is RetryVerdict.FORBIDDEN


# --- happy path and deadlines ---------------------------------------------------------------


def test_happy_path_publishes_each_state_with_its_verdict() -> None:
    step = run(
        ev(K.PREPARED),
        ev(K.SENT, 1),
        ev(K.ACKNOWLEDGED, 2, source=E.CONNECTOR),
        ev(K.VERIFIED, 3, source=E.RECONCILER, effect_ref="sms-42"),
    )
    states = of(step, OperationState)
    assert [s.status for s in states] == [S.PREPARED, S.SENT, S.ACKNOWLEDGED, S.VERIFIED]
    assert [s.retry for s in states] == [TABLE[s.status] for s in states]
    assert states[-1].effect_ref == "sms-42"
    assert states[-1].since == at(3)
    assert not of(step, ReconciliationWorkItem) and not step.anomalies
    assert len({s.state_id for s in states}) == 4
    assert advance(step.book, ms(10_000)).outputs == ()
    assert open_operation_ids(step.book) == ()


def test_sent_inherits_the_connector_default_reply_deadline() -> None:
    cfg = OperationConfig(overrides={"bank": (timedelta(minutes=2), timedelta(hours=1))})
    book = apply_event(None, ev(K.SENT), cfg).book
    assert book.operations["op-1"].attempts[1].reply_due_at == ms(30)
    book = apply_event(None, ev(K.SENT, connector="bank"), cfg).book
    assert next_deadline(book) == ms(120)
    book = apply_event(book, ev(K.ACKNOWLEDGED, 5, connector="bank"), cfg).book
    assert next_deadline(book) == ms(5 + 3600)


def test_deadlines_carried_by_the_event_win() -> None:
    step = run(ev(K.SENT, reply_due_at=at(7)))
    assert of(step, OperationState)[0].reply_due_at == at(7)
    step = run(ev(K.ACKNOWLEDGED, 1, verify_due_at=at(99)), book=step.book)
    assert of(step, OperationState)[0].verify_due_at == at(99)
    assert next_deadline(step.book) == ms(99)


def test_config_rejects_non_positive_timeouts() -> None:
    with pytest.raises(ValueError):
        OperationConfig(reply_timeout=timedelta(0))
    with pytest.raises(ValueError):
        OperationConfig(overrides={"x": (timedelta(seconds=1), timedelta(seconds=-1))})


# --- reply timeout: UNKNOWN, never FAILED ---------------------------------------------------


def test_reply_timeout_makes_unknown_with_a_work_item_and_an_alert() -> None:
    book = run(ev(K.PREPARED), ev(K.SENT)).book
    assert advance(book, ms(29.999)).outputs == ()
    step = advance(book, ms(3600))  # noticed an hour late: stamped with the deadline
    state, item, alert = step.outputs
    assert isinstance(state, OperationState) and isinstance(item, ReconciliationWorkItem)
    assert isinstance(alert, Alert)
    assert (state.status, state.reason, state.since) == (S.UNKNOWN, "reply_timeout", at(30))
    assert state.retry is RetryVerdict.FORBIDDEN
    assert state.open_work_item_id == item.work_item_id
    assert item.work_item_id == work_item_id(EXE, "op-1", 1, WorkItemKind.REPLY_TIMEOUT)
    assert (item.kind, item.deadline, item.created_at) == (
        WorkItemKind.REPLY_TIMEOUT,
        at(30),
        at(30),
    )
    assert item.idempotency_key == "key-1"
    assert (alert.kind, alert.status, alert.occurred_at) == (
        AlertKind.OPERATION_UNKNOWN,
        AlertStatus.FIRING,
        at(30),
    )
    assert alert.owner is Owner.CONNECTOR_OWNER and alert.next_step == NEXT_STEP_UNKNOWN
    assert next_deadline(step.book) is None


def test_elapsed_time_never_closes_unknown() -> None:
    book = unknown_book()
    assert advance(book, ms(10**9)).outputs == ()
    assert status(book) is S.UNKNOWN
    assert open_operation_ids(book) == ("op-1",)


def test_late_acknowledgement_settles_nothing() -> None:
    step = run(ev(K.ACKNOWLEDGED, 40, source=E.CONNECTOR), book=unknown_book())
    (state,) = step.outputs
    assert isinstance(state, OperationState)
    assert (state.status, state.reason, state.since) == (
        S.UNKNOWN,
        "late_acknowledgement_ignored",
        at(30),
    )
    assert state.open_work_item_id is not None
    assert advance(step.book, ms(10**6)).outputs == ()


@pytest.mark.parametrize("source", [E.CONNECTOR, E.RECONCILER, E.HUMAN])
@pytest.mark.parametrize("kind", [K.VERIFIED, K.FAILED])
def test_source_evidence_settles_unknown_and_resolves_the_work_item(source: E, kind: K) -> None:
    step = run(ev(kind, 90, source=source), book=unknown_book())
    state, resolution, resolved = step.outputs
    assert isinstance(state, OperationState) and state.status.value == kind.value
    assert state.open_work_item_id is None and state.retry is TABLE[state.status]
    wi = work_item_id(EXE, "op-1", 1, WorkItemKind.REPLY_TIMEOUT)
    assert resolution == WorkItemResolution(
        resolution_id=resolution_id(EXE, "op-1", wi, S(kind.value)),
        work_item_id=wi,
        operation_id="op-1",
        execution_id=EXE,
        attempt=1,
        outcome=S(kind.value),
        evidence_source=source,
        resolved_at=at(90),
    )
    assert isinstance(resolved, Alert) and resolved.status is AlertStatus.RESOLVED
    assert resolved.resolves_alert_id == operation_alert_id(
        EXE, "op-1", 1, AlertKind.OPERATION_UNKNOWN, "reply_timeout"
    )
    assert open_operation_ids(step.book) == ()


@pytest.mark.parametrize("kind", [K.VERIFIED, K.FAILED, K.CANCELLED])
def test_the_runtime_cannot_settle_unknown(kind: K) -> None:
    book = unknown_book()
    step = run(ev(kind, 90, source=E.RUNTIME), book=book)
    assert step.outputs == () and step.book == book
    assert [a.kind for a in step.anomalies] == [AnomalyKind.ILLEGAL_TRANSITION]


def test_cancelled_does_not_settle_unknown_even_from_the_reconciler() -> None:
    step = run(ev(K.CANCELLED, 90, source=E.RECONCILER), book=unknown_book())
    assert step.outputs == () and step.anomalies[0].kind is AnomalyKind.ILLEGAL_TRANSITION


def test_reconciling_and_manual_review_keep_the_work_item_open_until_a_human_outcome() -> None:
    step = run(
        ev(K.RECONCILING, 40, source=E.RECONCILER),
        ev(K.MANUAL_REVIEW, 50, source=E.RECONCILER),
        ev(K.RECONCILING, 60, source=E.HUMAN),
        ev(K.MANUAL_REVIEW, 70, source=E.RECONCILER),
        book=unknown_book(),
    )
    states = of(step, OperationState)
    assert [s.status for s in states] == [S.RECONCILING, S.MANUAL_REVIEW] * 2
    assert [s.retry for s in states] == [RetryVerdict.WAIT, RetryVerdict.OWNER_DECIDES] * 2
    assert all(s.open_work_item_id for s in states)
    assert not of(step, WorkItemResolution) and not step.anomalies
    final = run(ev(K.VERIFIED, 80, source=E.HUMAN), book=step.book)
    (resolution,) = of(final, WorkItemResolution)
    assert resolution.evidence_source is E.HUMAN and resolution.outcome is S.VERIFIED


# --- verification timeout -------------------------------------------------------------------


def test_acknowledged_but_unverified_gets_its_own_work_item() -> None:
    book = run(ev(K.SENT), ev(K.ACKNOWLEDGED, 2, source=E.CONNECTOR)).book
    assert advance(book, ms(301)).outputs == ()
    step = advance(book, ms(302))
    state, item, alert = step.outputs
    assert isinstance(state, OperationState) and isinstance(item, ReconciliationWorkItem)
    assert isinstance(alert, Alert)
    assert (state.status, state.reason, state.since) == (
        S.ACKNOWLEDGED,
        "verification_timeout",
        at(2),
    )
    assert state.retry is RetryVerdict.WAIT and state.open_work_item_id == item.work_item_id
    assert item.kind is WorkItemKind.VERIFICATION_TIMEOUT and item.created_at == at(302)
    assert alert.kind is AlertKind.VERIFICATION_OVERDUE
    assert advance(step.book, ms(10**6)).outputs == ()
    done = run(ev(K.VERIFIED, 400, source=E.RECONCILER), book=step.book)
    assert [type(o) for o in done.outputs] == [OperationState, WorkItemResolution, Alert]


def test_processing_rejection_after_acknowledgement_is_failed() -> None:
    step = run(ev(K.SENT), ev(K.ACKNOWLEDGED, 1), ev(K.FAILED, 2, source=E.CONNECTOR))
    assert of(step, OperationState)[-1].retry is RetryVerdict.SAFE


# --- forbidden retries ----------------------------------------------------------------------

_INTO = {
    S.SENT: (),
    S.ACKNOWLEDGED: (ev(K.ACKNOWLEDGED, 1),),
    S.RECONCILING: (ev(K.RECONCILING, 1, source=E.RECONCILER),),
    S.MANUAL_REVIEW: (ev(K.MANUAL_REVIEW, 1, source=E.RECONCILER),),
}


def _in_status(st_: S) -> OperationBook:
    if st_ is S.UNKNOWN:
        return unknown_book()
    return run(ev(K.SENT), *_INTO[st_]).book


@pytest.mark.parametrize(
    "previous", [S.SENT, S.ACKNOWLEDGED, S.UNKNOWN, S.RECONCILING, S.MANUAL_REVIEW]
)
def test_a_new_attempt_while_the_last_is_unsettled_is_a_forbidden_retry(previous: S) -> None:
    book = _in_status(previous)
    step = run(ev(K.SENT, 100, attempt=2), book=book)
    (alert,) = of(step, Alert)
    assert (alert.kind, alert.status, alert.severity) == (
        AlertKind.FORBIDDEN_RETRY,
        AlertStatus.FIRING,
        Severity.CRITICAL,
    )
    assert alert.owner is Owner.RUNTIME_OWNER and alert.next_step == NEXT_STEP_FORBIDDEN
    assert "attempt=op-1#2" in alert.evidence
    assert f"previous=op-1#1:{previous}" in alert.evidence
    assert alert.occurred_at == at(100)
    # the published state follows the new attempt; the first attempt is untouched
    assert of(step, OperationState)[0].attempt == 2
    assert status(step.book) is previous
    # a redelivery of the duplicate send raises nothing more
    again = apply_event(step.book, ev(K.SENT, 100, attempt=2), CFG)
    assert again.outputs == () and again.anomalies[0].kind is AnomalyKind.DUPLICATE


def test_same_idempotency_key_under_another_operation_id_is_a_forbidden_retry() -> None:
    book = run(ev(K.SENT, op="op-1", key="pay-7")).book
    step = run(ev(K.SENT, 5, op="op-2", key="pay-7"), book=book)
    (alert,) = of(step, Alert)
    assert "previous=op-1#1:SENT" in alert.evidence and "idempotency_key=pay-7" in alert.evidence
    assert alert.subject_id == "op-2"
    other_key = run(ev(K.SENT, 5, op="op-3", key="pay-8"), book=book)
    assert not of(other_key, Alert)


@pytest.mark.parametrize(
    "settle",
    [ev(K.FAILED, 1, source=E.CONNECTOR), ev(K.CANCELLED, 1, source=E.CONNECTOR)],
)
def test_a_retry_after_failed_or_cancelled_is_legitimate(settle: OperationEvent) -> None:
    step = run(ev(K.SENT), settle, ev(K.PREPARED, 10, attempt=2), ev(K.SENT, 11, attempt=2))
    assert not of(step, Alert) and not step.anomalies
    assert of(step, OperationState)[-1].attempt == 2


def test_a_resend_after_verified_is_a_forbidden_retry() -> None:
    step = run(ev(K.SENT), ev(K.VERIFIED, 1, source=E.RECONCILER), ev(K.SENT, 10, attempt=2))
    (alert,) = of(step, Alert)
    assert "previous=op-1#1:VERIFIED" in alert.evidence


def test_preparing_a_new_attempt_is_not_a_send() -> None:
    step = run(ev(K.PREPARED, 100, attempt=2), book=unknown_book())
    assert not of(step, Alert)


def test_an_older_attempt_keeps_its_work_item_and_settles_on_its_own() -> None:
    book = run(ev(K.SENT, 100, attempt=2), book=unknown_book()).book
    assert open_operation_ids(book) == ("op-1",)
    step = run(ev(K.VERIFIED, 200, attempt=1, source=E.RECONCILER), book=book)
    state, resolution, resolved = step.outputs
    # the published state still describes attempt 2, with the verdict attempt 1 released
    assert isinstance(state, OperationState) and (state.attempt, state.status) == (2, S.SENT)
    assert state.retry is RetryVerdict.WAIT and state.held_by_attempt is None
    assert isinstance(resolution, WorkItemResolution) and resolution.attempt == 1
    assert isinstance(resolved, Alert) and resolved.status is AlertStatus.RESOLVED
    assert status(step.book, attempt=1) is S.VERIFIED
    assert open_operation_ids(step.book) == ("op-1",)  # attempt 2 is still SENT
    # the older attempt's own deadline still fires: its work item, and the state of attempt 2
    # with the verdict attempt 1 now holds back
    book = run(ev(K.SENT, attempt=1), ev(K.SENT, 5, attempt=2)).book
    fired = advance(book, ms(31))
    assert [type(o) for o in fired.outputs] == [OperationState, ReconciliationWorkItem, Alert]
    state, item, _ = fired.outputs
    assert (state.attempt, state.status, state.retry) == (2, S.SENT, RetryVerdict.FORBIDDEN)
    assert (state.held_by_attempt, state.open_work_item_id) == (1, item.work_item_id)


# --- refused input --------------------------------------------------------------------------


def test_duplicates_are_anomalies_not_transitions() -> None:
    sent = ev(K.SENT)
    book = run(sent).book
    for dup in (sent, ev(K.SENT, 3)):
        step = apply_event(book, dup, CFG)
        assert step.outputs == () and step.book == book
        assert [a.kind for a in step.anomalies] == [AnomalyKind.DUPLICATE]
    step = run(ev(K.RECONCILING, 1, source=E.RECONCILER), ev(K.RECONCILING, 2), book=book)
    assert [a.kind for a in step.anomalies] == [AnomalyKind.DUPLICATE]


def test_unrecognized_kind_is_an_anomaly() -> None:
    step = apply_event(None, ev(K.UNRECOGNIZED), CFG)
    assert step.outputs == () and step.book.operations == {}
    assert step.anomalies[0].kind is AnomalyKind.UNRECOGNIZED_SYMBOL


def test_another_executions_event_is_a_key_mismatch() -> None:
    book = run(ev(K.SENT)).book
    other = ev(K.SENT, op="op-9").model_copy(update={"execution_id": "exe-2"})
    step = apply_event(book, other, CFG)
    assert step.anomalies[0].kind is AnomalyKind.KEY_MISMATCH and step.book == book


def test_contradicting_evidence_is_refused() -> None:
    book = run(ev(K.SENT), ev(K.FAILED, 1, source=E.CONNECTOR)).book
    step = apply_event(book, ev(K.VERIFIED, 2, source=E.RECONCILER), CFG)
    assert step.anomalies[0].kind is AnomalyKind.ILLEGAL_TRANSITION
    assert "contradicting" in step.anomalies[0].reason and step.book == book
    step = apply_event(book, ev(K.ACKNOWLEDGED, 2), CFG)
    assert step.anomalies[0].kind is AnomalyKind.AFTER_TERMINAL


def test_a_reply_that_overtakes_its_send_counts_as_sent() -> None:
    step = run(ev(K.ACKNOWLEDGED, 1, source=E.CONNECTOR), ev(K.SENT, 0))
    assert [s.status for s in of(step, OperationState)] == [S.ACKNOWLEDGED]
    assert [a.kind for a in step.anomalies] == [AnomalyKind.OUT_OF_ORDER]
    assert next_deadline(step.book) == ms(301)


def test_nothing_to_reconcile_before_a_send_and_no_runtime_cancel_after_it() -> None:
    step = run(ev(K.PREPARED), ev(K.RECONCILING, 1, source=E.RECONCILER))
    assert step.anomalies[0].kind is AnomalyKind.ILLEGAL_TRANSITION
    step = run(ev(K.PREPARED), ev(K.CANCELLED, 1))
    assert of(step, OperationState)[-1].status is S.CANCELLED and not step.anomalies
    step = run(ev(K.SENT), ev(K.CANCELLED, 1, source=E.RUNTIME))
    assert step.anomalies[0].kind is AnomalyKind.ILLEGAL_TRANSITION
    step = run(ev(K.SENT), ev(K.CANCELLED, 1, source=E.CONNECTOR))
    assert of(step, OperationState)[-1].status is S.CANCELLED


def test_the_book_round_trips_through_json() -> None:
    book = run(ev(K.SENT, 100, attempt=2, op="op-1"), ev(K.PREPARED, op="op-2", key=None)).book
    book = run(ev(K.SENT, 101, op="op-3"), book=unknown_book()).book
    assert load_book(dump_book(book)) == book
    assert load_book(_format_1(book)) == book


def _format_1(book: OperationBook) -> str:
    """The book as format 1 stored it (what 6733ee4 wrote): one JSON object, times in ISO
    8601 with microseconds, the fields that are None left out."""

    def iso(value: int | None) -> str | None:
        return None if value is None else from_ms(value).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    def attempt(rec: AttemptRecord) -> dict[str, object]:
        fields = rec._asdict()
        for name in ("since", "reply_due_at", "verify_due_at"):
            fields[name] = iso(fields[name])
        return {k: v for k, v in fields.items() if v is not None}

    return json.dumps(
        {
            "execution_id": book.execution_id,
            "operations": {
                op_id: {
                    "operation_id": op.operation_id,
                    "attempts": {str(n): attempt(rec) for n, rec in op.attempts.items()},
                }
                for op_id, op in book.operations.items()
            },
            "by_idempotency_key": book.by_idempotency_key,
        }
    )


# --- properties -----------------------------------------------------------------------------

#: Every kind, weighted towards the ones that move an operation, so that long stories
#: (send, timeout, evidence, retry) are common rather than lucky.
_KINDS = [*K, K.SENT, K.SENT, K.ACKNOWLEDGED, K.VERIFIED, K.FAILED, K.FAILED]
_SOURCES = [*E, E.CONNECTOR, E.RECONCILER]


@dataclass(frozen=True)
class Tick:
    seconds: int


_event = st.builds(
    lambda kind, op, attempt, key, source, seconds, ident, due: ev(
        kind,
        seconds,
        op=op,
        attempt=attempt,
        key=key,
        source=source,
        event_id=f"e{ident}",
        reply_due_at=at(seconds + due) if due is not None and kind is K.SENT else None,
        verify_due_at=at(seconds + due) if due is not None and kind is K.ACKNOWLEDGED else None,
    ),
    st.sampled_from(_KINDS),
    st.sampled_from(["op-a", "op-a", "op-b"]),
    st.integers(1, 2),
    st.sampled_from([None, "k1", "k2"]),
    st.sampled_from(_SOURCES),
    st.integers(0, 900),
    st.integers(0, 400),  # event ids: occasionally the same id again
    st.none() | st.integers(-5, 400),
)
_tick = st.builds(Tick, st.integers(0, 1200))
_random = st.lists(_event | _tick, max_size=50)
#: A send that times out, then whatever evidence, retries and ticks follow: random lists
#: rarely get there, and this is where money is lost.
_after_timeout = st.builds(
    lambda tail: [ev(K.SENT, op="op-a", key="k1", event_id="e-sent"), Tick(31), *tail],
    st.lists(
        _event.map(lambda e: e.model_copy(update={"operation_id": "op-a"})) | _tick,
        max_size=20,
    ),
)
_steps = _random | _after_timeout


def _play(steps: list) -> list[tuple[object, OperationStep, OperationBook | None]]:
    """Fold the steps; for each: the input, what the core answered, and the book before."""
    book: OperationBook | None = None
    log = []
    for s in steps:
        if isinstance(s, Tick):
            if book is None:
                continue
            step = advance(book, ms(s.seconds))
        else:
            step = apply_event(book, s, CFG)
        log.append((s, step, book))
        book = step.book
    return log


def _attempt_status(book: OperationBook | None, op: str, attempt: int) -> S | None:
    if book is None or op not in book.operations:
        return None
    rec = book.operations[op].attempts.get(attempt)
    return rec.status if rec else None


@settings(max_examples=400, deadline=None)
@given(_steps)
def test_unknown_settles_only_on_source_evidence_and_a_timeout_never_fails(steps: list) -> None:
    timed_out: set[tuple[str, int]] = set()
    for s, step, before in _play(steps):
        after = step.book
        for op_id, op in after.operations.items():
            for a, rec in op.attempts.items():
                old = _attempt_status(before, op_id, a)
                if old is rec.status:
                    continue
                if isinstance(s, Tick):  # time alone: only SENT → UNKNOWN
                    assert (old, rec.status) == (S.SENT, S.UNKNOWN)
                    timed_out.add((op_id, a))
                    continue
                if (s.operation_id, s.attempt) != (op_id, a):
                    # only the event's attempt, or one a source's VERIFIED settles by the
                    # idempotency key they share
                    verified = after.operations[s.operation_id].attempts[s.attempt]
                    assert s.kind is K.VERIFIED and s.evidence_source in SOURCE_EVIDENCE
                    assert verified.status is S.VERIFIED
                    assert old in (S.UNKNOWN, S.RECONCILING) and rec.status is S.VERIFIED
                    assert rec.reason == VERIFIED_BY_SHARED_KEY
                    assert rec.idempotency_key == verified.idempotency_key is not None
                    continue
                if old in (S.UNKNOWN, S.RECONCILING, S.MANUAL_REVIEW) and rec.status in SETTLED:
                    assert s.kind in (K.VERIFIED, K.FAILED)
                    assert s.evidence_source in SOURCE_EVIDENCE
                if rec.status is S.FAILED and (op_id, a) in timed_out:
                    assert s.kind is K.FAILED and s.evidence_source in SOURCE_EVIDENCE
        for o in step.outputs:
            if isinstance(s, Tick):
                assert not isinstance(o, WorkItemResolution)
            if not isinstance(o, OperationState):
                continue
            was = _attempt_status(before, o.operation_id, o.attempt)
            if isinstance(s, Tick) and o.status in SETTLED:
                assert was is o.status  # published again for its verdict, not settled by time
            if o.status is S.FAILED and was is not S.FAILED:
                assert isinstance(s, OperationEvent) and s.kind is K.FAILED


@settings(max_examples=400, deadline=None)
@given(_steps)
def test_every_published_state_carries_the_tables_verdict(steps: list) -> None:
    """The table's verdict for the status of the attempt that gives it: the latest attempt's
    own, or the one named as holding it back (test_core_operation_verdict: which one)."""
    for _, step, _ in _play(steps):
        for o in step.outputs:
            if isinstance(o, OperationState):
                assert o.retry is TABLE[o.status if o.held_by_status is None else o.held_by_status]


@settings(max_examples=300, deadline=None)
@given(_steps)
def test_replay_and_redelivery_give_the_same_ids(steps: list) -> None:
    first = [step.outputs for _, step, _ in _play(steps)]
    assert first == [step.outputs for _, step, _ in _play(steps)]
    items = [o for outs in first for o in outs if isinstance(o, ReconciliationWorkItem)]
    assert len({i.work_item_id for i in items}) == len(items)  # each item opened once
    for i in items:
        assert i.work_item_id == work_item_id(i.execution_id, i.operation_id, i.attempt, i.kind)
    opened = {i.work_item_id for i in items}
    for outs in first:
        for o in outs:
            if isinstance(o, WorkItemResolution):
                assert o.work_item_id in opened
    # a redelivery of any applied event is refused and changes nothing
    for s, step, _ in _play(steps):
        if isinstance(s, OperationEvent) and step.outputs:
            again = apply_event(step.book, s, CFG)
            assert again.outputs == () and again.book == step.book
            assert again.anomalies[0].kind is AnomalyKind.DUPLICATE


@settings(max_examples=300, deadline=None)
@given(_steps, st.integers(0, 1500), st.integers(0, 1500))
def test_advance_is_idempotent_and_steps_equal_one_big_step(steps: list, t1: int, t2: int) -> None:
    log = _play(steps)
    if not log:
        return
    book = log[-1][1].book
    lo, hi = ms(min(t1, t2)), ms(max(t1, t2))
    once = advance(book, hi)
    again = advance(once.book, hi)
    assert again.outputs == () and again.book == once.book
    first = advance(book, lo)
    second = advance(first.book, hi)
    assert first.outputs + second.outputs == once.outputs
    assert second.book == once.book
    deadline = next_deadline(once.book)
    assert deadline is None or deadline > hi


@settings(max_examples=200, deadline=None)
@given(_steps)
def test_every_book_is_stored_and_read_back_equal_in_both_formats(steps: list) -> None:
    """Format 2 as written, and format 1 as entries made before it hold the same book; the
    open operations and the next deadline kept with the book are those its attempts say."""
    for _, step, _ in _play(steps):
        book = step.book
        assert load_book(dump_book(book)) == book
        assert load_book(_format_1(book)) == book
        assert open_operation_ids(book) == tuple(
            sorted(
                op_id
                for op_id, op in book.operations.items()
                if op.current.status not in SETTLED
                or any(r.status not in SETTLED and r.sent for r in op.attempts.values())
            )
        )
        armed = [
            r.reply_due_at if r.status is S.SENT else r.verify_due_at
            for op in book.operations.values()
            for r in op.attempts.values()
            if r.status is S.SENT or (r.status is S.ACKNOWLEDGED and r.work_item_id is None)
        ]
        assert next_deadline(book) == min(armed, default=None)
