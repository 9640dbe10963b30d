"""The four proofs, the verdict and its precedence: ``evaluate`` and ``change_points``.

A pause for a human is valid only while four proofs hold (current action, verified route, live
resume, consumed decision). This module keeps, per approval request, the *facts* seen so far and
computes the verdict as a pure function ``evaluate(facts, at, thresholds)``. Arrival order
between topics therefore cannot change an answer, and the live worker, a replay and the offline
audit all share this one function.

Time rules (every one chosen so that a deadline fires at one exact instant, which makes the
set of instants where a verdict can change — ``change_points`` — exact):

* a fact counts at evaluation time ``at`` when its time is ``<= at``; a fact whose time is
  unknown (``None``, offline snapshots only) is known to have happened before ``at``;
* a deadline is reached *at* its instant: expired when ``at >= expires_at``, grace over when
  ``at >= decided_at + grace``, delivery overdue when ``at >= requested_at + deadline``, a
  heartbeat stale when ``at >= heartbeat + fresh``;
* an unknown time is answered conservatively, question by question: an unknown request time is
  "old" (its deadlines have passed), an unknown decision time has used up its grace and is
  judged against expiry and digest as of ``at``, an unknown heartbeat time proves nothing.

Decisions: the first decision (by time; on a tie decline before cancel before accept, the more
cautious first) is the one that counts. A later decision with a *different* code does not
change the verdict — an approver cannot take back an answer the run may already have acted on
— but ``CONTRADICTING_DECISION`` is listed among the reasons of ``CONSUMED_DECISION`` (UNKNOWN
unless the proof fails for another reason) so a human sees the dispute. A repeated identical
decision is a duplicate and ignored.

Evidence: each proof that does not hold appears once per verdict, FAILED if any of its checks
fails, else UNKNOWN, its ``reason`` every such check's code, comma-separated, the failed ones
first (see ``_one_per_proof``).

Nothing here imports Kafka, Faust or asyncio, or reads a clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from pydantic import AwareDatetime

from streams.contracts.models.base import construct, to_millis
from streams.contracts.models.enums import (
    ApprovalVerdictCode,
    DecisionCode,
    DeliveryOutcome,
    Owner,
    Proof,
    ProofState,
)
from streams.contracts.models.outputs import ApprovalVerdict, ProofFinding, Thresholds
from streams.core.approvals.facts import (
    ApprovalFacts,
    DecisionFact,
    RequestPart,
    _sort_key,
    _TimedModel,
)
from streams.core.approvals.thresholds import ThresholdSet
from streams.core.approvals.vocabulary import (
    _DECISION_CAUTION,
    _EARLIEST,
    _PROOF_ORDER,
    ACK_MISSING,
    ACK_PENDING,
    ACTION_DIGEST_CHANGED,
    ACTION_DIGEST_UNKNOWN,
    CONTRADICTING_DECISION,
    DECIDED_AFTER_DIGEST_CHANGE,
    DECIDED_AFTER_EXPIRY,
    DECISION_FOR_OTHER_DIGEST,
    DECISION_UNRECOGNIZED,
    DELIVERY_FAILED,
    DELIVERY_PENDING,
    DELIVERY_UNCONFIRMED,
    DIGEST_CHANGED_AT_UNKNOWN_TIME,
    HEARTBEAT_NEVER_SEEN,
    HEARTBEAT_NOT_YET_SEEN,
    HEARTBEAT_STALE,
    NO_APPROVER,
    NO_RESUME_HANDLE,
    NO_RESUME_RECEIPT,
    REQUEST_EXPIRED,
    RESUME_RECEIPT_PENDING,
    VERDICT_GUIDANCE,
    V,
)
from streams.core.ids import deterministic_id, scoped_key


class Evaluation(_TimedModel):
    """The verdict on one request at one instant, with every proof that does not hold."""

    request_id: str
    execution_id: str | None
    verdict: ApprovalVerdictCode
    failed_proofs: tuple[ProofFinding, ...]
    owner: Owner
    next_step: str
    thresholds: Thresholds
    evaluated_at: AwareDatetime


def _finding(proof: Proof, state: ProofState, reason: str) -> ProofFinding:
    # Built without re-validation (several per evaluation): enums and a reason code.
    return construct(ProofFinding, {"proof": proof, "state": state, "reason": reason})


def _failed(proof: Proof, reason: str) -> ProofFinding:
    return _finding(proof, ProofState.FAILED, reason)


def _unknown(proof: Proof, reason: str) -> ProofFinding:
    return _finding(proof, ProofState.UNKNOWN, reason)


def _counts(time: datetime | None, at: datetime) -> bool:
    return time is None or time <= at


def _digest_changed(facts: ApprovalFacts, req: RequestPart, at: datetime) -> bool | None:
    """Whether the run's current action digest differs from the request's at ``at``.

    The request itself states the current digest at its time, so only digest facts *after*
    ``requested_at`` can change it; among those the latest (known) time wins, and a tie counts
    as a change if any of the tied digests differs. Digests of unknown time (snapshots) are
    the current digest as far as is known; they are used only when no timed change exists.
    Returns None when the request's own digest is unknown (nothing to compare).
    """
    if req.action_digest is None:
        return None
    since = req.requested_at or _EARLIEST
    timed = [d for d in facts.digests if d.at is not None and since < d.at <= at]
    if timed:
        latest = max(d.at for d in timed if d.at is not None)
        return any(d.digest != req.action_digest for d in timed if d.at == latest)
    return any(d.digest != req.action_digest for d in facts.digests if d.at is None)


def _digest_change_time_unknown(facts: ApprovalFacts, req: RequestPart, at: datetime) -> bool:
    """True when the only evidence of a digest change has no time (a snapshot)."""
    since = req.requested_at or _EARLIEST
    return not any(d.at is not None and since < d.at <= at for d in facts.digests) and any(
        d.at is None and d.digest != req.action_digest for d in facts.digests
    )


def _current_action(facts: ApprovalFacts, req: RequestPart, at: datetime) -> list[ProofFinding]:
    """Proof 1 for a request still waiting: not expired and the digest unchanged at ``at``."""
    out: list[ProofFinding] = []
    if req.expires_at is not None and at >= req.expires_at:
        out.append(_failed(Proof.CURRENT_ACTION, REQUEST_EXPIRED))
    changed = _digest_changed(facts, req, at)
    if changed is None:
        out.append(_unknown(Proof.CURRENT_ACTION, ACTION_DIGEST_UNKNOWN))
    elif changed:
        out.append(_failed(Proof.CURRENT_ACTION, ACTION_DIGEST_CHANGED))
    return out


def _binding(
    facts: ApprovalFacts, req: RequestPart, decision: DecisionFact, at: datetime
) -> list[ProofFinding]:
    """Proof 1 as it stood when the decision was made: was it made on the current action?

    A decision of unknown time is judged as of ``at`` (the latest it can have happened).
    """
    when = decision.at or at
    out: list[ProofFinding] = []
    if req.expires_at is not None and when >= req.expires_at:
        out.append(_failed(Proof.CURRENT_ACTION, DECIDED_AFTER_EXPIRY))
    changed = _digest_changed(facts, req, when)
    if changed is None:
        out.append(_unknown(Proof.CURRENT_ACTION, ACTION_DIGEST_UNKNOWN))
    elif changed:
        out.append(_failed(Proof.CURRENT_ACTION, DECIDED_AFTER_DIGEST_CHANGE))
    if (
        decision.action_digest is not None
        and req.action_digest is not None
        and decision.action_digest != req.action_digest
    ):
        out.append(_failed(Proof.CURRENT_ACTION, DECISION_FOR_OTHER_DIGEST))
    return out


def _verified_route(
    facts: ApprovalFacts, req: RequestPart, at: datetime, th: ThresholdSet
) -> list[ProofFinding]:
    """Proof 2: an approver, a confirmed delivery and, unless the risk is known to be low, an
    acknowledgement. An acknowledgement also proves delivery (the approver saw it). A missing
    confirmation is UNKNOWN until ``requested_at + delivery_deadline``, FAILED from then on.
    """
    out: list[ProofFinding] = []
    if not req.approver_ref:
        out.append(_failed(Proof.VERIFIED_ROUTE, NO_APPROVER))
    overdue = req.requested_at is None or at >= req.requested_at + th.delivery_deadline
    acked = any(_counts(t, at) for t in facts.acknowledgements)
    outcomes = {d.outcome for d in facts.deliveries if _counts(d.at, at)}
    if not acked and DeliveryOutcome.DELIVERED not in outcomes:
        if DeliveryOutcome.FAILED in outcomes:
            out.append(_failed(Proof.VERIFIED_ROUTE, DELIVERY_FAILED))
        elif overdue:
            out.append(_failed(Proof.VERIFIED_ROUTE, DELIVERY_UNCONFIRMED))
        else:
            out.append(_unknown(Proof.VERIFIED_ROUTE, DELIVERY_PENDING))
    if req.needs_acknowledgement and not acked:
        if overdue:
            out.append(_failed(Proof.VERIFIED_ROUTE, ACK_MISSING))
        else:
            out.append(_unknown(Proof.VERIFIED_ROUTE, ACK_PENDING))
    return out


def _live_resume(
    facts: ApprovalFacts, req: RequestPart, at: datetime, th: ThresholdSet
) -> list[ProofFinding]:
    """Proof 3: a resume handle and a fresh heartbeat.

    Fresh means the latest heartbeat (of known time, ``<= at``) is younger than the window.
    Without one, the request itself shows the run was alive when it asked, so until
    ``requested_at + heartbeat_fresh`` the proof is UNKNOWN (not yet seen), FAILED after.
    """
    out: list[ProofFinding] = []
    if not req.resume_handle:
        out.append(_failed(Proof.LIVE_RESUME, NO_RESUME_HANDLE))
    seen = [t for t in facts.heartbeats if t is not None and t <= at]
    if seen and at < max(seen) + th.heartbeat_fresh:
        return out
    if req.requested_at is not None and at < req.requested_at + th.heartbeat_fresh:
        out.append(_unknown(Proof.LIVE_RESUME, HEARTBEAT_NOT_YET_SEEN))
    else:
        out.append(_failed(Proof.LIVE_RESUME, HEARTBEAT_STALE if seen else HEARTBEAT_NEVER_SEEN))
    return out


def _consumed(
    facts: ApprovalFacts, decision: DecisionFact, at: datetime, th: ThresholdSet
) -> list[ProofFinding]:
    """Proof 4: a resume receipt (any time up to ``at``: a late receipt still ends the wait).

    A decision of unknown time is taken to have used up its grace (it cannot be shown inside).
    """
    if any(_counts(t, at) for t in facts.receipts):
        return []
    if decision.at is not None and at < decision.at + th.grace:
        return [_unknown(Proof.CONSUMED_DECISION, RESUME_RECEIPT_PENDING)]
    return [_failed(Proof.CONSUMED_DECISION, NO_RESUME_RECEIPT)]


def _first_decision(decisions: list[DecisionFact]) -> DecisionFact:
    return min(decisions, key=lambda d: (*_sort_key(d.at), _DECISION_CAUTION[d.code]))


def _has(findings: Iterable[ProofFinding], proof: Proof, state: ProofState) -> bool:
    return any(f.proof is proof and f.state is state for f in findings)


#: Separates the reason codes of one proof that fails (or is pending) for several reasons.
REASON_SEPARATOR = ","


def _one_per_proof(findings: Iterable[ProofFinding]) -> tuple[ProofFinding, ...]:
    """One finding per proof, in proof order: a proof has one status per verdict.

    FAILED if any of its checks fails, else UNKNOWN; the reason lists every check that does
    not hold, once each, the failed ones first (the first is the decisive one), each group in
    the order the evaluator checks them. Several findings per proof would publish one proof
    as refuted and pending at once (no approver, and its delivery still pending)."""
    by_proof: dict[Proof, tuple[list[str], list[str]]] = {}
    for f in findings:
        failed, unknown = by_proof.setdefault(f.proof, ([], []))
        reasons = failed if f.state is ProofState.FAILED else unknown
        if f.reason not in reasons:
            reasons.append(f.reason)
    out = []
    for proof in sorted(by_proof, key=_PROOF_ORDER.__getitem__):
        failed, unknown = by_proof[proof]
        state = ProofState.FAILED if failed else ProofState.UNKNOWN
        out.append(_finding(proof, state, REASON_SEPARATOR.join(failed + unknown)))
    return tuple(out)


def evaluate(facts: ApprovalFacts, at: datetime, thresholds: ThresholdSet) -> Evaluation:
    """The verdict at ``at``, by precedence (docs/rules.md#precedence), counting only facts up
    to ``at``.

    1. decline → CLOSED_BY_DECLINE, cancel → CLOSED_BY_CANCEL (before expiry is looked at);
    2. accept → STALE_REQUEST if made after expiry or after the digest changed (or for another
       digest); else RESUMED with a receipt, RESUMING inside the grace, STUCK_AFTER_DECISION;
    3. no decision → STALE_REQUEST, ORPHANED_WAIT, UNROUTABLE_WAIT, UNCERTAIN, WAITING.

    Evidence lists every proof that does not hold and is meaningful for the branch: a decision
    proves the route, so VERIFIED_ROUTE is only judged while no decision exists; a receipt
    proves live resume. Raises ValueError when the request itself is not known at ``at``.
    """
    req = facts.request
    if req is None:
        raise ValueError(f"request {facts.request_id} has not been seen: nothing to judge")
    if req.requested_at is not None and req.requested_at > at:
        raise ValueError(f"request {facts.request_id} was made after {at.isoformat()}")

    decisions = [d for d in facts.decisions if _counts(d.at, at)]
    known = [d for d in decisions if d.code is not DecisionCode.UNRECOGNIZED]
    findings: list[ProofFinding] = []
    verdict: ApprovalVerdictCode
    if known:
        first = _first_decision(known)
        bound = _binding(facts, req, first, at)
        stale = _has(bound, Proof.CURRENT_ACTION, ProofState.FAILED)
        receipt = any(_counts(t, at) for t in facts.receipts)
        if first.code is DecisionCode.ACCEPT:
            if stale and receipt and _digest_change_time_unknown(facts, req, first.at or at):
                # A snapshot says the digest differs but not since when. The run consumed the
                # accept, so the change is most plausibly the run moving on: not stale, but say
                # that the binding could not be shown.
                bound = [f for f in bound if f.reason != DECIDED_AFTER_DIGEST_CHANGE]
                bound.append(_unknown(Proof.CURRENT_ACTION, DIGEST_CHANGED_AT_UNKNOWN_TIME))
                stale = _has(bound, Proof.CURRENT_ACTION, ProofState.FAILED)
            findings += bound
            if not receipt:
                findings += _live_resume(facts, req, at, thresholds)
            if stale:
                verdict = V.STALE_REQUEST
            else:
                consumed = _consumed(facts, first, at, thresholds)
                findings += consumed
                if receipt:
                    verdict = V.RESUMED
                elif _has(consumed, Proof.CONSUMED_DECISION, ProofState.UNKNOWN):
                    verdict = V.RESUMING
                else:
                    verdict = V.STUCK_AFTER_DECISION
        else:
            # Closed either way; the evidence still says if the answer came on a stale request
            # and whether the run has taken it (a declined run that never resumes is hanging).
            findings += bound
            findings += _consumed(facts, first, at, thresholds)
            verdict = (
                V.CLOSED_BY_DECLINE if first.code is DecisionCode.DECLINE else V.CLOSED_BY_CANCEL
            )
        if any(d.code is not first.code for d in decisions):
            findings.append(_unknown(Proof.CONSUMED_DECISION, CONTRADICTING_DECISION))
    else:
        findings += _current_action(facts, req, at)
        findings += _verified_route(facts, req, at, thresholds)
        findings += _live_resume(facts, req, at, thresholds)
        if decisions:
            findings.append(_unknown(Proof.CONSUMED_DECISION, DECISION_UNRECOGNIZED))
        if _has(findings, Proof.CURRENT_ACTION, ProofState.FAILED):
            verdict = V.STALE_REQUEST
        elif _has(findings, Proof.LIVE_RESUME, ProofState.FAILED):
            verdict = V.ORPHANED_WAIT
        elif _has(findings, Proof.VERIFIED_ROUTE, ProofState.FAILED):
            verdict = V.UNROUTABLE_WAIT
        elif findings:
            verdict = V.UNCERTAIN
        else:
            verdict = V.WAITING

    owner, next_step = VERDICT_GUIDANCE[verdict]
    ordered = _one_per_proof(findings)
    # Built without re-validation: ``record`` has refused a naive ``at`` already, and the
    # time is put in UTC milliseconds as the validator would.
    record = thresholds.record(at)
    return construct(
        Evaluation,
        {
            "request_id": facts.request_id,
            "execution_id": facts.execution_id,
            "verdict": verdict,
            "failed_proofs": tuple(ordered),
            "owner": owner,
            "next_step": next_step,
            "thresholds": record,
            "evaluated_at": to_millis(at),
        },
    )


def change_points(facts: ApprovalFacts, thresholds: ThresholdSet) -> tuple[datetime, ...]:
    """Every instant at which ``evaluate`` can give a different answer, sorted.

    Between two consecutive points the verdict is constant, because every fact and every
    deadline is compared with ``<= at`` / ``>= deadline``: fact times, the request time,
    expiry, request + delivery deadline, request + heartbeat window, every heartbeat +
    freshness, every decision + grace. Points before the request are left out (nothing to
    judge there). Unknown times are no points: they count from the start.
    """
    req = facts.request
    points: set[datetime] = set()

    def add(time: datetime | None, plus: timedelta = timedelta(0)) -> None:
        if time is not None:
            points.add(time + plus)

    for d in facts.deliveries:
        add(d.at)
    for d in facts.decisions:
        add(d.at)
        add(d.at, thresholds.grace)
    for d in facts.digests:
        add(d.at)
    for t in (*facts.acknowledgements, *facts.receipts):
        add(t)
    for t in facts.heartbeats:
        add(t)
        add(t, thresholds.heartbeat_fresh)
    if req is not None:
        add(req.requested_at)
        add(req.expires_at)
        add(req.requested_at, thresholds.delivery_deadline)
        add(req.requested_at, thresholds.heartbeat_fresh)
        if req.requested_at is not None:
            start = req.requested_at
            points = {p for p in points if p >= start}
    return tuple(sorted(points))


def verdict_id(
    execution_id: str | None, request_id: str, verdict: ApprovalVerdictCode, at_ms: int
) -> str:
    """The id of the verdict record of a request at a change point (epoch ms): scoped by the
    execution (docs/rules.md#ids-and-keys), since request ids repeat across executions."""
    return deterministic_id("verdict", scoped_key(execution_id or "", request_id), verdict, at_ms)


def unscoped_verdict_id(request_id: str, verdict: ApprovalVerdictCode, at_ms: int) -> str:
    """The id a verdict had before ids were scoped by the execution (83a7350 and before): the
    RESOLVED alert ending an alert fired then must name that verdict's id."""
    return deterministic_id("verdict", request_id, verdict, at_ms)


def to_verdict(
    evaluation: Evaluation,
    previous: ApprovalVerdictCode | None = None,
    request: RequestPart | None = None,
) -> ApprovalVerdict:
    """The published record; its id is a function of request, verdict and evaluation time,
    so a replay or a redelivery publishes the very same record. ``request`` gives the action
    and request time a reader needs to list waits by action and age; they are not part of
    the id, which stays what it was before they were published."""
    # Built without re-validation: every value comes from a valid evaluation.
    return construct(
        ApprovalVerdict,
        {
            "verdict_id": verdict_id(
                evaluation.execution_id,
                evaluation.request_id,
                evaluation.verdict,
                int(evaluation.evaluated_at.timestamp() * 1000),
            ),
            "request_id": evaluation.request_id,
            "execution_id": evaluation.execution_id or "",
            "verdict": evaluation.verdict,
            "previous_verdict": previous,
            "failed_proofs": evaluation.failed_proofs,
            "owner": evaluation.owner,
            "next_step": evaluation.next_step,
            "thresholds": evaluation.thresholds,
            "evaluated_at": to_millis(evaluation.evaluated_at),
            "action": request.action if request is not None else None,
            "requested_at": (
                to_millis(request.requested_at)
                if request is not None and request.requested_at is not None
                else None
            ),
            "traceparent": None,  # trace context is the shell's to stamp
        },
    )
