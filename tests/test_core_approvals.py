"""The approval-wait evaluator: examples per verdict, the reference audit, then properties;
the ledger (the book as the stream judges it) held to the reference steps on the stored book.

Times in the helpers are minutes after T0 (2026-07-26T16:00:00Z) unless said otherwise.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.audit import SnapshotLine
from streams.contracts.models.enums import (
    ApprovalVerdictCode,
    DecisionCode,
    DeliveryOutcome,
    Owner,
    Proof,
    ProofState,
    Risk,
)
from streams.contracts.models.events import (
    ApprovalDecision,
    ApprovalDelivery,
    ApprovalRequested,
    ApproverAcknowledgement,
    CurrentActionDigest,
    RequesterHeartbeat,
    ResumeReceipt,
)
from streams.core.approvals import (
    CLOSED_VERDICTS,
    VERDICT_GUIDANCE,
    VERDICT_SEVERITY,
    ApprovalBook,
    ApprovalFacts,
    DecisionFact,
    DeliveryFact,
    DigestFact,
    LastVerdict,
    Ledger,
    Request,
    RequestPart,
    ThresholdOverrides,
    ThresholdSet,
    add_fact,
    advance,
    change_points,
    evaluate,
    facts_for,
    next_change,
    open_request_ids,
    orphan_deadline,
    purge_closed,
    resolve_thresholds,
    take_orphans,
    threshold_resolver,
    to_verdict,
)
from streams.core.approvals.evaluation import verdict_id
from streams.core.approvals.ledger import Settled, from_ms, id_ms, to_ms
from streams.core.ids import deterministic_id, scoped_key

V = ApprovalVerdictCode
D = DecisionCode
T0 = datetime(2026, 7, 26, 16, 0, tzinfo=UTC)
AT = datetime(2026, 7, 26, 16, 30, tzinfo=UTC)
TH = ThresholdSet()
SAMPLE = Path(__file__).resolve().parents[1] / "streams" / "samples" / "reference-audit.jsonl"
REFERENCE = {
    "req-export": V.WAITING,
    "req-deletion": V.STALE_REQUEST,
    "req-rotation": V.UNROUTABLE_WAIT,
    "req-invoice": V.ORPHANED_WAIT,
    "req-deploy": V.STUCK_AFTER_DECISION,
    "req-message": V.CLOSED_BY_DECLINE,
}
#: Each reference request fails exactly the proof its row in the reference audit names.
REFERENCE_PROOFS = {
    "req-export": set(),
    "req-deletion": {Proof.CURRENT_ACTION},
    "req-rotation": {Proof.VERIFIED_ROUTE},
    "req-invoice": {Proof.LIVE_RESUME},
    "req-deploy": {Proof.CONSUMED_DECISION},
    "req-message": set(),
}


def m(minutes: float | None) -> datetime | None:
    return None if minutes is None else T0 + timedelta(minutes=minutes)


def mm(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def request(**kw: Any) -> RequestPart:
    """A healthy low-risk request made at T0, expiring at T0 + 2h, unless told otherwise."""
    base: dict[str, Any] = {
        "action": "export",
        "action_digest": "A",
        "requested_at": T0,
        "expires_at": mm(120),
        "approver_ref": "role:release-owner",
        "resume_handle": "interrupt://x/1",
        "risk": Risk.LOW,
    }
    base.update(kw)
    return RequestPart(**base)


def facts(
    req: RequestPart | None = None,
    *,
    deliveries: Sequence[tuple[float | None, DeliveryOutcome]] = ((1, DeliveryOutcome.DELIVERED),),
    acks: Sequence[float | None] = (),
    decisions: Sequence[tuple[float | None, DecisionCode]] = (),
    receipts: Sequence[float | None] = (),
    digests: Sequence[tuple[float | None, str]] = (),
    heartbeats: Sequence[float | None] = (25,),
    **kw: Any,
) -> ApprovalFacts:
    """Facts of request ``r1``: by default a healthy wait (delivered at +1, heartbeat at +25)."""
    return ApprovalFacts(
        request_id="r1",
        execution_id="x1",
        request=req if req is not None else request(**kw),
        deliveries=tuple(DeliveryFact(at=m(t), outcome=o) for t, o in deliveries),
        acknowledgements=tuple(m(t) for t in acks),
        decisions=tuple(DecisionFact(at=m(t), code=c) for t, c in decisions),
        receipts=tuple(m(t) for t in receipts),
        digests=tuple(DigestFact(at=m(t), digest=d) for t, d in digests),
        heartbeats=tuple(m(t) for t in heartbeats),
    )


def verdict(f: ApprovalFacts, at: datetime = AT, th: ThresholdSet = TH) -> ApprovalVerdictCode:
    return evaluate(f, at, th).verdict


def reasons(f: ApprovalFacts, at: datetime = AT, th: ThresholdSet = TH) -> set[tuple[str, str]]:
    """(proof, reason code) of every check that does not hold (a proof's reasons are
    comma-separated in its one finding)."""
    return {
        (p.proof.value, r) for p in evaluate(f, at, th).failed_proofs for r in p.reason.split(",")
    }


# ---------------------------------------------------------------------------------------------
# The reference audit of the specification, through the evaluator (the CLI pin is in test_audit.py)
# ---------------------------------------------------------------------------------------------


def _reference_facts() -> list[ApprovalFacts]:
    lines = SAMPLE.read_text().splitlines()
    return [SnapshotLine.model_validate_json(line).to_facts() for line in lines]


def test_reference_audit_gives_exactly_its_six_verdicts() -> None:
    got = {f.request_id: evaluate(f, AT, TH) for f in _reference_facts()}
    assert {rid: e.verdict for rid, e in got.items()} == REFERENCE
    assert {rid: {p.proof for p in e.failed_proofs} for rid, e in got.items()} == REFERENCE_PROOFS
    assert got["req-deploy"].owner is Owner.RUNTIME_OWNER  # not the approver
    assert got["req-export"].owner is Owner.APPROVER


def test_reference_audit_played_as_events_through_the_book() -> None:
    """The same six requests as input events (one book per execution), advanced in ticks of
    a minute to 16:30: the last verdict published per request is the reference one."""
    last: dict[str, ApprovalVerdictCode] = {}
    resolver = threshold_resolver()
    for f in _reference_facts():
        events = _events_of(f)
        book = ApprovalBook()
        for e in sorted(events, key=lambda e: e.occurred_at):
            book = add_fact(book, e)
        for minute in range(-30, 31):
            book, out = advance(book, mm(minute), resolver)
            for v in out:
                last[v.request_id] = v.verdict
    assert last == REFERENCE


def _events_of(f: ApprovalFacts) -> list[Any]:
    """Input events equivalent to snapshot facts; unknown times become the request time."""
    req = f.request
    assert req is not None and req.requested_at is not None
    x, r = f.execution_id or "x", f.request_id
    ids = itertools.count()

    def common(at: datetime | None) -> dict[str, Any]:
        return {
            "event_id": f"{r}-{next(ids)}",
            "execution_id": x,
            "occurred_at": at or req.requested_at,
        }

    events: list[Any] = [
        ApprovalRequested(
            **common(req.requested_at),
            request_id=r,
            action=req.action or "",
            action_digest=req.action_digest or "",
            expires_at=req.expires_at,
            approver_ref=req.approver_ref,
            resume_handle=req.resume_handle,
            risk=req.risk or Risk.HIGH,
        )
    ]
    events += [
        ApprovalDelivery(**common(d.at), request_id=r, outcome=d.outcome) for d in f.deliveries
    ]
    events += [ApproverAcknowledgement(**common(t), request_id=r) for t in f.acknowledgements]
    events += [ApprovalDecision(**common(d.at), request_id=r, decision=d.code) for d in f.decisions]
    events += [ResumeReceipt(**common(t), request_id=r) for t in f.receipts]
    events += [RequesterHeartbeat(**common(t)) for t in f.heartbeats]
    return events


# ---------------------------------------------------------------------------------------------
# Examples, verdict by verdict
# ---------------------------------------------------------------------------------------------


def test_waiting_when_all_proofs_hold() -> None:
    e = evaluate(facts(), AT, TH)
    assert e.verdict is V.WAITING and e.failed_proofs == ()
    assert (e.owner, e.next_step) == VERDICT_GUIDANCE[V.WAITING]
    assert e.thresholds.grace_ms == 300_000 and e.thresholds.heartbeat_fresh_ms == 600_000
    assert e.thresholds.delivery_deadline_ms == 300_000 and e.thresholds.evaluated_at == AT


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"expires_at": mm(30)}, "REQUEST_EXPIRED"),  # expiry is reached at its instant
        ({"digests": [(10, "B")]}, "ACTION_DIGEST_CHANGED"),
        ({"digests": [(None, "B")]}, "ACTION_DIGEST_CHANGED"),  # snapshot: time unknown
    ],
)
def test_stale_request(kw: dict[str, Any], reason: str) -> None:
    f = facts(**kw)
    assert verdict(f) is V.STALE_REQUEST
    assert ("CURRENT_ACTION", reason) in reasons(f)


def test_digest_changed_and_back_is_current_again() -> None:
    assert verdict(facts(digests=[(10, "B"), (20, "A")])) is V.WAITING
    assert verdict(facts(digests=[(10, "B"), (20, "A")]), mm(15)) is V.STALE_REQUEST


def test_digest_before_the_request_is_superseded_by_the_request() -> None:
    """The request states the digest it was made for: an older digest event does not stale it."""
    assert verdict(facts(digests=[(-5, "OLD")])) is V.WAITING


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"approver_ref": None}, "NO_APPROVER"),
        ({"approver_ref": ""}, "NO_APPROVER"),
        ({"deliveries": [(1, DeliveryOutcome.FAILED)]}, "DELIVERY_FAILED"),
        ({"deliveries": []}, "DELIVERY_UNCONFIRMED"),
        ({"risk": Risk.HIGH}, "ACK_MISSING"),
        ({"risk": None}, "ACK_MISSING"),  # unknown risk is judged like high
        ({"risk": Risk.UNRECOGNIZED}, "ACK_MISSING"),
    ],
)
def test_unroutable_wait(kw: dict[str, Any], reason: str) -> None:
    f = facts(**kw)
    assert verdict(f) is V.UNROUTABLE_WAIT
    assert ("VERIFIED_ROUTE", reason) in reasons(f)
    assert evaluate(f, AT, TH).owner is Owner.POLICY_OWNER


def test_route_repaired_by_later_delivery_or_acknowledgement() -> None:
    failed_then_ok = [(1, DeliveryOutcome.FAILED), (12, DeliveryOutcome.DELIVERED)]
    repaired = facts(deliveries=failed_then_ok, heartbeats=[9])
    assert verdict(repaired, mm(10)) is V.UNROUTABLE_WAIT
    assert verdict(repaired, mm(12)) is V.WAITING
    # an acknowledgement proves delivery too; high risk needs it anyway
    assert verdict(facts(deliveries=[], acks=[3], risk=Risk.HIGH)) is V.WAITING
    assert verdict(facts(acks=[3], risk=Risk.HIGH)) is V.WAITING


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"resume_handle": None}, "NO_RESUME_HANDLE"),
        ({"heartbeats": [19]}, "HEARTBEAT_STALE"),
        ({"heartbeats": [20]}, "HEARTBEAT_STALE"),  # stale at exactly 10 minutes
        ({"heartbeats": []}, "HEARTBEAT_NEVER_SEEN"),
        ({"heartbeats": [None]}, "HEARTBEAT_NEVER_SEEN"),  # age unknown proves nothing
    ],
)
def test_orphaned_wait(kw: dict[str, Any], reason: str) -> None:
    f = facts(**kw)
    assert verdict(f) is V.ORPHANED_WAIT
    assert ("LIVE_RESUME", reason) in reasons(f)


def test_heartbeat_fresh_just_inside_the_window() -> None:
    assert verdict(facts(heartbeats=[20.01])) is V.WAITING


@pytest.mark.parametrize(
    ("kw", "at", "reason"),
    [
        ({"deliveries": [], "heartbeats": [0]}, 4, "DELIVERY_PENDING"),
        ({"risk": Risk.HIGH, "heartbeats": [0]}, 4, "ACK_PENDING"),
        ({"heartbeats": []}, 9, "HEARTBEAT_NOT_YET_SEEN"),
        # a heartbeat older than the request: the request shows the run was alive then
        ({"heartbeats": [-15]}, 9, "HEARTBEAT_NOT_YET_SEEN"),
    ],
)
def test_uncertain_inside_the_deadline_then_failed(
    kw: dict[str, Any], at: int, reason: str
) -> None:
    f = facts(**kw)
    e = evaluate(f, mm(at), TH)
    assert e.verdict is V.UNCERTAIN and e.owner is Owner.OPERATOR
    assert [(p.state, p.reason) for p in e.failed_proofs] == [(ProofState.UNKNOWN, reason)]
    # once the deadline (5 min) or window (10 min) has passed it counts as failed
    later = verdict(f, mm(at + 1))
    assert later in (V.UNROUTABLE_WAIT, V.ORPHANED_WAIT)


def test_unknown_request_digest_is_uncertain() -> None:
    assert verdict(facts(action_digest=None)) is V.UNCERTAIN


def test_unknown_request_time_has_no_young_window() -> None:
    assert verdict(facts(requested_at=None, deliveries=[])) is V.UNROUTABLE_WAIT
    assert verdict(facts(requested_at=None, heartbeats=[])) is V.ORPHANED_WAIT


def test_accept_resuming_stuck_resumed() -> None:
    accepted = facts(decisions=[(20, D.ACCEPT)])
    assert verdict(accepted, mm(24)) is V.RESUMING
    assert verdict(accepted, mm(25)) is V.STUCK_AFTER_DECISION  # grace over at its instant
    e = evaluate(accepted, AT, TH)
    assert e.owner is Owner.RUNTIME_OWNER
    assert e.next_step == "investigate the continuation; never ask the approver again"
    assert verdict(facts(decisions=[(20, D.ACCEPT)], receipts=[21]), mm(22)) is V.RESUMED
    # a late receipt still ends the wait
    late = facts(decisions=[(20, D.ACCEPT)], receipts=[29])
    assert verdict(late, mm(28)) is V.STUCK_AFTER_DECISION
    assert verdict(late, mm(29)) is V.RESUMED


def test_a_decision_proves_the_route() -> None:
    f = facts(deliveries=[], approver_ref=None, risk=Risk.HIGH, decisions=[(3, D.ACCEPT)])
    assert verdict(f, mm(4)) is V.RESUMING
    assert not any(p.proof is Proof.VERIFIED_ROUTE for p in evaluate(f, mm(4), TH).failed_proofs)


def test_stuck_lists_a_dead_run_as_evidence() -> None:
    f = facts(decisions=[(10, D.ACCEPT)], heartbeats=[5])
    assert verdict(f) is V.STUCK_AFTER_DECISION
    assert ("LIVE_RESUME", "HEARTBEAT_STALE") in reasons(f)


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"expires_at": mm(10)}, "DECIDED_AFTER_EXPIRY"),
        ({"expires_at": mm(20)}, "DECIDED_AFTER_EXPIRY"),  # at the expiry instant: expired
        ({"digests": [(15, "B")]}, "DECIDED_AFTER_DIGEST_CHANGE"),
    ],
)
def test_accept_after_expiry_or_digest_change_is_stale(kw: dict[str, Any], reason: str) -> None:
    f = facts(decisions=[(20, D.ACCEPT)], receipts=[21], **kw)
    assert verdict(f) is V.STALE_REQUEST
    assert ("CURRENT_ACTION", reason) in reasons(f)


def test_accept_for_another_digest_is_stale() -> None:
    f = facts().model_copy(
        update={"decisions": (DecisionFact(at=mm(20), code=D.ACCEPT, action_digest="B"),)}
    )
    assert verdict(f) is V.STALE_REQUEST
    assert ("CURRENT_ACTION", "DECISION_FOR_OTHER_DIGEST") in reasons(f)


def test_digest_change_or_expiry_after_the_accept_is_the_run_moving_on() -> None:
    f = facts(decisions=[(10, D.ACCEPT)], receipts=[11], digests=[(12, "NEXT")], expires_at=mm(20))
    assert verdict(f) is V.RESUMED and reasons(f) == set()


def test_snapshot_digest_of_unknown_time_with_and_without_receipt() -> None:
    """A snapshot's current digest differs, time unknown: a run that took the accept has moved
    on (RESUMED, binding flagged unknown); a run that did not is judged stale."""
    moved_on = facts(decisions=[(10, D.ACCEPT)], receipts=[11], digests=[(None, "NEXT")])
    assert verdict(moved_on) is V.RESUMED
    assert ("CURRENT_ACTION", "DIGEST_CHANGED_AT_UNKNOWN_TIME") in reasons(moved_on)
    not_resumed = facts(decisions=[(10, D.ACCEPT)], digests=[(None, "NEXT")])
    assert verdict(not_resumed) is V.STALE_REQUEST


def test_decision_of_unknown_time() -> None:
    # conservative both ways: grace taken as used up, expiry judged as of the evaluation
    assert verdict(facts(decisions=[(None, D.ACCEPT)])) is V.STUCK_AFTER_DECISION
    assert verdict(facts(decisions=[(None, D.ACCEPT)], expires_at=mm(25))) is V.STALE_REQUEST
    assert verdict(facts(decisions=[(None, D.DECLINE)], expires_at=mm(25))) is V.CLOSED_BY_DECLINE


@pytest.mark.parametrize(
    ("code", "closed"), [(D.DECLINE, V.CLOSED_BY_DECLINE), (D.CANCEL, V.CLOSED_BY_CANCEL)]
)
def test_terminal_decisions_are_checked_before_expiry(
    code: DecisionCode, closed: ApprovalVerdictCode
) -> None:
    f = facts(decisions=[(12, code)], receipts=[13], expires_at=mm(20), heartbeats=[])
    e = evaluate(f, AT, TH)
    assert e.verdict is closed and e.failed_proofs == ()  # expired later: closed, not stale
    assert e.owner is Owner.REQUESTER
    # decided after expiry: still closed, the evidence says it came on a stale request
    late = facts(decisions=[(25, code)], receipts=[26], expires_at=mm(20))
    assert verdict(late) is closed
    assert reasons(late) == {("CURRENT_ACTION", "DECIDED_AFTER_EXPIRY")}


def test_declined_run_that_never_takes_the_answer_is_flagged() -> None:
    f = facts(decisions=[(10, D.DECLINE)])
    assert verdict(f) is V.CLOSED_BY_DECLINE
    assert reasons(f) == {("CONSUMED_DECISION", "NO_RESUME_RECEIPT")}


def test_first_decision_counts_and_a_contradiction_is_shown() -> None:
    f = facts(decisions=[(10, D.ACCEPT), (12, D.DECLINE)], receipts=[11])
    assert verdict(f) is V.RESUMED
    assert ("CONSUMED_DECISION", "CONTRADICTING_DECISION") in reasons(f)
    assert reasons(f, mm(11.5)) == set()  # the decline had not happened yet
    g = facts(decisions=[(10, D.DECLINE), (12, D.ACCEPT)])
    assert verdict(g) is V.CLOSED_BY_DECLINE
    # same instant: the more cautious answer counts
    tie = facts(decisions=[(10, D.ACCEPT), (10, D.DECLINE)])
    assert verdict(tie) is V.CLOSED_BY_DECLINE
    # a repeated identical decision is no contradiction
    dup = facts(decisions=[(10, D.ACCEPT), (11, D.ACCEPT)], receipts=[12])
    assert reasons(dup) == set()


def test_unrecognized_decision_is_uncertain_not_a_decision() -> None:
    f = facts(decisions=[(10, D.UNRECOGNIZED)])
    assert verdict(f) is V.UNCERTAIN
    assert ("CONSUMED_DECISION", "DECISION_UNRECOGNIZED") in reasons(f)


def test_receipt_without_decision_changes_nothing() -> None:
    assert verdict(facts(receipts=[10])) is V.WAITING


def test_only_facts_up_to_the_evaluation_time_count() -> None:
    f = facts(decisions=[(40, D.DECLINE)], heartbeats=[25, 35])
    assert verdict(f) is V.WAITING
    assert verdict(f, mm(40)) is V.CLOSED_BY_DECLINE


def test_evaluate_refuses_an_unknown_or_future_request() -> None:
    with pytest.raises(ValueError, match="not been seen"):
        evaluate(ApprovalFacts(request_id="r1"), AT, TH)
    with pytest.raises(ValueError, match="after"):
        evaluate(facts(requested_at=mm(40)), AT, TH)


def test_to_verdict_has_a_deterministic_id() -> None:
    e = evaluate(facts(), AT, TH)
    v = to_verdict(e, V.UNCERTAIN)
    assert v.verdict_id == verdict_id("x1", "r1", V.WAITING, to_ms(AT))
    assert v.verdict_id == deterministic_id("verdict", scoped_key("x1", "r1"), V.WAITING, AT)
    assert v.previous_verdict is V.UNCERTAIN and v.execution_id == "x1"
    assert v == to_verdict(evaluate(facts(), AT, TH), V.UNCERTAIN)


# ---------------------------------------------------------------------------------------------
# Thresholds
# ---------------------------------------------------------------------------------------------


def test_thresholds_per_request_then_policy_then_default() -> None:
    policies = {
        "prod-change": ThresholdOverrides(grace=timedelta(hours=2), delivery_deadline=timedelta(1)),
        "preview": ThresholdSet(grace=timedelta(seconds=10)),
    }
    defaults = ThresholdSet(heartbeat_fresh=timedelta(minutes=3))
    own = request(policy="prod-change", overrides=ThresholdOverrides(grace=timedelta(seconds=30)))
    got = resolve_thresholds(own, policies, defaults)
    assert got == ThresholdSet(
        grace=timedelta(seconds=30),
        heartbeat_fresh=timedelta(minutes=3),
        delivery_deadline=timedelta(days=1),
    )
    by_action = resolve_thresholds(request(action="preview"), policies, defaults)
    assert by_action.grace == timedelta(seconds=10)
    assert resolve_thresholds(request(action="other"), policies, defaults) == defaults
    assert resolve_thresholds(None) == ThresholdSet()
    f = facts(decisions=[(20, D.ACCEPT)], policy="prod-change")
    assert verdict(f, th=threshold_resolver(policies)(f)) is V.RESUMING


def test_thresholds_refuse_negative_values() -> None:
    with pytest.raises(ValueError):
        ThresholdSet(grace=timedelta(seconds=-1))


# ---------------------------------------------------------------------------------------------
# Precedence, every combination of failed proofs
# ---------------------------------------------------------------------------------------------

_CURRENT = {"ok": {}, "expired": {"expires_at": mm(15)}, "digest": {"digests": [(15, "B")]}}
# route and live cases, with a flag whether they need a *young* request (long window)
_ROUTE: dict[str, tuple[dict[str, Any], bool]] = {
    "ok": ({}, False),
    "no_approver": ({"approver_ref": None}, False),
    "failed": ({"deliveries": [(1, DeliveryOutcome.FAILED)]}, False),
    "unconfirmed": ({"deliveries": []}, False),
    "ack_missing": ({"risk": Risk.HIGH}, False),
    "pending": ({"deliveries": []}, True),
    "ack_pending": ({"risk": Risk.HIGH}, True),
}
_LIVE: dict[str, tuple[dict[str, Any], bool]] = {
    "ok": ({}, False),
    "no_handle": ({"resume_handle": None}, False),
    "stale": ({"heartbeats": [5]}, False),
    "never": ({"heartbeats": []}, False),
    "not_yet": ({"heartbeats": []}, True),
}


def _scenario(
    current: str, route: str, live: str, **extra: Any
) -> tuple[ApprovalFacts, ThresholdSet]:
    """Request at T0, judged at T0+30; a "young" window is 60 min, an elapsed one 10 min."""
    route_kw, young_route = _ROUTE[route]
    live_kw, young_live = _LIVE[live]
    th = ThresholdSet(
        delivery_deadline=timedelta(minutes=60 if young_route else 10),
        heartbeat_fresh=timedelta(minutes=60 if young_live else 10),
    )
    return facts(**{**_CURRENT[current], **route_kw, **live_kw, **extra}), th


@pytest.mark.parametrize(
    ("current", "route", "live"), list(itertools.product(_CURRENT, _ROUTE, _LIVE))
)
def test_precedence_without_decision(current: str, route: str, live: str) -> None:
    f, th = _scenario(current, route, live)
    if current != "ok":
        expected = V.STALE_REQUEST
    elif live in ("no_handle", "stale", "never"):
        expected = V.ORPHANED_WAIT
    elif route in ("no_approver", "failed", "unconfirmed", "ack_missing"):
        expected = V.UNROUTABLE_WAIT
    elif route != "ok" or live != "ok":
        expected = V.UNCERTAIN
    else:
        expected = V.WAITING
    e = evaluate(f, AT, th)
    assert e.verdict is expected
    # every failed proof is listed, whichever decided the verdict
    listed = {p.proof for p in e.failed_proofs}
    assert (current != "ok") == (Proof.CURRENT_ACTION in listed)
    assert (route != "ok") == (Proof.VERIFIED_ROUTE in listed)
    assert (live != "ok") == (Proof.LIVE_RESUME in listed)


@pytest.mark.parametrize(
    ("code", "current", "receipt", "inside_grace", "route", "live"),
    list(
        itertools.product(
            (D.ACCEPT, D.DECLINE, D.CANCEL),
            ("ok", "expired_before", "expired_after", "digest_before", "digest_after"),
            (False, True),
            (False, True),
            ("ok", "failed"),
            ("ok", "no_handle"),
        )
    ),
)
def test_precedence_with_decision(
    code: DecisionCode, current: str, receipt: bool, inside_grace: bool, route: str, live: str
) -> None:
    decided = 27 if inside_grace else 20
    current_kw = {
        "ok": {},
        "expired_before": {"expires_at": mm(decided - 1)},
        "expired_after": {"expires_at": mm(decided + 1)},
        "digest_before": {"digests": [(decided - 1, "B")]},
        "digest_after": {"digests": [(decided + 1, "B")]},
    }[current]
    f, th = _scenario(
        "ok",
        route,
        live,
        **current_kw,
        decisions=[(decided, code)],
        receipts=[decided + 1] if receipt else [],
    )
    if code is D.DECLINE:
        expected = V.CLOSED_BY_DECLINE
    elif code is D.CANCEL:
        expected = V.CLOSED_BY_CANCEL
    elif current in ("expired_before", "digest_before"):
        expected = V.STALE_REQUEST
    elif receipt:
        expected = V.RESUMED
    elif inside_grace:
        expected = V.RESUMING
    else:
        expected = V.STUCK_AFTER_DECISION
    assert verdict(f, AT, th) is expected


# ---------------------------------------------------------------------------------------------
# Properties over arbitrary facts
# ---------------------------------------------------------------------------------------------

minute = st.integers(min_value=-5, max_value=60)
maybe_minute = st.one_of(minute, st.none())


@st.composite
def any_facts(draw: st.DrawFn, unknown_times: bool = True) -> ApprovalFacts:
    """Arbitrary facts of one request, on a minute grid (so ties and exact deadlines occur).

    Weighted towards healthy values, so that WAITING, UNCERTAIN and RESUMING occur often
    enough next to the failures.
    """
    t = maybe_minute if unknown_times else minute
    mostly = st.sampled_from
    req = request(
        requested_at=mm(draw(st.integers(0, 10))),
        expires_at=draw(st.one_of(st.none(), st.none(), minute.map(mm))),
        approver_ref=draw(mostly([None, "role:owner", "role:owner", "role:owner"])),
        resume_handle=draw(mostly([None, "h", "h", "h"])),
        risk=draw(mostly([Risk.LOW, Risk.LOW, Risk.HIGH, *([None] if unknown_times else [])])),
    )
    late = st.integers(min_value=5, max_value=80)
    return facts(
        req,
        deliveries=draw(st.lists(st.tuples(t, st.sampled_from(list(DeliveryOutcome))), max_size=3)),
        acks=draw(st.lists(t, max_size=2)),
        decisions=draw(
            st.lists(st.tuples(t, st.sampled_from([D.ACCEPT, D.DECLINE, D.CANCEL])), max_size=2)
        ),
        receipts=draw(st.lists(t, max_size=2)),
        digests=draw(st.lists(st.tuples(t, mostly(["A", "A", "B"])), max_size=2)),
        heartbeats=draw(st.lists(st.one_of(t, late), max_size=5)),
    )


def _oracle(f: ApprovalFacts, at: datetime, th: ThresholdSet) -> ApprovalVerdictCode:
    """The specification's precedence, spelled out again on known-time facts, independently."""
    req = f.request
    assert req is not None and req.requested_at is not None
    start = req.requested_at

    def upto(ts: Sequence[datetime | None]) -> list[datetime]:
        return [t for t in ts if t is not None and t <= at]

    def changed_at(when: datetime) -> bool:
        later = [d for d in f.digests if d.at is not None and start < d.at <= when]
        if not later:
            return False
        last = max(d.at for d in later if d.at is not None)
        return any(d.digest != "A" for d in later if d.at == last)

    def expired(when: datetime) -> bool:
        return req.expires_at is not None and when >= req.expires_at

    decisions = [d for d in f.decisions if d.at is not None and d.at <= at]
    if decisions:
        first_at = min(d.at for d in decisions if d.at is not None)
        codes = {d.code for d in decisions if d.at == first_at}
        if D.DECLINE in codes:
            return V.CLOSED_BY_DECLINE
        if D.CANCEL in codes:
            return V.CLOSED_BY_CANCEL
        if expired(first_at) or changed_at(first_at):
            return V.STALE_REQUEST
        if upto(f.receipts):
            return V.RESUMED
        return V.RESUMING if at < first_at + th.grace else V.STUCK_AFTER_DECISION
    if expired(at) or changed_at(at):
        return V.STALE_REQUEST
    heartbeats = upto(f.heartbeats)
    fresh = bool(heartbeats) and at < max(heartbeats) + th.heartbeat_fresh
    young_hb = at < start + th.heartbeat_fresh
    if not req.resume_handle or (not fresh and not young_hb):
        return V.ORPHANED_WAIT
    acked = bool(upto(f.acknowledgements))
    outcomes = {d.outcome for d in f.deliveries if d.at is not None and d.at <= at}
    delivered = acked or DeliveryOutcome.DELIVERED in outcomes
    overdue = at >= start + th.delivery_deadline
    need_ack = req.risk is not Risk.LOW
    if (
        not req.approver_ref
        or (not delivered and DeliveryOutcome.FAILED in outcomes)
        or (not delivered and overdue)
        or (need_ack and not acked and overdue)
    ):
        return V.UNROUTABLE_WAIT
    if not delivered or (need_ack and not acked) or not fresh:
        return V.UNCERTAIN
    return V.WAITING


