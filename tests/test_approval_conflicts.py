"""Approval facts that contradict the facts held: reported, and the rules say what stands.

Before, an ``ApprovalRequested`` issued again under its id with a new action digest changed
nothing and said nothing (the verdict stayed STALE_REQUEST, and the accept and receipt for the
new digest changed nothing either), and a second decision contradicting the first (accept,
then decline) was kept silently. Now each is a CONFLICTING_REQUEST or CONFLICTING_DECISION
anomaly that names the conflict and what stands (docs/rules.md, "Conflicting facts"); what
stands is what it was: the earliest request under an id, the first decision by time (on a
tie the more cautious).
"""

from __future__ import annotations

import itertools
from datetime import timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from streams.contracts.models import events as ev
from streams.contracts.models.enums import (
    AnomalyKind,
    ApprovalVerdictCode,
    DecisionCode,
    DeliveryOutcome,
    ExecutionStatus,
    Risk,
)
from streams.contracts.models.outputs import Anomaly, ApprovalVerdict
from streams.core.approvals.ledger import Ledger
from streams.engine.processor import Processor, Stores
from tests.test_processor import T0, TOPICS, env, ticks

EX = "ex-approve"
Q = "req-1"


def at(s: float) -> Any:
    return T0 + timedelta(seconds=s)


def request(digest: str = "d1", t: float = 1, **kw: Any) -> ev.ApprovalRequested:
    return ev.ApprovalRequested(
        event_id=f"req-{digest}-{t}",
        execution_id=EX,
        request_id=Q,
        action="deploy",
        action_digest=digest,
        occurred_at=at(t),
        approver_ref="alice",
        resume_handle="h",
        risk=Risk.LOW,
        **kw,
    )


def decision(code: DecisionCode, t: float, digest: str | None = "d1") -> ev.ApprovalDecision:
    return ev.ApprovalDecision(
        event_id=f"dec-{code}-{t}-{digest}",
        execution_id=EX,
        request_id=Q,
        occurred_at=at(t),
        decision=code,
        action_digest=digest,
    )


def receipt(t: float) -> ev.ResumeReceipt:
    return ev.ResumeReceipt(event_id=f"rr-{t}", execution_id=EX, request_id=Q, occurred_at=at(t))


def delivered(t: float) -> ev.ApprovalDelivery:
    return ev.ApprovalDelivery(
        event_id=f"dl-{t}",
        execution_id=EX,
        request_id=Q,
        occurred_at=at(t),
        outcome=DeliveryOutcome.DELIVERED,
    )


def findings(events: list[Any]) -> list[Any]:
    """Every conflict the ledger reports as the events are added in order."""
    ledger = Ledger(EX)
    out = []
    for e in events:
        found = ledger.conflict(e)
        if found is not None:
            out.append(found)
        ledger.add(e)
    return out


def run(events: list[Any], until: float = 600) -> list[Any]:
    """The events through the processor, then time past ``until``: every record out."""
    proc = Processor(TOPICS, Stores())
    out: list[Any] = []
    start = ev.ExecutionStatusChanged(
        event_id="s1",
        execution_id=EX,
        sequence=1,
        status=ExecutionStatus.WAITING_FOR_APPROVAL,
        occurred_at=at(0.5),
    )
    out += ticks(proc, at(0))
    for e in [start, *events]:
        out += [em.record for em in proc.handle(env(e))]
    out += ticks(proc, at(until))
    return out


def verdicts(out: list[Any]) -> list[ApprovalVerdictCode]:
    return [r.verdict for r in out if isinstance(r, ApprovalVerdict)]


def anomalies(out: list[Any]) -> list[Anomaly]:
    return [r for r in out if isinstance(r, Anomaly)]


# -- a request issued again ---------------------------------------------------------------------
def test_a_request_issued_again_with_a_new_digest_is_a_conflict_and_the_first_stands() -> None:
    """The issue's case: request d1, the run moves to d2, the request is issued again under
    its id for d2, accepted for d2, and the run resumes. The re-issue is reported naming
    both digests; the request for d1 stands, so the accept (for d2) is stale, as before."""
    events = [
        request("d1", 1),
        delivered(1.5),
        ev.CurrentActionDigest(
            event_id="cd", execution_id=EX, occurred_at=at(5), action_digest="d2"
        ),
        request("d2", 6),
        decision(DecisionCode.ACCEPT, 8, "d2"),
        receipt(9),
    ]
    out = run(events)
    (anomaly,) = anomalies(out)
    assert anomaly.kind is AnomalyKind.CONFLICTING_REQUEST
    assert anomaly.event_id == "req-d2-6"
    assert "action_digest 'd1' → 'd2'" in anomaly.reason
    assert "the request read before stands" in anomaly.reason
    assert "a changed action needs a new request id" in anomaly.reason
    # what stands is the request for d1: the verdicts are those of the stream without the re-issue
    without = run([e for e in events if e.event_id != "req-d2-6"])
    assert verdicts(out) == verdicts(without)
    assert verdicts(out)[-1] is ApprovalVerdictCode.STALE_REQUEST


