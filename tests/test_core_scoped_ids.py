"""Ids and keys scoped by the execution, and attempts settled by a shared idempotency key.

Operation ids and approval request ids repeat across executions (agent frameworks name tool
calls ``call_1``, ``charge-1``): every id and key derived from one is scoped by its execution
(docs/rules.md#ids-and-keys). A source's VERIFIED of one attempt settles the other UNKNOWN
attempts carrying its idempotency key (docs/rules.md#shared-idempotency-key-evidence).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.contracts.keys import scoped_key, split_key
from streams.contracts.models.enums import (
    AlertKind,
    AlertStatus,
    ApprovalVerdictCode,
    EvidenceSource,
    OperationEventKind,
    OperationStatus,
    WorkItemKind,
)
from streams.contracts.models.events import OperationEvent
from streams.contracts.models.outputs import (
    Alert,
    OperationState,
    ReconciliationWorkItem,
    WorkItemResolution,
)
from streams.core.approvals.evaluation import verdict_id
from streams.core.executions import to_ms
from streams.core.operations import (
    VERIFIED_BY_SHARED_KEY,
    OperationBook,
    OperationConfig,
    advance,
    apply_event,
    open_operation_ids,
    operation_alert_id,
    resolution_id,
    work_item_id,
)

K = OperationEventKind
S = OperationStatus
E = EvidenceSource
CFG = OperationConfig()

# Any text an id may hold: the separator, escapes, the hash's own separator, non-ASCII,
# lone surrogates.
ids = st.text(
    alphabet=st.sampled_from(["a", "b", "2", "F", "/", "%", "\x1f", ":", " ", "é", "\udc80", "-"]),
    max_size=8,
)
any_ids = st.one_of(ids, st.text(max_size=12))


# --- the key encoding -----------------------------------------------------------------------


@given(any_ids, any_ids)
def test_a_scoped_key_splits_back_into_its_parts(execution_id: str, local_id: str) -> None:
    key = scoped_key(execution_id, local_id)
    assert split_key(key) == (execution_id, local_id)
    assert "\x1f" not in key and key.count("/") == 1


@given(any_ids, any_ids, any_ids, any_ids)
def test_scoped_keys_are_equal_only_for_equal_parts(a: str, b: str, c: str, d: str) -> None:
    assert (scoped_key(a, b) == scoped_key(c, d)) == ((a, b) == (c, d))


def test_common_ids_stay_readable_and_others_are_percent_encoded() -> None:
    assert scoped_key("exec-42", "charge-1") == "exec-42/charge-1"
    assert scoped_key("a/b", "c d") == "a%2Fb/c%20d"
    assert scoped_key("run 7", "call_1") == "run%207/call_1"
    assert scoped_key("é", "%") == "%C3%A9/%25"


@pytest.mark.parametrize("text", ["charge-1", "a/b/c", "a%2fb/c", "a%2Fb", "a b/c"])
def test_a_text_that_is_not_a_canonical_scoped_key_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="scoped key"):
        split_key(text)


# --- ids of two executions never collide --------------------------------------------------


@settings(max_examples=300)
@given(any_ids, any_ids, any_ids, any_ids, st.integers(1, 3), st.integers(1, 3))
def test_ids_of_two_executions_never_collide(
    exec_a: str, exec_b: str, op_a: str, op_b: str, attempt_a: int, attempt_b: int
) -> None:
    """Whatever the operation and request ids (the same in both executions or not), every id
    derived from a thing of one execution differs from every id of another's."""
    if exec_a == exec_b:
        return
    wi = WorkItemKind.REPLY_TIMEOUT
    assert work_item_id(exec_a, op_a, attempt_a, wi) != work_item_id(exec_b, op_b, attempt_b, wi)
    for kind, reason in (
        (AlertKind.OPERATION_UNKNOWN, "reply_timeout"),
        (AlertKind.VERIFICATION_OVERDUE, "settled_VERIFIED"),
    ):
        assert operation_alert_id(exec_a, op_a, attempt_a, kind, reason) != operation_alert_id(
            exec_b, op_b, attempt_b, kind, reason
        )
    # a work item opened before ids were scoped keeps its (unscoped, shared) id: its
    # resolution is scoped all the same
    old = "wi-efc461527188cbc977926975"
    assert resolution_id(exec_a, op_a, old, S.FAILED) != resolution_id(exec_b, op_b, old, S.FAILED)
    code = ApprovalVerdictCode.WAITING
    assert verdict_id(exec_a, op_a, code, 1000) != verdict_id(exec_b, op_b, code, 1000)


def _charge(execution_id: str, kind: K, at: datetime, **extra: object) -> OperationEvent:
    return OperationEvent(
        event_id=f"{execution_id}-{kind}",
        execution_id=execution_id,
        operation_id="charge-1",
        attempt=1,
        idempotency_key=extra.pop("key", None),  # type: ignore[arg-type]
        connector="payments",
        kind=kind,
        occurred_at=at,
        **extra,  # type: ignore[arg-type]
    )