thresholds = st.builds(
    ThresholdSet,
    grace=st.integers(0, 15).map(lambda n: timedelta(minutes=n)),
    heartbeat_fresh=st.integers(0, 20).map(lambda n: timedelta(minutes=n)),
    delivery_deadline=st.integers(0, 15).map(lambda n: timedelta(minutes=n)),
)
at_minute = st.integers(10, 80).map(mm)


@settings(max_examples=600, deadline=None)
@given(any_facts(unknown_times=False), at_minute, thresholds)
def test_precedence_matches_an_independent_oracle(
    f: ApprovalFacts, at: datetime, th: ThresholdSet
) -> None:
    assert verdict(f, at, th) is _oracle(f, at, th)


@settings(max_examples=400, deadline=None)
@given(any_facts(), at_minute, thresholds, maybe_minute)
def test_a_resume_receipt_never_makes_a_verdict_worse(
    f: ApprovalFacts, at: datetime, th: ThresholdSet, receipt_at: int | None
) -> None:
    with_receipt = f.model_copy(update={"receipts": (*f.receipts, m(receipt_at))})
    before, after = verdict(f, at, th), verdict(with_receipt, at, th)
    assert VERDICT_SEVERITY[after] <= VERDICT_SEVERITY[before]


@settings(max_examples=300, deadline=None)
@given(any_facts(), at_minute, thresholds, st.randoms(use_true_random=False))
def test_evaluation_is_independent_of_the_order_facts_were_added(
    f: ApprovalFacts, at: datetime, th: ThresholdSet, rnd: random.Random
) -> None:
    def shuffled(items: tuple[Any, ...]) -> tuple[Any, ...]:
        out = list(items) * 2  # duplicates too: a redelivered fact changes nothing
        rnd.shuffle(out)
        return tuple(out)

    data = {k: shuffled(v) if isinstance(v, tuple) else v for k, v in dict(f).items()}
    g = ApprovalFacts.model_validate(data)
    assert g == f
    assert evaluate(g, at, th) == evaluate(f, at, th)


