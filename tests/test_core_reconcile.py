"""The reconciler's rules without Kafka, a clock or a source: what a check result means,
the backoff schedule, when to give up (streams/core/reconcile.py, docs/rules.md#the-reconciler).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from streams.contracts.models.enums import (
    CheckFinding,
    EvidenceSource,
    OperationEventKind,
    OperationStatus,
    ReconciliationState,
    WorkItemKind,
)
from streams.contracts.models.outputs import ReconciliationCheck
from streams.core import operations as ops
from streams.core import reconcile as rc

T0 = datetime(2026, 7, 26, 16, 0, tzinfo=UTC)
F = CheckFinding
R = ReconciliationState


def item(now: datetime = T0, deadline: datetime = T0, **kw: object) -> ReconciliationCheck:
    values: dict[str, object] = {
        "work_item_id": "work-1",
        "operation_id": "op-1",
        "execution_id": "exec-1",
        "attempt": 1,
        "connector": "payments",
        "idempotency_key": "idem-1",
        "effect_ref": None,
        "kind": WorkItemKind.REPLY_TIMEOUT,
        "deadline": deadline,
        "created_at": deadline,
        "traceparent": None,
        "now": now,
    }
    values.update(kw)
    return rc.taken(**values)  # type: ignore[arg-type]


POLICY = rc.Policy(
    authoritative=True,
    settle_delay=timedelta(minutes=2),
    max_attempts=5,
    give_up_after=timedelta(hours=1),
    backoff_initial=timedelta(seconds=1),
    backoff_max=timedelta(seconds=30),
)


def test_found_is_verified_with_the_sources_reference() -> None:
    d = rc.decide(item(), rc.CheckResult(F.VERIFIED, "pay_123", "rule1"), POLICY, T0, T0)
    assert isinstance(d, rc.Publish)
    e = d.event
    assert (e.kind, e.effect_ref, e.evidence_source) == (
        OperationEventKind.VERIFIED,
        "pay_123",
        EvidenceSource.RECONCILER,
    )
    assert (e.execution_id, e.operation_id, e.attempt, e.connector) == (
        "exec-1",
        "op-1",
        1,
        "payments",
    )
    assert d.progress.state is R.VERIFIED and d.progress.outcome_event_id == e.event_id
    assert d.progress.next_check_at is None and len(d.progress.checks) == 1


def test_absent_is_failed_only_after_the_settle_delay() -> None:
    early = T0 + timedelta(seconds=30)
    d = rc.decide(item(), rc.CheckResult(F.ABSENT), POLICY, early, early)
    assert isinstance(d, rc.Retry)
    # the next check that can settle it comes no sooner than deadline + settle delay
    assert d.progress.next_check_at == T0 + timedelta(minutes=2)
    later = T0 + timedelta(minutes=2)
    d2 = rc.decide(d.progress, rc.CheckResult(F.ABSENT), POLICY, later, later)
    assert isinstance(d2, rc.Publish)
    assert d2.event.kind is OperationEventKind.FAILED and d2.progress.state is R.FAILED
    assert [c.finding for c in d2.progress.checks] == [F.ABSENT, F.ABSENT]


def test_absent_at_a_source_that_is_not_authoritative_is_never_failed() -> None:
    policy = rc.Policy(authoritative=False, max_attempts=3, backoff_initial=timedelta(0))
    now = T0 + timedelta(days=1)  # long past any settle delay
    p = item(now=now)
    for _ in range(2):
        d = rc.decide(p, rc.CheckResult(F.ABSENT), policy, now, now)
        assert isinstance(d, rc.Retry)
        p = d.progress
    d = rc.decide(p, rc.CheckResult(F.ABSENT), policy, now, now)
    assert isinstance(d, rc.Publish) and d.event.kind is OperationEventKind.MANUAL_REVIEW
    assert d.progress.state is R.MANUAL_REVIEW
    assert "3 checks: 3 ABSENT" in (d.event.detail or "")


def test_errors_retry_then_give_up_into_manual_review_with_what_was_tried() -> None:
    p = item()
    now = T0
    details = ["http_503", "timeout", "http_401", "malformed_json_http_200", "unreachable_x"]
    for n, detail in enumerate(details, start=1):
        d = rc.decide(p, rc.CheckResult(F.ERROR, detail=detail), POLICY, now, now)
        if n < POLICY.max_attempts:
            assert isinstance(d, rc.Retry)
            assert d.progress.next_check_at is not None and d.progress.next_check_at > now
            p, now = d.progress, d.progress.next_check_at
    assert isinstance(d, rc.Publish)
    assert d.event.kind is OperationEventKind.MANUAL_REVIEW
    assert d.event.evidence_source is EvidenceSource.RECONCILER
    assert [c.detail for c in d.progress.checks] == details
    assert "5 ERROR" in (d.event.detail or "") and "unreachable_x" in (d.event.detail or "")


def test_gives_up_when_the_next_check_would_fall_after_the_deadline() -> None:
    policy = rc.Policy(give_up_after=timedelta(seconds=10), backoff_initial=timedelta(seconds=20))
    d = rc.decide(item(), rc.CheckResult(F.PENDING), policy, T0, T0)
    assert isinstance(d, rc.Publish) and d.progress.state is R.MANUAL_REVIEW


def test_event_ids_depend_on_the_work_item_and_the_outcome_only() -> None:
    a = rc.decide(item(), rc.CheckResult(F.VERIFIED, "r"), POLICY, T0, T0)
    later = T0 + timedelta(hours=3)
    b = rc.decide(item(now=later), rc.CheckResult(F.VERIFIED, "r"), POLICY, later, later)
    assert isinstance(a, rc.Publish) and isinstance(b, rc.Publish)
    assert a.event.event_id == b.event.event_id  # a restart or a second replica: the same fact
    other = rc.decide(item(work_item_id="work-2"), rc.CheckResult(F.VERIFIED, "r"), POLICY, T0, T0)
    assert isinstance(other, rc.Publish) and other.event.event_id != a.event.event_id


def test_what_the_reconciler_publishes_the_pipeline_applies() -> None:
    """VERIFIED and FAILED from the reconciler settle an UNKNOWN attempt (and an overdue
    ACKNOWLEDGED one); MANUAL_REVIEW takes it over: the core refuses none of them."""
    for status in (OperationStatus.UNKNOWN, OperationStatus.ACKNOWLEDGED):
        for finding, kind in (
            (F.VERIFIED, OperationEventKind.VERIFIED),
            (F.ABSENT, OperationEventKind.FAILED),
        ):
            late = T0 + timedelta(hours=1)
            d = rc.decide(item(), rc.CheckResult(finding, "ref"), POLICY, late, late)
            assert isinstance(d, rc.Publish) and d.event.kind is kind
            rec = ops.AttemptRecord(1, "payments", "idem-1", status, None, 0, True)
            book = ops.OperationBook("exec-1", {"op-1": ops.OperationRecord("op-1", {1: rec})})
            step = ops.apply_event(book, d.event, ops.OperationConfig())
            assert not step.anomalies, step.anomalies


def test_resolved_items_are_closed() -> None:
    p = rc.resolved(item(), T0, "resolved VERIFIED on evidence from HUMAN")
    assert p.state is R.RESOLVED and not rc.is_open(p) and p.next_check_at is None
    assert rc.is_open(item())


def test_unconfigured_connector_is_left_to_a_person() -> None:
    p = item(configured=False)
    assert p.state is R.UNCONFIGURED and not rc.is_open(p)


policies = st.builds(
    rc.Policy,
    backoff_initial=st.integers(0, 10_000).map(lambda ms: timedelta(milliseconds=ms)),
    backoff_factor=st.floats(1.0, 10.0),
    backoff_max=st.integers(0, 600_000).map(lambda ms: timedelta(milliseconds=ms)),
    jitter=st.floats(0.0, 1.0),
)


@settings(max_examples=300)
@given(policies, st.integers(1, 10_000), st.text(min_size=1, max_size=20))
def test_backoff_stays_within_its_bounds_and_grows(
    policy: rc.Policy, n: int, work_item_id: str
) -> None:
    pause = rc.backoff(policy, n, work_item_id)
    ceiling = min(
        policy.backoff_max.total_seconds(),
        policy.backoff_initial.total_seconds() * policy.backoff_factor ** min(n - 1, 200),
    )
    assert timedelta(0) <= pause <= timedelta(seconds=ceiling) + timedelta(milliseconds=1)
    assert pause.total_seconds() >= ceiling * (1 - policy.jitter) - 0.001
    # the same item and check number give the same pause (replicas, restarts)
    assert rc.backoff(policy, n, work_item_id) == pause


findings = st.sampled_from([F.VERIFIED, F.ABSENT, F.PENDING, F.ERROR])


@settings(max_examples=200)
@given(
    st.lists(st.tuples(findings, st.integers(0, 600_000)), min_size=1, max_size=30),
    st.booleans(),
    st.integers(1, 12),
)
def test_any_sequence_of_checks_ends_in_one_outcome_within_the_limits(
    steps: list[tuple[CheckFinding, int]], authoritative: bool, max_attempts: int
) -> None:
    """Whatever the source answers, the item gets at most ``max_attempts`` checks, the checks
    are spaced as scheduled, exactly one outcome is published, FAILED only from an
    authoritative source after the settle delay, and VERIFIED only on a VERIFIED finding."""
    policy = rc.Policy(
        authoritative=authoritative,
        settle_delay=timedelta(seconds=90),
        max_attempts=max_attempts,
        backoff_initial=timedelta(seconds=1),
        backoff_max=timedelta(seconds=60),
    )
    p = item()
    now = T0
    published = []
    for finding, extra_ms in steps:
        due = p.next_check_at
        assert due is not None
        now = max(now, due) + timedelta(milliseconds=extra_ms)
        d = rc.decide(p, rc.CheckResult(finding, "ref"), policy, now, now)
        p = d.progress
        assert len(p.checks) <= max_attempts
        if isinstance(d, rc.Publish):
            published.append(d)
            break
        assert p.next_check_at is not None and p.next_check_at >= now
    for d in published:
        last = d.progress.checks[-1]
        if d.event.kind is OperationEventKind.FAILED:
            assert authoritative and last.finding is F.ABSENT
            assert now >= T0 + policy.settle_delay
        if d.event.kind is OperationEventKind.VERIFIED:
            assert last.finding is F.VERIFIED
        if d.event.kind is OperationEventKind.MANUAL_REVIEW:
            assert last.finding is not F.VERIFIED
    if len(steps) >= max_attempts:
        assert len(published) == 1