def issue_case() -> dict[str, list]:
    """Issue 26's case: two executions each send ``charge-1`` attempt 1 (SENT 09:16:05Z due
    09:16:35Z, SENT 09:20:05Z due 09:20:35Z), both time out, then the connector rejects
    both. Each execution's outputs, in order."""
    day = datetime(2026, 12, 1, tzinfo=UTC)
    runs = {"exec-a": day + timedelta(hours=9, minutes=16, seconds=5)}
    runs["exec-b"] = day + timedelta(hours=9, minutes=20, seconds=5)
    out: dict[str, list] = {}
    for execution_id, sent in runs.items():
        step = apply_event(
            None,
            _charge(
                execution_id,
                K.SENT,
                sent,
                reply_due_at=sent + timedelta(seconds=30),
                evidence_source=E.RUNTIME,
            ),
            CFG,
        )
        outputs = list(step.outputs)
        step = advance(step.book, to_ms(sent + timedelta(minutes=2)))
        outputs += step.outputs
        rejected = _charge(
            execution_id, K.FAILED, sent + timedelta(minutes=3), evidence_source=E.CONNECTOR
        )
        step = apply_event(step.book, rejected, CFG)
        outputs += step.outputs
        out[execution_id] = outputs
    return out


def test_the_issue_case_gives_each_execution_ids_and_keys_of_its_own() -> None:
    out = issue_case()
    a, b = out["exec-a"], out["exec-b"]

    def only(outputs: list, cls: type, **match: object) -> list:
        return [
            o
            for o in outputs
            if isinstance(o, cls) and all(getattr(o, k) == v for k, v in match.items())
        ]

    (item_a,), (item_b,) = only(a, ReconciliationWorkItem), only(b, ReconciliationWorkItem)
    assert item_a.deadline != item_b.deadline
    assert item_a.work_item_id != item_b.work_item_id
    assert item_a.work_item_id == work_item_id("exec-a", "charge-1", 1, WorkItemKind.REPLY_TIMEOUT)
    (res_a,), (res_b,) = only(a, WorkItemResolution), only(b, WorkItemResolution)
    assert res_a.resolution_id != res_b.resolution_id
    assert (res_a.work_item_id, res_b.work_item_id) == (item_a.work_item_id, item_b.work_item_id)
    for status in (AlertStatus.FIRING, AlertStatus.RESOLVED):
        (alert_a,), (alert_b,) = only(a, Alert, status=status), only(b, Alert, status=status)
        assert alert_a.alert_id != alert_b.alert_id
        assert alert_a.kafka_key() != alert_b.kafka_key()
    resolved_a = only(a, Alert, status=AlertStatus.RESOLVED)[0]
    assert resolved_a.resolves_alert_id == only(a, Alert, status=AlertStatus.FIRING)[0].alert_id
    states_a, states_b = only(a, OperationState), only(b, OperationState)
    assert {s.kafka_key() for s in states_a} == {"exec-a/charge-1"}
    assert {s.kafka_key() for s in states_b} == {"exec-b/charge-1"}
    assert not {s.state_id for s in states_a} & {s.state_id for s in states_b}
    # both executions' last states survive compaction: two keys, each with its own last state
    last = {s.kafka_key(): s for s in states_a + states_b}
    assert {k: (s.execution_id, s.status) for k, s in last.items()} == {
        "exec-a/charge-1": ("exec-a", S.FAILED),
        "exec-b/charge-1": ("exec-b", S.FAILED),
    }


# --- attempts settled by a shared idempotency key -----------------------------------------

T0 = datetime(2026, 12, 1, 9, tzinfo=UTC)


def _ev(kind: K, seconds: float, op: str, attempt: int, key: str | None, **extra: object):
    return OperationEvent(
        event_id=f"{op}-{attempt}-{kind}-{seconds}",
        execution_id="exe-1",
        operation_id=op,
        attempt=attempt,
        idempotency_key=key,
        connector="payments",
        kind=kind,
        occurred_at=T0 + timedelta(seconds=seconds),
        **extra,  # type: ignore[arg-type]
    )


def _unknown_attempts(*attempts: tuple[str, int, str | None, float]) -> OperationBook:
    """Each (operation, attempt, idempotency key, send time) sent by the runtime and never
    answered: all UNKNOWN once stream time is past the last reply deadline."""
    book = None
    for op, attempt, key, sent in attempts:
        book = apply_event(book, _ev(K.SENT, sent, op, attempt, key), CFG).book
    assert book is not None
    book = advance(book, to_ms(T0 + timedelta(minutes=10))).book
    for op, attempt, _, _ in attempts:
        assert book.operations[op].attempts[attempt].status is S.UNKNOWN
    return book