@settings(max_examples=300, deadline=None)
@given(any_facts(), at_minute, thresholds)
def test_every_verdict_names_an_owner_and_a_next_step(
    f: ApprovalFacts, at: datetime, th: ThresholdSet
) -> None:
    e = evaluate(f, at, th)
    assert e.owner is not Owner.UNRECOGNIZED and e.next_step.strip()
    assert (e.owner, e.next_step) == VERDICT_GUIDANCE[e.verdict]
    assert e.thresholds == th.record(at)
    # a healthy verdict lists nothing failed; a broken one names what failed
    if e.verdict in (V.STALE_REQUEST, V.UNROUTABLE_WAIT, V.ORPHANED_WAIT, V.STUCK_AFTER_DECISION):
        assert any(p.state is ProofState.FAILED for p in e.failed_proofs)
    if e.verdict is V.WAITING:
        assert e.failed_proofs == ()


def test_every_verdict_code_has_guidance_and_severity() -> None:
    for code in ApprovalVerdictCode:
        assert code in VERDICT_SEVERITY
        if code is not V.UNRECOGNIZED:
            owner, step = VERDICT_GUIDANCE[code]
            assert owner is not Owner.UNRECOGNIZED and step


@settings(max_examples=300, deadline=None)
@given(any_facts(unknown_times=False), thresholds, st.data())
def test_the_verdict_only_changes_at_change_points(
    f: ApprovalFacts, th: ThresholdSet, data: st.DataObject
) -> None:
    """Between two consecutive change points (and after the last) the verdict is constant."""
    assert f.request is not None and f.request.requested_at is not None
    points = [p for p in change_points(f, th) if p <= mm(90)]
    assert points[0] == f.request.requested_at
    for lo, hi in itertools.pairwise([*points, mm(90)]):
        if hi - lo <= timedelta(milliseconds=1):
            continue
        offset = data.draw(st.integers(1, (hi - lo) // timedelta(milliseconds=1) - 1))
        inside = lo + timedelta(milliseconds=offset)
        assert verdict(f, inside, th) is verdict(f, lo, th)


# ---------------------------------------------------------------------------------------------
# The book the stream keeps
# ---------------------------------------------------------------------------------------------

_ids = itertools.count()


def _c(at: float, x: str = "x1") -> dict[str, Any]:
    return {"event_id": f"e{next(_ids)}", "execution_id": x, "occurred_at": mm(at)}


def requested(at: float, rid: str = "r1", **kw: Any) -> ApprovalRequested:
    base: dict[str, Any] = {
        "request_id": rid,
        "action": "deploy",
        "action_digest": "A",
        "expires_at": mm(120),
        "approver_ref": "role:release-owner",
        "resume_handle": "interrupt://x1/1",
    }
    base.update(kw)
    return ApprovalRequested(**_c(at), **base)


def delivered(at: float, rid: str = "r1") -> ApprovalDelivery:
    return ApprovalDelivery(**_c(at), request_id=rid, outcome=DeliveryOutcome.DELIVERED)


def decided(at: float, code: DecisionCode, rid: str = "r1") -> ApprovalDecision:
    return ApprovalDecision(**_c(at), request_id=rid, decision=code)


def receipt(at: float, rid: str = "r1") -> ResumeReceipt:
    return ResumeReceipt(**_c(at), request_id=rid)


def heartbeat(at: float) -> RequesterHeartbeat:
    return RequesterHeartbeat(**_c(at))


def digest(at: float, value: str) -> CurrentActionDigest:
    return CurrentActionDigest(**_c(at), action_digest=value)


def acked(at: float, rid: str = "r1") -> ApproverAcknowledgement:
    return ApproverAcknowledgement(**_c(at), request_id=rid)


RESOLVE = threshold_resolver()


def book_of(*events: Any) -> ApprovalBook:
    book = ApprovalBook()
    for e in events:
        book = add_fact(book, e)
    return book


def test_book_publishes_transitions_stamped_with_their_change_point() -> None:
    book = book_of(requested(0), heartbeat(0), delivered(1), decided(20, D.ACCEPT))
    book, out = advance(book, mm(40), RESOLVE)
    assert [(v.verdict, v.previous_verdict, v.evaluated_at) for v in out] == [
        (V.UNCERTAIN, None, mm(0)),  # delivery not yet confirmed
        (V.WAITING, V.UNCERTAIN, mm(1)),
        (V.ORPHANED_WAIT, V.WAITING, mm(10)),  # heartbeat at 0 stale at 10
        (V.RESUMING, V.ORPHANED_WAIT, mm(20)),
        (V.STUCK_AFTER_DECISION, V.RESUMING, mm(25)),  # "no receipt" only after the grace
    ]
    assert all(v.thresholds.evaluated_at == v.evaluated_at for v in out)
    assert out[-1].verdict_id == verdict_id(
        out[-1].execution_id, "r1", V.STUCK_AFTER_DECISION, to_ms(mm(25))
    )
    book = add_fact(book, receipt(41))
    book, out = advance(book, mm(41), RESOLVE)
    assert [(v.verdict, v.evaluated_at) for v in out] == [(V.RESUMED, mm(41))]
    assert open_request_ids(book) == ()
    book, out = advance(book, mm(90), RESOLVE)
    assert out == ()


def test_decision_and_receipt_before_their_request_are_held() -> None:
    book = book_of(receipt(21), decided(20, D.ACCEPT), heartbeat(19))
    book, out = advance(book, mm(22), RESOLVE)
    assert out == () and open_request_ids(book) == ()
    book = add_fact(book, requested(5))
    book, out = advance(book, mm(22), RESOLVE)
    # the request came late: its history is judged at the stream time it became known
    assert [(v.verdict, v.evaluated_at) for v in out] == [(V.RESUMED, mm(22))]


def test_a_late_fact_is_judged_when_it_becomes_known() -> None:
    book = book_of(requested(0), delivered(1), heartbeat(0), heartbeat(8))
    book, out = advance(book, mm(9), RESOLVE)
    assert out[-1].verdict is V.WAITING
    book = add_fact(book, decided(3, D.DECLINE))  # time 3, known only at stream time 9
    book, out = advance(book, mm(9), RESOLVE)
    assert [(v.verdict, v.previous_verdict, v.evaluated_at) for v in out] == [
        (V.CLOSED_BY_DECLINE, V.WAITING, mm(9))
    ]


def test_redelivered_event_is_idempotent() -> None:
    e = decided(5, D.ACCEPT)
    book = book_of(requested(0), e)
    book, _ = advance(book, mm(6), RESOLVE)
    again = add_fact(book, e)
    assert again == book
    assert advance(again, mm(6), RESOLVE)[1] == ()
    hb = heartbeat(5)
    book, _ = advance(add_fact(book, hb), mm(6), RESOLVE)
    assert add_fact(book, hb) == book
    assert add_fact(book, heartbeat(4)) == book  # older than the one judged with: irrelevant
    assert add_fact(book, heartbeat(5.5)) != book  # the new latest heartbeat
    d = digest(5, "A")
    book = add_fact(book, d)
    assert add_fact(book, d) == book


def test_book_refuses_another_execution() -> None:
    with pytest.raises(ValueError, match="execution"):
        add_fact(book_of(requested(0)), heartbeat(1).model_copy(update={"execution_id": "x2"}))


def test_book_round_trips_through_json() -> None:
    book = book_of(requested(0), delivered(1), heartbeat(2), digest(3, "A"), decided(4, D.ACCEPT))
    book, _ = advance(book, mm(5), RESOLVE)
    book = add_fact(book, receipt(6))
    assert ApprovalBook.model_validate_json(book.model_dump_json()) == book
    f = facts_for(book, "r1")
    assert ApprovalFacts.model_validate_json(f.model_dump_json()) == f


def test_heartbeats_and_digests_stay_bounded() -> None:
    events: list[Any] = [requested(0), delivered(1)]
    book = book_of(*events)
    for i in range(200):
        book = add_fact(book, heartbeat(i / 4))
        book = add_fact(book, digest(i / 4, "A"))
        book, _ = advance(book, mm(i / 4), RESOLVE)
    assert len(book.heartbeats) == 1
    assert len(book.digests) == 1  # the one that decides the request's current action
    book = add_fact(book, decided(50, D.DECLINE))
    book = add_fact(book, receipt(50))
    book, out = advance(book, mm(51), RESOLVE)
    assert out[-1].verdict is V.CLOSED_BY_DECLINE
    book = purge_closed(book, mm(60))
    assert book.requests == {} and book.last_verdicts == {}
    assert len(book.digests) == 0 and len(book.heartbeats) == 1


def test_purge_keeps_open_and_recently_closed_requests() -> None:
    book = book_of(
        requested(0, "open"),
        requested(0, "closed"),
        decided(2, D.CANCEL, "closed"),
        receipt(40, "orphan"),  # a receipt whose request never came
    )
    book, _ = advance(book, mm(30), RESOLVE)
    assert open_request_ids(book) == ("open",)
    assert purge_closed(book, mm(2)) == book
    purged = purge_closed(book, mm(41))
    assert set(purged.requests) == {"open"}
    assert set(purge_closed(book, mm(3)).requests) == {"open", "orphan"}


def test_next_change_is_the_next_deadline() -> None:
    book = book_of(requested(0), delivered(1), heartbeat(2))
    assert next_change(book) == mm(0)
    book, _ = advance(book, mm(3), RESOLVE)
    assert next_change(book) == mm(5)  # the delivery deadline (confirmed, but a change point)
    book, _ = advance(book, mm(10), RESOLVE)
    assert next_change(book) == mm(12)  # the heartbeat at 2 goes stale
    book = add_fact(book, decided(11, D.DECLINE))
    book, _ = advance(book, mm(11), RESOLVE)
    book, _ = advance(book, mm(17), RESOLVE)
    assert next_change(book) is None  # closed: time alone changes nothing


def test_advance_never_goes_back() -> None:
    book, _ = advance(book_of(requested(0)), mm(10), RESOLVE)
    book2, out = advance(book, mm(5), RESOLVE)
    assert out == () and book2.evaluated_until == mm(10)


def test_last_verdict_is_json_storable() -> None:
    lv = LastVerdict(verdict=V.WAITING, since=T0)
    assert LastVerdict.model_validate_json(lv.model_dump_json()) == lv
    assert V.RESUMED in CLOSED_VERDICTS


@st.composite
def event_lists(draw: st.DrawFn) -> list[Any]:
    """Events of one execution with up to three requests, on a minute grid."""
    rids = draw(st.lists(st.sampled_from(["r1", "r2", "r3"]), min_size=1, max_size=3, unique=True))
    events: list[Any] = []
    t = st.integers(0, 50)
    for rid in rids:
        events.append(
            requested(
                draw(st.integers(0, 10)),
                rid,
                risk=draw(st.sampled_from([Risk.LOW, Risk.HIGH])),
                expires_at=draw(st.one_of(st.none(), st.integers(5, 60).map(mm))),
                resume_handle=draw(st.sampled_from([None, "h"])),
                grace_seconds=draw(st.sampled_from([None, 60, 600])),
            )
        )
        for at in draw(st.lists(t, max_size=2)):
            events.append(
                ApprovalDelivery(
                    **_c(at),
                    request_id=rid,
                    outcome=draw(
                        st.sampled_from([DeliveryOutcome.DELIVERED, DeliveryOutcome.FAILED])
                    ),
                )
            )
        events += [acked(at, rid) for at in draw(st.lists(t, max_size=1))]
        events += [
            decided(at, code, rid)
            for at, code in draw(
                st.lists(st.tuples(t, st.sampled_from([D.ACCEPT, D.DECLINE, D.CANCEL])), max_size=2)
            )
        ]
        events += [receipt(at, rid) for at in draw(st.lists(t, max_size=1))]
    events += [heartbeat(at) for at in draw(st.lists(t, max_size=8))]
    events += [
        digest(at, v) for at, v in draw(st.lists(st.tuples(t, st.sampled_from("AB")), max_size=3))
    ]
    return events


def _run_one_step(events: list[Any], end: datetime) -> tuple[Any, ...]:
    return advance(book_of(*events), end, RESOLVE)[1]


@settings(max_examples=200, deadline=None)
@given(event_lists(), st.lists(st.integers(-5, 80), max_size=6))
def test_advance_in_several_steps_equals_one_step(events: list[Any], cuts: list[int]) -> None:
    end = mm(80)
    book = book_of(*events)
    out: list[Any] = []
    for cut in sorted(cuts):
        book, step = advance(book, mm(cut), RESOLVE)
        out += step
    book, step = advance(book, end, RESOLVE)
    out += step
    assert tuple(out) == _run_one_step(events, end)


@settings(max_examples=200, deadline=None)
@given(event_lists())
def test_live_arrival_in_time_order_equals_one_step(events: list[Any]) -> None:
    """The stream pattern: add each event as it arrives (in event-time order), advancing to
    just before its time (every fact up to there is in): the same records as one step."""
    end = mm(80)
    book = ApprovalBook()
    out: list[Any] = []
    for e in sorted(events, key=lambda e: e.occurred_at):
        book, step = advance(book, e.occurred_at - timedelta(milliseconds=1), RESOLVE)
        out += step
        book = add_fact(book, e)
    book, step = advance(book, end, RESOLVE)
    out += step
    assert tuple(out) == _run_one_step(events, end)


# ---------------------------------------------------------------------------------------------
# The ledger (the book as the stream judges it) against the reference steps on the stored book
# ---------------------------------------------------------------------------------------------

#: The shell's orphan window and closed retention in these tests (minutes).
ORPHAN_AFTER, RETENTION = 30, 40


def _ms(minutes: float) -> int:
    return to_ms(mm(minutes))


def _reference_step(
    book: ApprovalBook, minute: int
) -> tuple[ApprovalBook, tuple[Any, ...], Any, datetime | None, datetime | None]:
    """The shell's step on the stored book, by the reference functions alone."""
    book, out = advance(book, mm(minute), RESOLVE)
    book, orphans = take_orphans(book, mm(minute - ORPHAN_AFTER))
    book = purge_closed(book, mm(minute - RETENTION))
    window = timedelta(minutes=ORPHAN_AFTER)
    return book, out, orphans, next_change(book, RESOLVE), orphan_deadline(book, window)


def _settle(ledger: Ledger, minute: int) -> Settled:
    return ledger.settle(_ms(minute), RESOLVE, ORPHAN_AFTER * 60_000, RETENTION * 60_000)


def _time(ms: int | None) -> datetime | None:
    return None if ms is None else from_ms(ms)


@st.composite
def streams_with_orphans(draw: st.DrawFn) -> list[Any]:
    """``books_with_any_route``, some requests' own event left out (their facts are orphans
    once the window has passed), some facts late (up to 60 minutes after the rest)."""
    events = draw(books_with_any_route())
    dropped = draw(st.sets(st.sampled_from(["r1", "r2", "r3"]), max_size=2))
    late = timedelta(minutes=draw(st.sampled_from([0, 0, 45, 60])))
    out = []
    for e in events:
        if isinstance(e, ApprovalRequested) and e.request_id in dropped:
            continue
        if late and isinstance(e, ApprovalDelivery | ResumeReceipt):
            e = e.model_copy(update={"occurred_at": e.occurred_at + late})
        out.append(e)
    return out


@settings(max_examples=400, deadline=None)
@given(
    streams_with_orphans(),
    st.lists(st.integers(-5, 200), min_size=1, max_size=12),
    st.booleans(),
)
def test_the_ledger_settles_exactly_as_the_reference_steps(
    events: list[Any], cuts: list[int], live: bool
) -> None:
    """At every step the ledger publishes the very records the reference steps publish on the
    stored book (ids, order, evidence), takes the same orphans, says the same next change
    point and orphan deadline, and holds the same book: equal as a value, dumped to the same
    JSON, and read back from that JSON to itself. ``live``: facts come in event-time order up
    to each step's horizon (the stream); else all before the first step (late facts)."""
    book, ledger = ApprovalBook(), Ledger()
    pending = sorted(events, key=lambda e: e.occurred_at) if live else list(events)
    for minute in [*sorted(cuts), 200]:
        while pending and (not live or pending[0].occurred_at <= mm(minute)):
            e = pending.pop(0)
            book = add_fact(book, e)
            ledger.add(e)
        assert ledger.to_book() == book
        book, out, orphans, change, orphaned = _reference_step(book, minute)
        done = _settle(ledger, minute)
        assert tuple(v for v, _ in done.verdicts) == out
        assert [(rid, from_ms(t)) for rid, t in done.orphans] == list(orphans)
        assert (_time(done.change), _time(done.orphaned)) == (change, orphaned)
        assert ledger.to_book() == book
        assert ledger.dumps() == book.model_dump_json()
        assert Ledger.loads(ledger.dumps()).to_book() == book
        assert ledger.open_request_ids() == open_request_ids(book)


@settings(max_examples=300, deadline=None)
@given(streams_with_orphans(), st.lists(st.integers(-5, 200), min_size=1, max_size=12))
def test_a_ledger_read_back_between_steps_settles_as_one_kept(
    events: list[Any], cuts: list[int]
) -> None:
    """A worker that stores the book after each step and reads it back (a restart, or an
    entry evicted from the cache) publishes what one that keeps the ledger publishes, and
    each verdict names the record it follows: the request's previous verdict, whichever
    step or process published it."""
    kept, reread = Ledger(), Ledger()
    pending = sorted(events, key=lambda e: e.occurred_at)
    last_id: dict[str, str] = {}
    for minute in [*sorted(cuts), 200]:
        while pending and pending[0].occurred_at <= mm(minute):
            e = pending.pop(0)
            kept.add(e)
            reread.add(e)
        a, b = _settle(kept, minute), _settle(reread, minute)
        assert a == b
        for record, previous_id in a.verdicts:
            assert previous_id == last_id.get(record.request_id)
            last_id[record.request_id] = record.verdict_id
        reread = Ledger.loads(reread.dumps())
        assert reread.to_book() == kept.to_book()


@settings(max_examples=200, deadline=None)
@given(event_lists(), st.randoms(use_true_random=False))
def test_the_ledger_is_independent_of_arrival_order(events: list[Any], rnd: random.Random) -> None:
    shuffled = list(events)
    rnd.shuffle(shuffled)
    a, b = Ledger(), Ledger()
    for e in events:
        a.add(e)
    for e in shuffled:
        b.add(e)
    assert a.to_book() == b.to_book() == book_of(*events)
    assert _settle(a, 80) == _settle(b, 80)


def test_the_ledger_ignores_redeliveries_and_heartbeats_already_superseded() -> None:
    ledger = Ledger()
    for e in (requested(0), delivered(1), heartbeat(2), digest(3, "B")):
        assert ledger.add(e)
    for e in (requested(0), delivered(1), heartbeat(2), digest(3, "B")):
        assert not ledger.add(e)
    _settle(ledger, 6)
    assert not ledger.add(heartbeat(1))  # older than one judged with: irrelevant
    assert ledger.add(heartbeat(5.5))  # the new latest heartbeat
    with pytest.raises(ValueError, match="x2"):
        ledger.add(heartbeat(7).model_copy(update={"execution_id": "x2"}))


def test_the_reference_audit_played_through_the_ledger() -> None:
    """The six requests of the reference audit as events, settled minute by minute to 16:30
    by the ledger: the last verdict published per request is the reference one."""
    last: dict[str, ApprovalVerdictCode] = {}
    for f in _reference_facts():
        ledger = Ledger()
        for e in sorted(_events_of(f), key=lambda e: e.occurred_at):
            ledger.add(e)
        for minute in range(-30, 31):
            for v, _ in _settle(ledger, minute).verdicts:
                last[v.request_id] = v.verdict
    assert last == REFERENCE


def test_a_quiet_step_only_moves_evaluated_until() -> None:
    """Between change points a step judges nothing and publishes nothing, and the book it
    leaves is the one the reference leaves (``evaluated_until`` moved, nothing else)."""
    ledger, book = Ledger(), ApprovalBook()
    for e in (requested(0), delivered(1), acked(1), heartbeat(1)):
        ledger.add(e)
        book = add_fact(book, e)
    first = _settle(ledger, 2)
    book = _reference_step(book, 2)[0]
    assert first.change == _ms(5)  # the delivery deadline
    ledger.touched = False
    quiet = _settle(ledger, 4)
    assert (quiet.verdicts, quiet.orphans, quiet.change) == ((), (), first.change)
    assert ledger.touched and ledger.evaluated_until == _ms(4)
    assert ledger.to_book() == _reference_step(book, 4)[0]


@settings(max_examples=300, deadline=None)
@given(
    st.text(max_size=12),
    st.one_of(st.none(), st.text(max_size=12)),
    st.integers(0, 2 * 10**12),
    st.tuples(*[st.one_of(st.none(), st.integers(0, 10**7))] * 3),
    st.sampled_from([Risk.LOW, Risk.HIGH]),
)
def test_the_ledger_writes_and_reads_the_stored_json_of_any_text_and_time(
    text: str,
    maybe: str | None,
    ms: int,
    overrides: tuple[int | None, int | None, int | None],
    risk: Risk,
) -> None:
    """Ids, digests and references in any script (quotes, controls, astral characters),
    times at any millisecond, thresholds of any length: the JSON the ledger writes is the
    stored book's, byte for byte, and reading it back gives the same book."""
    grace, fresh, deadline = overrides
    t = from_ms(ms)
    events = [
        ApprovalRequested(
            event_id="e1",
            execution_id=text or "x",
            request_id=text or "r",
            action=text,
            action_digest=text,
            occurred_at=t,
            expires_at=None if maybe is None else t + timedelta(milliseconds=ms % 7919),
            approver_ref=maybe,
            resume_handle=maybe,
            risk=risk,
            policy=maybe,
            grace_seconds=grace,
            heartbeat_fresh_seconds=fresh,
            delivery_deadline_seconds=deadline,
        ),
        ApprovalDecision(
            event_id="e2",
            execution_id=text or "x",
            request_id=text or "r",
            occurred_at=t + timedelta(milliseconds=1),
            decision=D.ACCEPT,
            action_digest=maybe,
        ),
        CurrentActionDigest(
            event_id="e3", execution_id=text or "x", occurred_at=t, action_digest=text + "\n"
        ),
    ]
    ledger, book = Ledger(), ApprovalBook()
    for e in events:
        ledger.add(e)
        book = add_fact(book, e)
    for step in (0, 1):
        assert ledger.dumps() == book.model_dump_json()
        assert Ledger.loads(ledger.dumps()).to_book() == book == ledger.to_book()
        if step == 0:
            ledger.settle(ms + 10, RESOLVE, 60_000, 120_000)
            book = _reference_step_at(book, t + timedelta(milliseconds=10))


def _reference_step_at(book: ApprovalBook, at: datetime) -> ApprovalBook:
    book = advance(book, at, RESOLVE)[0]
    book = take_orphans(book, at - timedelta(minutes=1))[0]
    return purge_closed(book, at - timedelta(minutes=2))


@settings(max_examples=300, deadline=None)
@given(st.integers(-(2**41), 2**45))
def test_verdict_ids_hash_the_milliseconds_a_datetime_gives(ms: int) -> None:
    """``id_ms`` is what ``deterministic_id`` reads from the ``datetime`` of the same instant
    (through the float of ``timestamp()``), so ids published before the ledger stay the same."""
    t = from_ms(ms)
    assert to_ms(t) == ms
    assert id_ms(ms) == int(t.timestamp() * 1000)
    assert deterministic_id("verdict", "r1", V.WAITING, id_ms(ms)) == deterministic_id(
        "verdict", "r1", V.WAITING, t
    )


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from([None, "prod", "preview"]),
    st.sampled_from([None, "deploy", "prod"]),
    st.tuples(*[st.one_of(st.none(), st.integers(0, 10**6).map(lambda s: s * 1000))] * 3),
)
def test_thresholds_in_ms_are_those_resolved(
    policy: str | None, action: str, overrides: tuple[int | None, int | None, int | None]
) -> None:
    policies = {
        "prod": ThresholdOverrides(grace=timedelta(hours=1)),
        "preview": ThresholdSet(grace=timedelta(seconds=5), delivery_deadline=timedelta(0)),
    }
    resolver = threshold_resolver(policies, ThresholdSet(heartbeat_fresh=timedelta(minutes=3)))
    request = Request(action, "A", 0, None, "a", "h", Risk.LOW, policy, overrides)
    grace, fresh, deadline = overrides
    part = RequestPart(
        action=action,
        policy=policy,
        overrides=ThresholdOverrides(
            grace=None if grace is None else timedelta(milliseconds=grace),
            heartbeat_fresh=None if fresh is None else timedelta(milliseconds=fresh),
            delivery_deadline=None if deadline is None else timedelta(milliseconds=deadline),
        ),
    )
    th = resolve_thresholds(part, policies, ThresholdSet(heartbeat_fresh=timedelta(minutes=3)))
    ms = timedelta(milliseconds=1)
    expected = (th.grace // ms, th.heartbeat_fresh // ms, th.delivery_deadline // ms)
    assert resolver.millis(request) == expected
    assert resolver(ApprovalFacts(request_id="r", request=part)) == th


@settings(max_examples=200, deadline=None)
@given(event_lists(), st.randoms(use_true_random=False))
def test_book_is_independent_of_arrival_order(events: list[Any], rnd: random.Random) -> None:
    shuffled = list(events)
    rnd.shuffle(shuffled)
    a, b = book_of(*events), book_of(*shuffled)
    assert a == b
    assert advance(a, mm(80), RESOLVE) == advance(b, mm(80), RESOLVE)


# ---------------------------------------------------------------------------------------------
# One status per proof in every verdict
# ---------------------------------------------------------------------------------------------


def _split(reason: str) -> list[str]:
    return reason.split(",")


def test_no_approver_and_delivery_pending_is_one_failed_route_proof() -> None:
    """A request with no approver whose delivery is still pending: the route proof is FAILED
    (no approver) once, its reason also naming the pending delivery."""
    f = facts(approver_ref=None, deliveries=[], risk=Risk.HIGH)
    e = evaluate(f, mm(2), TH)
    route = [p for p in e.failed_proofs if p.proof is Proof.VERIFIED_ROUTE]
    assert len(route) == 1
    assert route[0].state is ProofState.FAILED
    assert _split(route[0].reason) == ["NO_APPROVER", "DELIVERY_PENDING", "ACK_PENDING"]
    assert e.verdict is V.UNROUTABLE_WAIT


def test_a_proof_with_two_failures_lists_both_reasons_once() -> None:
    f = facts(expires_at=mm(15), digests=[(10, "B")])
    (current,) = [p for p in evaluate(f, AT, TH).failed_proofs if p.proof is Proof.CURRENT_ACTION]
    assert current.state is ProofState.FAILED
    assert _split(current.reason) == ["REQUEST_EXPIRED", "ACTION_DIGEST_CHANGED"]


def test_unknown_reasons_only_leave_the_proof_unknown() -> None:
    """Two pending checks of one proof: UNKNOWN, both named."""
    f = facts(deliveries=[], risk=Risk.HIGH)
    (route,) = [p for p in evaluate(f, mm(2), TH).failed_proofs if p.proof is Proof.VERIFIED_ROUTE]
    assert (route.proof, route.state) == (Proof.VERIFIED_ROUTE, ProofState.UNKNOWN)
    assert _split(route.reason) == ["DELIVERY_PENDING", "ACK_PENDING"]


@st.composite
def books_with_any_route(draw: st.DrawFn) -> list[Any]:
    """``event_lists`` with requests that may lack an approver or an action digest too."""
    events = draw(event_lists())
    return [
        e.model_copy(
            update={
                "approver_ref": draw(st.sampled_from([None, "", "role:release-owner"])),
                "action_digest": draw(st.sampled_from([None, "A", "A"])),
            }
        )
        if isinstance(e, ApprovalRequested)
        else e
        for e in events
    ]


@settings(max_examples=300, deadline=None)
@given(books_with_any_route(), st.lists(st.integers(-5, 80), max_size=6))
def test_every_proof_occurs_at_most_once_in_every_verdict(
    events: list[Any], cuts: list[int]
) -> None:
    """In every published verdict each proof appears once, with one status: FAILED when any
    of its checks fails, else UNKNOWN."""
    book = book_of(*events)
    out: list[Any] = []
    for cut in [*sorted(cuts), 80]:
        book, step = advance(book, mm(cut), RESOLVE)
        out += step
    assert out
    for v in out:
        proofs = [p.proof for p in v.failed_proofs]
        assert len(proofs) == len(set(proofs)), v.failed_proofs
        for p in v.failed_proofs:
            reasons = _split(p.reason)
            assert reasons and len(reasons) == len(set(reasons)) and all(reasons)


@settings(max_examples=300, deadline=None)
@given(any_facts(), at_minute, thresholds)
def test_every_proof_occurs_at_most_once_in_every_evaluation(
    f: ApprovalFacts, at: datetime, th: ThresholdSet
) -> None:
    e = evaluate(f, at, th)
    proofs = [p.proof for p in e.failed_proofs]
    assert len(proofs) == len(set(proofs)), e.failed_proofs
