"""Approval waits: the four proofs, the verdict and its precedence.

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

from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any, TypeVar

from pydantic import AwareDatetime, BaseModel, ConfigDict, field_validator

from streams.core.ids import deterministic_id
from streams.models.base import construct, replace, to_millis
from streams.models.enums import (
    ApprovalVerdictCode,
    DecisionCode,
    DeliveryOutcome,
    Owner,
    Proof,
    ProofState,
    Risk,
)
from streams.models.events import (
    ApprovalDecision,
    ApprovalDelivery,
    ApprovalRequested,
    ApproverAcknowledgement,
    CurrentActionDigest,
    RequesterHeartbeat,
    ResumeReceipt,
)
from streams.models.outputs import ApprovalVerdict, ProofFinding, Thresholds

V = ApprovalVerdictCode

#: Sorts before every real time: the position of a fact whose time is unknown.
_EARLIEST = datetime.min.replace(tzinfo=UTC)

# --------------------------------------------------------------------------------------------
# Verdict vocabulary: owner, next safe step, severity
# --------------------------------------------------------------------------------------------

#: Owner and next safe step per verdict. The first six are the specification's table verbatim; the
#: four the project adds are chosen as follows: CLOSED_BY_CANCEL goes to the requester (it must not
#: proceed, and only it can ask again); RESUMING and RESUMED belong to the runtime owner, whose run
#: holds the next step (nobody needs to act); UNCERTAIN goes to the operator, because no party has
#: failed yet — a proof is pending inside its deadline.
VERDICT_GUIDANCE: Mapping[ApprovalVerdictCode, tuple[Owner, str]] = {
    V.WAITING: (
        Owner.APPROVER,
        "let the run stay paused; notify only as the escalation policy says",
    ),
    V.STALE_REQUEST: (
        Owner.REQUESTER,
        "withdraw the old request; make a new one only if the current action still needs authority",
    ),
    V.UNROUTABLE_WAIT: (
        Owner.POLICY_OWNER,
        "repair routing or escalate to the policy owner; do not restart",
    ),
    V.ORPHANED_WAIT: (
        Owner.RUNTIME_OWNER,
        "preserve the decision records, then re-run with explicit authority",
    ),
    V.STUCK_AFTER_DECISION: (
        Owner.RUNTIME_OWNER,
        "investigate the continuation; never ask the approver again",
    ),
    V.CLOSED_BY_DECLINE: (
        Owner.REQUESTER,
        "stop the action or offer a non-destructive alternative",
    ),
    V.CLOSED_BY_CANCEL: (
        Owner.REQUESTER,
        "do not proceed with the action; ask again only through the escalation policy",
    ),
    V.RESUMING: (
        Owner.RUNTIME_OWNER,
        "nothing yet: the run is taking the decision inside its grace period; "
        "do not ask the approver again",
    ),
    V.RESUMED: (
        Owner.RUNTIME_OWNER,
        "nothing: the run took the decision and moved on; the wait is over",
    ),
    V.UNCERTAIN: (
        Owner.OPERATOR,
        "mark it uncertain and ask before acting; the pending proof settles by its deadline "
        "(see failed_proofs); do not restart the action",
    ),
}

#: How urgently a human must act, 0 = not at all. Used to state "a resume receipt never makes
#: a verdict worse" precisely, and available to alerting. Closed requests need only the
#: requester to stand down; a stale or broken wait needs repair; a decided run that does not
#: continue is the worst case (the approver answered and nothing happens).
VERDICT_SEVERITY: Mapping[ApprovalVerdictCode, int] = {
    V.RESUMED: 0,
    V.RESUMING: 1,
    V.CLOSED_BY_DECLINE: 2,
    V.CLOSED_BY_CANCEL: 2,
    V.WAITING: 3,
    V.UNCERTAIN: 4,
    V.STALE_REQUEST: 5,
    V.UNROUTABLE_WAIT: 6,
    V.ORPHANED_WAIT: 7,
    V.STUCK_AFTER_DECISION: 8,
    V.UNRECOGNIZED: 9,
}

#: Verdicts after which the wait is over: they leave ``open_request_ids`` and may be purged.
CLOSED_VERDICTS: frozenset[ApprovalVerdictCode] = frozenset(
    {V.CLOSED_BY_DECLINE, V.CLOSED_BY_CANCEL, V.RESUMED}
)

#: Verdicts that the passing of time alone can no longer change (only a new fact can), so that
#: ``advance`` need not re-evaluate them at every change point.
_TIME_FINAL = CLOSED_VERDICTS

# Reason codes of ProofFinding.reason: stable strings a consumer may match on.
REQUEST_EXPIRED = "REQUEST_EXPIRED"
ACTION_DIGEST_CHANGED = "ACTION_DIGEST_CHANGED"
ACTION_DIGEST_UNKNOWN = "ACTION_DIGEST_UNKNOWN"
DECIDED_AFTER_EXPIRY = "DECIDED_AFTER_EXPIRY"
DECIDED_AFTER_DIGEST_CHANGE = "DECIDED_AFTER_DIGEST_CHANGE"
DECISION_FOR_OTHER_DIGEST = "DECISION_FOR_OTHER_DIGEST"
DIGEST_CHANGED_AT_UNKNOWN_TIME = "DIGEST_CHANGED_AT_UNKNOWN_TIME"
NO_APPROVER = "NO_APPROVER"
DELIVERY_FAILED = "DELIVERY_FAILED"
DELIVERY_PENDING = "DELIVERY_PENDING"
DELIVERY_UNCONFIRMED = "DELIVERY_UNCONFIRMED"
ACK_PENDING = "ACK_PENDING"
ACK_MISSING = "ACK_MISSING"
NO_RESUME_HANDLE = "NO_RESUME_HANDLE"
HEARTBEAT_NOT_YET_SEEN = "HEARTBEAT_NOT_YET_SEEN"
HEARTBEAT_STALE = "HEARTBEAT_STALE"
HEARTBEAT_NEVER_SEEN = "HEARTBEAT_NEVER_SEEN"
RESUME_RECEIPT_PENDING = "RESUME_RECEIPT_PENDING"
NO_RESUME_RECEIPT = "NO_RESUME_RECEIPT"
CONTRADICTING_DECISION = "CONTRADICTING_DECISION"
DECISION_UNRECOGNIZED = "DECISION_UNRECOGNIZED"

_PROOF_ORDER = {p: i for i, p in enumerate(Proof)}
#: Tie-break between decisions at the same instant: the more cautious answer counts.
_DECISION_CAUTION = {
    DecisionCode.DECLINE: 0,
    DecisionCode.CANCEL: 1,
    DecisionCode.ACCEPT: 2,
    DecisionCode.UNRECOGNIZED: 3,
}


# --------------------------------------------------------------------------------------------
# Thresholds
# --------------------------------------------------------------------------------------------


class _Frozen(BaseModel):
    """Immutable, strict, JSON-storable (``model_dump_json`` / ``model_validate_json``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def _non_negative(value: timedelta | None) -> timedelta | None:
    if value is not None and value < timedelta(0):
        raise ValueError("a threshold cannot be negative")
    return value


class _NonNegative(_Frozen):
    @field_validator("*")
    @classmethod
    def _check(cls, value: timedelta | None) -> timedelta | None:
        return _non_negative(value)


class ThresholdSet(_NonNegative):
    """The three deadlines a verdict depends on, with the specification's defaults."""

    grace: timedelta = timedelta(minutes=5)
    heartbeat_fresh: timedelta = timedelta(minutes=10)
    delivery_deadline: timedelta = timedelta(minutes=5)

    def record(self, evaluated_at: datetime) -> Thresholds:
        """The contract form published with every verdict (milliseconds plus evaluation time)."""
        ms = timedelta(milliseconds=1)
        values = {
            "grace_ms": self.grace // ms,
            "heartbeat_fresh_ms": self.heartbeat_fresh // ms,
            "delivery_deadline_ms": self.delivery_deadline // ms,
            "evaluated_at": evaluated_at,
        }
        if evaluated_at.tzinfo is None:
            return Thresholds(**values)  # refused, with validation's own error
        # Built without re-validation (once per evaluation): whole milliseconds are ints, and
        # the time is put in UTC milliseconds as the record's validator would.
        values["evaluated_at"] = to_millis(evaluated_at)
        return construct(Thresholds, values)


class ThresholdOverrides(_NonNegative):
    """A partial ThresholdSet: what one request or one action policy says; None = not said."""

    grace: timedelta | None = None
    heartbeat_fresh: timedelta | None = None
    delivery_deadline: timedelta | None = None


# --------------------------------------------------------------------------------------------
# Facts
# --------------------------------------------------------------------------------------------

#: A fact's time; None = unknown, but known to have happened before the evaluation.
FactTime = AwareDatetime | None


def _utc_ms(value: Any) -> Any:
    """Times as the contracts hold them (UTC, milliseconds), so that stored facts, change
    points and published ``evaluated_at`` all agree to the millisecond."""
    return to_millis(value) if isinstance(value, datetime) else value


def _sort_key(time: datetime | None) -> tuple[bool, datetime]:
    return (time is not None, time or _EARLIEST)


T = TypeVar("T")


def _canonical(items: Iterable[T], key: Callable[[T], Any]) -> tuple[T, ...]:
    """Sorted and without duplicates: the same facts in any order make the same value."""
    return tuple(sorted(set(items), key=key))


class _TimedModel(_Frozen):
    @field_validator("*")
    @classmethod
    def _times(cls, value: Any) -> Any:
        return _utc_ms(value)


class RequestPart(_TimedModel):
    """What the ``ApprovalRequested`` event said. Only the minimum is kept (as specified):
    route reference, digest, handle reference and times — no raw request, no personal data.

    ``risk`` None means unknown and is judged like HIGH (the stricter route proof), as is
    UNRECOGNIZED: a route is not "verified" on a guess about the policy.
    """

    action: str | None = None
    action_digest: str | None = None
    requested_at: FactTime = None
    expires_at: FactTime = None
    approver_ref: str | None = None
    resume_handle: str | None = None
    risk: Risk | None = Risk.LOW
    policy: str | None = None
    overrides: ThresholdOverrides = ThresholdOverrides()

    @property
    def needs_acknowledgement(self) -> bool:
        return self.risk is not Risk.LOW


class DeliveryFact(_TimedModel):
    at: FactTime
    outcome: DeliveryOutcome


class DecisionFact(_TimedModel):
    at: FactTime
    code: DecisionCode
    #: The digest the approver decided on, when the decision event carries it.
    action_digest: str | None = None


class DigestFact(_TimedModel):
    at: FactTime
    digest: str


def _fact_key(fact: DeliveryFact | DecisionFact | DigestFact) -> tuple[Any, ...]:
    return (*_sort_key(fact.at), fact.model_dump_json())


class ApprovalFacts(_TimedModel):
    """Everything known about one approval request, plus its execution's digest changes and
    heartbeats (those are per execution; ``ApprovalBook`` shares them between requests).

    ``request`` is None while only facts that arrived before their request are held. Every
    collection is kept sorted and de-duplicated, so equal facts give equal values whatever the
    order they were added in, and a redelivered event changes nothing.
    """

    request_id: str
    execution_id: str | None = None
    request: RequestPart | None = None
    deliveries: tuple[DeliveryFact, ...] = ()
    acknowledgements: tuple[FactTime, ...] = ()
    decisions: tuple[DecisionFact, ...] = ()
    receipts: tuple[FactTime, ...] = ()
    digests: tuple[DigestFact, ...] = ()
    heartbeats: tuple[FactTime, ...] = ()

    @field_validator("deliveries", "decisions", "digests")
    @classmethod
    def _canonical_facts(cls, value: tuple[Any, ...]) -> tuple[Any, ...]:
        return _canonical(value, _fact_key)

    @field_validator("acknowledgements", "receipts", "heartbeats")
    @classmethod
    def _canonical_times(cls, value: tuple[datetime | None, ...]) -> tuple[datetime | None, ...]:
        return _canonical((_utc_ms(v) for v in value), _sort_key)


# --------------------------------------------------------------------------------------------
# Threshold resolution
# --------------------------------------------------------------------------------------------


def request_overrides(
    grace_seconds: float | None,
    heartbeat_fresh_seconds: float | None,
    delivery_deadline_seconds: float | None,
) -> ThresholdOverrides:
    """Per-request thresholds as the events and snapshots carry them (seconds)."""

    def td(seconds: float | None) -> timedelta | None:
        return None if seconds is None else timedelta(seconds=seconds)

    return ThresholdOverrides(
        grace=td(grace_seconds),
        heartbeat_fresh=td(heartbeat_fresh_seconds),
        delivery_deadline=td(delivery_deadline_seconds),
    )


def resolve_thresholds(
    request: ApprovalFacts | RequestPart | None,
    policies: Mapping[str, ThresholdOverrides | ThresholdSet] | None = None,
    defaults: ThresholdSet | None = None,
) -> ThresholdSet:
    """Per threshold: the request's own value, else its action policy's, else the default.

    The policy is looked up by the request's ``policy`` name, else by its ``action`` name (a
    low-risk preview may resume in seconds; a production change may wait on purpose). Each of
    the three thresholds is resolved on its own, so a policy may set only the grace period.
    """
    part = request.request if isinstance(request, ApprovalFacts) else request
    if part is None:
        return defaults or ThresholdSet()
    return _resolve(part.policy, part.action, part.overrides, policies, defaults)


def _resolve(
    policy_name: str | None,
    action: str | None,
    overrides: ThresholdOverrides,
    policies: Mapping[str, ThresholdOverrides | ThresholdSet] | None,
    defaults: ThresholdSet | None,
) -> ThresholdSet:
    """``resolve_thresholds`` for a request with this policy name, action and overrides: all
    that the answer depends on."""
    defaults = defaults or ThresholdSet()
    policy: ThresholdOverrides | ThresholdSet | None = None
    for name in (policy_name, action):
        if name is not None and policies and name in policies:
            policy = policies[name]
            break

    def pick(field: str) -> timedelta:
        for source in (overrides, policy):
            value = getattr(source, field, None) if source is not None else None
            if value is not None:
                return value  # type: ignore[no-any-return]
        return getattr(defaults, field)  # type: ignore[no-any-return]

    return ThresholdSet(
        grace=pick("grace"),
        heartbeat_fresh=pick("heartbeat_fresh"),
        delivery_deadline=pick("delivery_deadline"),
    )


def threshold_resolver(
    policies: Mapping[str, ThresholdOverrides | ThresholdSet] | None = None,
    defaults: ThresholdSet | None = None,
) -> Callable[[ApprovalFacts], ThresholdSet]:
    """``resolve_thresholds`` with the configuration bound: the ``thresholds_for`` of advance.

    The answer depends only on the request's policy, action and own overrides, so it is
    remembered by those: ``advance`` and ``next_change`` ask for every open request each time
    stream time moves. ``policies`` and ``defaults`` must not change afterwards."""

    fallback = defaults or ThresholdSet()

    @lru_cache(maxsize=1024)
    def resolve_for(
        policy_name: str | None, action: str | None, overrides: ThresholdOverrides
    ) -> ThresholdSet:
        return _resolve(policy_name, action, overrides, policies, defaults)

    def resolve(facts: ApprovalFacts) -> ThresholdSet:
        part = facts.request
        if part is None:
            return fallback
        return resolve_for(part.policy, part.action, part.overrides)

    return resolve


# --------------------------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------------------------


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
    """The verdict at ``at``, by the specification's precedence, counting only facts up to ``at``.

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
            "verdict_id": deterministic_id(
                "verdict", evaluation.request_id, evaluation.verdict, evaluation.evaluated_at
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


# --------------------------------------------------------------------------------------------
# The per-execution book the stream keeps
# --------------------------------------------------------------------------------------------


class LastVerdict(_TimedModel):
    """The verdict last published for a request and the change point it was stamped with."""

    verdict: ApprovalVerdictCode
    since: AwareDatetime


class ApprovalBook(_TimedModel):
    """All approval facts of one execution, as one table value (JSON-storable).

    ``requests`` holds per request its own facts (its ``digests``/``heartbeats`` stay empty:
    those are the execution's and live here once, shared by all its requests). A request
    whose ``request`` is None holds facts that came before it. ``dirty`` lists the requests
    whose facts changed since the last ``advance``; ``evaluated_until`` is the stream time
    every change point up to which has been evaluated.
    """

    execution_id: str | None = None
    requests: dict[str, ApprovalFacts] = {}
    digests: tuple[DigestFact, ...] = ()
    heartbeats: tuple[AwareDatetime, ...] = ()
    last_verdicts: dict[str, LastVerdict] = {}
    evaluated_until: AwareDatetime | None = None
    dirty: tuple[str, ...] = ()

    @field_validator("digests")
    @classmethod
    def _canonical_digests(cls, value: tuple[DigestFact, ...]) -> tuple[DigestFact, ...]:
        return _canonical(value, _fact_key)

    @field_validator("heartbeats")
    @classmethod
    def _canonical_heartbeats(cls, value: tuple[datetime, ...]) -> tuple[datetime, ...]:
        return tuple(sorted(set(value)))

    @field_validator("dirty")
    @classmethod
    def _canonical_dirty(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(sorted(set(value)))


ApprovalEvent = (
    ApprovalRequested
    | ApprovalDelivery
    | ApproverAcknowledgement
    | ApprovalDecision
    | ResumeReceipt
    | CurrentActionDigest
    | RequesterHeartbeat
)


def request_part(event: ApprovalRequested) -> RequestPart:
    """The minimum kept of a request event."""
    return RequestPart(
        action=event.action,
        action_digest=event.action_digest,
        requested_at=event.occurred_at,
        expires_at=event.expires_at,
        approver_ref=event.approver_ref,
        resume_handle=event.resume_handle,
        risk=event.risk,
        policy=event.policy,
        overrides=request_overrides(
            event.grace_seconds, event.heartbeat_fresh_seconds, event.delivery_deadline_seconds
        ),
    )


def _merge_request(old: RequestPart | None, new: RequestPart) -> RequestPart:
    """A request id names one request. Should two different request events share it, the
    earliest (then the smaller by content) is kept, so the outcome does not depend on order."""
    if old is None:
        return new
    return min(old, new, key=lambda r: (*_sort_key(r.requested_at), r.model_dump_json()))


def add_fact(book: ApprovalBook, event: ApprovalEvent) -> ApprovalBook:
    """The book with one more fact. Idempotent: a redelivered event gives an equal book.

    Facts for a request not seen yet are held under its id until the request arrives.
    Raises ValueError for an event of another execution (the shell keys books by execution).
    """
    if book.execution_id is not None and event.execution_id != book.execution_id:
        raise ValueError(
            f"event of execution {event.execution_id} added to the book of {book.execution_id}"
        )
    execution_id = event.execution_id
    if isinstance(event, CurrentActionDigest | RequesterHeartbeat):
        update: dict[str, Any] = {"execution_id": execution_id}
        if isinstance(event, CurrentActionDigest):
            fact = DigestFact(at=event.occurred_at, digest=event.action_digest)
            if fact in book.digests:
                return book
            update["digests"] = ApprovalBook._canonical_digests((*book.digests, fact))
        else:
            at = to_millis(event.occurred_at)
            # a heartbeat no newer than one already judged with can never be the latest again
            if book.heartbeats and at <= book.heartbeats[0] <= (book.evaluated_until or at):
                return book
            if at in book.heartbeats:
                return book
            update["heartbeats"] = tuple(sorted({*book.heartbeats, at}))
        update["dirty"] = tuple(sorted({*book.dirty, *book.requests}))
        return replace(book, **update)

    rid = event.request_id
    facts = book.requests.get(rid) or ApprovalFacts(request_id=rid, execution_id=execution_id)
    # Only the field the fact goes to changes, put in canonical form by its own validator:
    # the rest of ``facts`` is valid already, so it is not validated again.
    data = dict(facts.__dict__)
    if isinstance(event, ApprovalRequested):
        merged = _merge_request(facts.request, request_part(event))
        data["request"] = merged
    elif isinstance(event, ApprovalDelivery):
        data["deliveries"] = ApprovalFacts._canonical_facts(
            (*facts.deliveries, DeliveryFact(at=event.occurred_at, outcome=event.outcome))
        )
    elif isinstance(event, ApproverAcknowledgement):
        data["acknowledgements"] = ApprovalFacts._canonical_times(
            (*facts.acknowledgements, event.occurred_at)
        )
    elif isinstance(event, ApprovalDecision):
        decision = DecisionFact(
            at=event.occurred_at, code=event.decision, action_digest=event.action_digest
        )
        data["decisions"] = ApprovalFacts._canonical_facts((*facts.decisions, decision))
    elif isinstance(event, ResumeReceipt):
        data["receipts"] = ApprovalFacts._canonical_times((*facts.receipts, event.occurred_at))
    else:  # pragma: no cover - the union above is exhaustive
        raise TypeError(f"not an approval fact: {type(event).__name__}")
    new_facts = construct(ApprovalFacts, data)
    if new_facts == facts and rid in book.requests:
        return book
    return replace(
        book,
        execution_id=execution_id,
        requests={**book.requests, rid: new_facts},
        dirty=tuple(sorted({*book.dirty, rid})),
    )


def facts_for(book: ApprovalBook, request_id: str) -> ApprovalFacts:
    """One request's facts joined with its execution's digests and heartbeats."""
    facts = book.requests[request_id]
    return replace(facts, digests=book.digests, heartbeats=book.heartbeats)


class JoinedFacts:
    """A request's joined facts, thresholds and change points, remembered for the shell's one
    step (``advance``, then ``next_change`` on the book that comes out of it).

    Why: both ask for every open request's change points, and between the two the book
    usually keeps the very same fact objects (``_prune`` most often returns it unchanged).
    They are remembered by the identity of what they were computed from, the request's own
    facts and the book's digests and heartbeats, all immutable: a hit is the same input, so
    the same answer; anything else is computed afresh. ``thresholds_for`` must be the same
    function for every call. The change points of a step are computed once instead of twice
    (BENCHMARKS.md, step 7)."""

    __slots__ = ("_known", "thresholds_for")

    def __init__(self, thresholds_for: Callable[[ApprovalFacts], ThresholdSet]) -> None:
        self.thresholds_for = thresholds_for
        self._known: dict[str, tuple[Any, ...]] = {}

    def of(
        self, book: ApprovalBook, request_id: str
    ) -> tuple[ApprovalFacts, ThresholdSet, tuple[datetime, ...]]:
        own = book.requests[request_id]
        digests, heartbeats = book.digests, book.heartbeats
        hit = self._known.get(request_id)
        if hit is not None and hit[0] is own and hit[1] is digests and hit[2] is heartbeats:
            return hit[3], hit[4], hit[5]
        facts = replace(own, digests=digests, heartbeats=heartbeats)
        thresholds = self.thresholds_for(facts)
        points = change_points(facts, thresholds)
        self._known[request_id] = (own, digests, heartbeats, facts, thresholds, points)
        return facts, thresholds, points


def advance(
    book: ApprovalBook,
    to: datetime,
    thresholds_for: Callable[[ApprovalFacts], ThresholdSet],
    joined: JoinedFacts | None = None,
) -> tuple[ApprovalBook, tuple[ApprovalVerdict, ...]]:
    """Bring every request's verdict up to stream time ``to``.

    Each request is evaluated at every change point in ``(evaluated_until, to]`` and, if its
    facts changed since the last call, at ``to`` itself. A record is emitted only when the
    verdict differs from the last one, stamped with the change point, so the output does not
    depend on how often or where in between the shell calls this: stepping through ``to`` in
    several calls emits the same records as one call. Records come sorted by
    (evaluated_at, request_id).

    Contract: call it with ``to`` only once every fact with a time ``<= to`` is in the book
    (the partition watermark; minus 1 ms if more events at exactly the watermark may follow).
    A fact older than ``evaluated_until`` is late: the past already published is not rewritten,
    its effect appears from the first instant evaluated after it was added. A ``to`` behind
    ``evaluated_until`` (stream time never goes back) is treated as ``evaluated_until``.

    ``joined`` (optional) remembers the change points computed here for the caller's
    ``next_change`` on the resulting book; it changes no answer.
    """
    to = to_millis(to)
    joined = joined or JoinedFacts(thresholds_for)
    start = book.evaluated_until
    if start is not None and to < start:
        to = start
    dirty = set(book.dirty)
    last = dict(book.last_verdicts)
    emitted: list[ApprovalVerdict] = []
    for rid in sorted(book.requests):
        req = book.requests[rid].request
        if req is None:
            continue
        previous = last.get(rid)
        if rid not in dirty and previous is not None and previous.verdict in _TIME_FINAL:
            continue
        # joined only for the requests evaluated
        facts, thresholds, all_points = joined.of(book, rid)
        points = {p for p in all_points if (start is None or p > start) and p <= to}
        if rid in dirty or previous is None:
            points.add(to)
        for point in sorted(points):
            if req.requested_at is not None and point < req.requested_at:
                continue
            evaluation = evaluate(facts, point, thresholds)
            if previous is None or previous.verdict is not evaluation.verdict:
                emitted.append(to_verdict(evaluation, previous.verdict if previous else None, req))
                previous = construct(
                    LastVerdict, {"verdict": evaluation.verdict, "since": to_millis(point)}
                )
                last[rid] = previous
    new_book = replace(book, last_verdicts=last, evaluated_until=to, dirty=())
    emitted.sort(key=lambda v: (v.evaluated_at, v.request_id))
    return _prune(new_book), tuple(emitted)


def _prune(book: ApprovalBook) -> ApprovalBook:
    """Drop execution facts that can no longer change any verdict once ``evaluated_until``
    has passed, so a long wait with a heartbeat every few seconds stays small.

    Every later evaluation is at or after ``evaluated_until`` (U). Heartbeats: it uses the
    latest heartbeat up to its instant, so only the latest one up to U and later ones matter.
    Digests: a request looks at the latest digest change in (its request time, B], B being its
    first decision's time if that is at or before U, else the evaluation time; so per request
    only the latest digests in (request time, min(B, U)] matter, plus every change after U.
    The price: a fact that arrives late (time before U, which the shell reports as late) is
    judged without the history dropped here.
    """
    until = book.evaluated_until
    if until is None or (not book.digests and len(book.heartbeats) <= 1):
        return book  # nothing that could be dropped (the common case: called on every advance)
    past = [t for t in book.heartbeats if t <= until]
    heartbeats = tuple(t for t in book.heartbeats if t > until or (past and t == past[-1]))
    keep_times: set[datetime] = set()
    for facts in book.requests.values():
        req = facts.request
        if req is None:
            continue
        decided = [
            d.at
            for d in facts.decisions
            if d.at is not None and d.at <= until and d.code is not DecisionCode.UNRECOGNIZED
        ]
        bound = min(decided, default=until)
        since = req.requested_at or _EARLIEST
        inside = [d.at for d in book.digests if d.at is not None and since < d.at <= bound]
        if inside:
            keep_times.add(max(inside))
    digests = tuple(d for d in book.digests if d.at is None or d.at > until or d.at in keep_times)
    if heartbeats == book.heartbeats and digests == book.digests:
        return book
    return replace(book, heartbeats=heartbeats, digests=digests)


def _held_times(facts: ApprovalFacts) -> list[datetime]:
    """Known times of a request's own facts (not its request, not execution facts)."""
    times = (
        *(d.at for d in facts.deliveries),
        *(d.at for d in facts.decisions),
        *facts.acknowledgements,
        *facts.receipts,
    )
    return [t for t in times if t is not None]


def _closed(book: ApprovalBook, request_id: str) -> bool:
    last = book.last_verdicts.get(request_id)
    return last is not None and last.verdict in CLOSED_VERDICTS


def open_request_ids(book: ApprovalBook) -> tuple[str, ...]:
    """Requests seen whose wait is not over (for ``ExecutionState.open_approval_ids``)."""
    return tuple(
        rid
        for rid in sorted(book.requests)
        if book.requests[rid].request is not None and not _closed(book, rid)
    )


def next_change(
    book: ApprovalBook,
    thresholds_for: Callable[[ApprovalFacts], ThresholdSet] | None = None,
    joined: JoinedFacts | None = None,
) -> datetime | None:
    """The earliest change point after ``evaluated_until`` of any request not yet closed:
    when stream time must reach for a verdict to (possibly) change. None if there is none.
    ``thresholds_for`` must be the one given to ``advance`` (default: the built-in defaults);
    ``joined``, the one given to it, if any (then its ``thresholds_for`` is the one used)."""
    joined = joined or JoinedFacts(thresholds_for or threshold_resolver())
    best: datetime | None = None
    for rid, own in book.requests.items():
        if own.request is None:
            continue
        last = book.last_verdicts.get(rid)
        if last is not None and last.verdict in _TIME_FINAL and rid not in book.dirty:
            continue
        # joined only for the requests that can still change
        _, _, points = joined.of(book, rid)
        for point in points:
            if book.evaluated_until is None or point > book.evaluated_until:
                if best is None or point < best:
                    best = point
                break
    return best


def purge_closed(book: ApprovalBook, before: datetime) -> ApprovalBook:
    """Drop requests closed (CLOSED_BY_DECLINE, CLOSED_BY_CANCEL, RESUMED) before ``before``,
    and facts held for a request that never came whose latest fact is before ``before``.

    The shell passes ``stream time - retention``. Stale, orphaned, unroutable and stuck
    requests stay: someone still has to act on them (they go with the execution's book).
    """
    keep: dict[str, ApprovalFacts] = {}
    for rid, facts in book.requests.items():
        last = book.last_verdicts.get(rid)
        if facts.request is not None:
            if last is not None and last.verdict in CLOSED_VERDICTS and last.since < before:
                continue
        else:
            times = _held_times(facts)
            if times and max(times) < before:
                continue
        keep[rid] = facts
    if len(keep) == len(book.requests):
        return book
    return _prune(
        replace(
            book,
            requests=keep,
            last_verdicts={r: v for r, v in book.last_verdicts.items() if r in keep},
            dirty=tuple(r for r in book.dirty if r in keep),
        )
    )


def take_orphans(
    book: ApprovalBook, before: datetime
) -> tuple[ApprovalBook, tuple[tuple[str, datetime], ...]]:
    """Facts held for a request that has not come by ``before`` (their latest fact is older):
    removed from the book and returned as ``(request_id, latest fact time)``, so the shell can
    report them as ORPHAN_FACT anomalies instead of keeping them, or dropping them, silently.
    """
    orphans: list[tuple[str, datetime]] = []
    for rid, facts in sorted(book.requests.items()):
        if facts.request is None:
            times = [t for t in _held_times(facts) if t is not None]
            if times and max(times) < before:
                orphans.append((rid, max(times)))
    if not orphans:
        return book, ()
    gone = {rid for rid, _ in orphans}
    kept = replace(
        book,
        requests={r: f for r, f in book.requests.items() if r not in gone},
        last_verdicts={r: v for r, v in book.last_verdicts.items() if r not in gone},
        dirty=tuple(r for r in book.dirty if r not in gone),
    )
    return _prune(kept), tuple(orphans)


def orphan_deadline(book: ApprovalBook, window: timedelta) -> datetime | None:
    """When the earliest held fact without its request becomes an orphan."""
    times = [
        max(t for t in _held_times(f) if t is not None) + window
        for f in book.requests.values()
        if f.request is None and any(t is not None for t in _held_times(f))
    ]
    return min(times, default=None)