def _status(book: OperationBook, op: str, attempt: int) -> tuple[S, str | None, str | None]:
    rec = book.operations[op].attempts[attempt]
    return rec.status, rec.reason, rec.work_item_id


@pytest.mark.parametrize("source", [E.CONNECTOR, E.RECONCILER, E.HUMAN])
def test_a_verified_attempt_settles_the_unknown_attempts_sharing_its_key(source: E) -> None:
    book = _unknown_attempts(
        ("charge-1", 1, "k-1", 0),
        ("charge-1", 2, "k-1", 40),  # a (forbidden) retry under the same key
        ("charge-2", 1, "k-1", 50),  # another operation id, the same key: the same effect
        ("charge-1", 3, None, 60),  # no key: may be a second effect
        ("charge-3", 1, "k-2", 70),  # another key
    )
    before = {
        (op, a): rec.work_item_id
        for op, o in book.operations.items()
        for a, rec in o.attempts.items()
    }
    step = apply_event(
        book, _ev(K.VERIFIED, 600, "charge-1", 2, "k-1", evidence_source=source), CFG
    )
    after = step.book
    assert _status(after, "charge-1", 2) == (S.VERIFIED, None, None)
    for op, attempt in (("charge-1", 1), ("charge-2", 1)):
        assert _status(after, op, attempt) == (S.VERIFIED, VERIFIED_BY_SHARED_KEY, None)
    for op, attempt in (("charge-1", 3), ("charge-3", 1)):
        assert _status(after, op, attempt) == (S.UNKNOWN, "reply_timeout", before[op, attempt])

    resolutions = {r.work_item_id: r for r in step.outputs if isinstance(r, WorkItemResolution)}
    assert set(resolutions) == {
        before[k] for k in [("charge-1", 2), ("charge-1", 1), ("charge-2", 1)]
    }
    assert resolutions[before["charge-1", 2]].evidence == ()  # its own evidence
    for op, attempt in (("charge-1", 1), ("charge-2", 1)):
        r = resolutions[before[op, attempt]]
        assert (r.operation_id, r.attempt, r.outcome, r.evidence_source) == (
            op,
            attempt,
            S.VERIFIED,
            source,
        )
        assert r.evidence == ("verified_by=charge-1#2", "idempotency_key=k-1")
    resolved = [
        a
        for a in step.outputs
        if isinstance(a, Alert)
        and a.status is AlertStatus.RESOLVED
        and a.kind is not AlertKind.FORBIDDEN_RETRY
    ]
    assert len(resolved) == 3 and len({a.resolves_alert_id for a in resolved}) == 3
    # the retries under k-1 are decided (one effect, verified), the keyless one is not
    retries_ended = [
        a.evidence[0]
        for a in step.outputs
        if isinstance(a, Alert)
        and a.status is AlertStatus.RESOLVED
        and a.kind is AlertKind.FORBIDDEN_RETRY
    ]
    assert retries_ended == ["attempt=charge-1#2:VERIFIED", "attempt=charge-2#1:VERIFIED"]
    for a in resolved:
        if a.subject_id == "charge-2" or "attempt=charge-1#1" in a.evidence:
            assert "verified_by=charge-1#2" in a.evidence
    # the operations' published states say so: charge-2 verified, charge-1 still held back
    # by its own keyless attempt 3
    states = {s.operation_id: s for s in step.outputs if isinstance(s, OperationState)}
    assert states["charge-2"].status is S.VERIFIED
    assert states["charge-2"].reason == VERIFIED_BY_SHARED_KEY
    assert open_operation_ids(after) == ("charge-1", "charge-3")


def test_the_runtime_saying_verified_settles_no_sibling() -> None:
    book = _unknown_attempts(("charge-1", 1, "k-1", 0))
    book = apply_event(book, _ev(K.SENT, 400, "charge-1", 2, "k-1"), CFG).book
    step = apply_event(
        book, _ev(K.VERIFIED, 410, "charge-1", 2, "k-1", evidence_source=E.RUNTIME), CFG
    )
    assert _status(step.book, "charge-1", 2)[0] is S.VERIFIED
    assert _status(step.book, "charge-1", 1)[0] is S.UNKNOWN
    assert not [r for r in step.outputs if isinstance(r, WorkItemResolution)]


def test_manual_review_stays_with_the_person_who_has_it() -> None:
    book = _unknown_attempts(("charge-1", 1, "k-1", 0), ("charge-1", 2, "k-1", 40))
    review = _ev(K.MANUAL_REVIEW, 500, "charge-1", 1, "k-1", evidence_source=E.HUMAN)
    book = apply_event(book, review, CFG).book
    step = apply_event(
        book, _ev(K.VERIFIED, 600, "charge-1", 2, "k-1", evidence_source=E.CONNECTOR), CFG
    )
    assert _status(step.book, "charge-1", 1)[0] is S.MANUAL_REVIEW