def test_a_request_sent_again_unchanged_or_only_later_is_no_conflict() -> None:
    assert findings([request("d1", 1), request("d1", 1)]) == []
    assert findings([request("d1", 1), request("d1", 3)]) == []


def test_a_request_issued_again_with_other_content_names_each_difference() -> None:
    (found,) = findings([request("d1", 1), request("d1", 2, expires_at=at(100), policy="p")])
    assert found.kind is AnomalyKind.CONFLICTING_REQUEST
    assert "expires_at none → '2026-07-26T16:01:40Z'" in found.reason
    assert "policy none → 'p'" in found.reason


def test_an_earlier_request_read_later_stands_and_says_so() -> None:
    """Read in the other order (a late event), the earliest still stands: the anomaly of the
    one read second says it replaces the first."""
    (found,) = findings([request("d2", 6), request("d1", 1)])
    assert "this one stands, being the earliest under the id" in found.reason


# -- a second decision --------------------------------------------------------------------------
def test_a_decline_after_an_accept_is_a_conflict_and_the_accept_stands() -> None:
    events = [request("d1", 1), delivered(1.5), decision(DecisionCode.ACCEPT, 5)]
    decline = decision(DecisionCode.DECLINE, 7)
    out = run([*events, decline, receipt(8)])
    (anomaly,) = anomalies(out)
    assert anomaly.kind is AnomalyKind.CONFLICTING_DECISION
    assert anomaly.event_id == decline.event_id
    assert "DECLINE of digest 'd1' at 2026-07-26T16:00:07Z" in anomaly.reason
    assert "contradicts ACCEPT of digest 'd1' at 2026-07-26T16:00:05Z" in anomaly.reason
    assert "the first, ACCEPT of digest 'd1' at 2026-07-26T16:00:05Z, counts" in anomaly.reason
    # the accept counts: the run resumes, as without the decline
    assert verdicts(out)[-1] is ApprovalVerdictCode.RESUMED
    assert verdicts(out) == verdicts(run([*events, receipt(8)]))


def test_a_repeated_identical_decision_is_no_conflict() -> None:
    accept = decision(DecisionCode.ACCEPT, 5)
    again = accept.model_copy(update={"event_id": "another-id"})
    assert findings([request(), accept, again]) == []
    # nor is the first decision read again after a conflicting one
    decline = decision(DecisionCode.DECLINE, 7)
    assert [f.kind for f in findings([request(), accept, decline, again])] == [
        AnomalyKind.CONFLICTING_DECISION
    ]


def test_an_accept_for_another_digest_after_an_accept_is_a_conflict() -> None:
    (found,) = findings(
        [request(), decision(DecisionCode.ACCEPT, 5), decision(DecisionCode.ACCEPT, 6, "d2")]
    )
    assert found.kind is AnomalyKind.CONFLICTING_DECISION
    assert "ACCEPT of digest 'd2'" in found.reason


@given(
    codes=st.lists(st.sampled_from(list(DecisionCode)[:3]), min_size=2, max_size=4, unique=True),
    same_time=st.booleans(),
    order=st.randoms(use_true_random=False),
)
def test_whatever_the_order_one_decision_stands_and_each_contradiction_is_reported(
    codes: list[DecisionCode], same_time: bool, order: Any
) -> None:
    """Decisions with different codes, at one instant or one after another, read in any
    order: every one read after one it contradicts is reported, and each report names the
    decision that counts among those read so far (the first by time; on a tie the most
    cautious), which is the one the verdict is judged on."""
    decisions = [decision(c, 5 if same_time else 5 + i) for i, c in enumerate(codes)]
    caution = {DecisionCode.DECLINE: 0, DecisionCode.CANCEL: 1, DecisionCode.ACCEPT: 2}
    shuffled = list(decisions)
    order.shuffle(shuffled)
    found = findings([request(), *shuffled])
    assert len(found) == len(decisions) - 1
    assert all(f.kind is AnomalyKind.CONFLICTING_DECISION for f in found)
    for k, f in enumerate(found, start=1):
        d = shuffled[k]
        first = min(shuffled[: k + 1], key=lambda d: (d.occurred_at, caution[d.decision]))
        if d is first:
            assert f"this {first.decision.value} of digest 'd1' is the first" in f.reason
        else:
            assert f"the first, {first.decision.value} of digest 'd1'" in f.reason


def test_decisions_before_their_request_are_judged_alike() -> None:
    """A decision held for a request that has not come yet is compared all the same."""
    for facts in itertools.permutations(
        [decision(DecisionCode.ACCEPT, 5), decision(DecisionCode.CANCEL, 6)]
    ):
        assert [f.kind for f in findings(list(facts))] == [AnomalyKind.CONFLICTING_DECISION]