def test_a_sibling_settled_by_the_key_refuses_contradicting_evidence_later() -> None:
    book = _unknown_attempts(("charge-1", 1, "k-1", 0), ("charge-1", 2, "k-1", 40))
    verified = _ev(K.VERIFIED, 600, "charge-1", 2, "k-1", evidence_source=E.CONNECTOR)
    book = apply_event(book, verified, CFG).book
    failed = _ev(K.FAILED, 700, "charge-1", 1, "k-1", evidence_source=E.RECONCILER)
    step = apply_event(book, failed, CFG)
    assert step.outputs == () and [a.reason for a in step.anomalies] == [
        "contradicting evidence: FAILED after VERIFIED"
    ]


# --- an approval alert fired before ids were scoped -----------------------------------------


def _approval_run(strip: bool) -> tuple[list, list, dict]:
    """A request with no heartbeat fires ORPHANED_WAIT; the worker restarts (its stored book,
    when ``strip``, made what 83a7350 stored: no ``unscoped_verdicts``); a decline then ends
    the wait. The outputs before and after the restart, and the stored book after."""
    import json

    from streams.contracts.models.enums import DecisionCode
    from streams.contracts.models.events import ApprovalDecision, ApprovalRequested, ClockTick
    from streams.engine.processor import Processor, Stores
    from streams.engine.state import Entry
    from tests.test_processor import TOPICS, env

    t = datetime(2026, 11, 1, 9, tzinfo=UTC)
    stores = Stores()

    def tick(p: Processor, at: datetime) -> list:
        return [
            em
            for spec in TOPICS.inputs()
            for part in range(3)
            for em in p.handle(
                env(ClockTick(ticker_id="t", partition=part, occurred_at=at), spec.name, None, part)
            )
        ]

    p = Processor(TOPICS, stores)
    request = ApprovalRequested(
        event_id="r1",
        execution_id="exec-a",
        request_id="req-1",
        action="deploy",
        action_digest="d1",
        occurred_at=t,
    )
    before = list(p.handle(env(request))) + tick(p, t + timedelta(minutes=10))
    p.flush()
    if strip:
        entry = Entry.decode(stores.executions["exec-a"])
        book = json.loads(entry.approvals or "")
        assert book.pop("unscoped_verdicts") == []
        entry.approvals = json.dumps(book, separators=(",", ":"))
        stores.executions["exec-a"] = entry.pack()
    p = Processor(TOPICS, stores)  # a restart on the stored tables
    decline = ApprovalDecision(
        event_id="d1",
        execution_id="exec-a",
        request_id="req-1",
        occurred_at=t + timedelta(minutes=11),
        decision=DecisionCode.DECLINE,
        action_digest="d1",
    )
    after = list(p.handle(env(decline))) + tick(p, t + timedelta(minutes=12))
    p.flush()
    stored = json.loads(Entry.decode(stores.executions["exec-a"]).approvals or "{}")
    return [em.record for em in before], [em.record for em in after], stored


def test_an_approval_alert_is_resolved_under_the_id_it_fired_with() -> None:
    before, after, stored = _approval_run(strip=False)
    (fired,) = [a for a in before if isinstance(a, Alert)]
    (resolved,) = [a for a in after if isinstance(a, Alert) and a.status is AlertStatus.RESOLVED]
    assert fired.status is AlertStatus.FIRING and resolved.resolves_alert_id == fired.alert_id
    assert stored["unscoped_verdicts"] == []


def test_an_approval_alert_fired_before_ids_were_scoped_is_resolved_under_its_old_id() -> None:
    """The book stored before (no ``unscoped_verdicts``): the previous verdict's id is the
    unscoped one, so the RESOLVED alert names the alert as it fired then; the verdicts after
    are scoped."""
    from streams.core.approvals.evaluation import unscoped_verdict_id
    from streams.core.ids import deterministic_id

    before, after, stored = _approval_run(strip=True)
    (fired,) = [a for a in before if isinstance(a, Alert)]
    (resolved,) = [a for a in after if isinstance(a, Alert) and a.status is AlertStatus.RESOLVED]
    at = int(fired.occurred_at.timestamp() * 1000)
    old_verdict = unscoped_verdict_id("req-1", ApprovalVerdictCode(fired.verdict), at)
    old_alert = deterministic_id(
        "alert", AlertKind.APPROVAL_VERDICT, "req-1", fired.verdict, old_verdict
    )
    assert resolved.resolves_alert_id == old_alert != fired.alert_id
    assert stored["unscoped_verdicts"] == []  # the request's last verdict is scoped now
