"""The vocabulary of approval verdicts: who owns each verdict and what to do next, how
urgent it is, which verdicts close a wait, and the reason codes of the proofs' findings.
Stable strings: consumers of the verdict topic match on them."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

from streams.contracts.models.enums import (
    ApprovalVerdictCode,
    DecisionCode,
    Owner,
    Proof,
)

V = ApprovalVerdictCode

#: Sorts before every real time: the position of a fact whose time is unknown.
_EARLIEST = datetime.min.replace(tzinfo=UTC)

#: Owner and next safe step per verdict (docs/rules.md#verdicts). The first six are the
#: specification's table verbatim; the four the project adds are chosen as follows:
#: CLOSED_BY_CANCEL goes to the requester (it must not proceed, and only it can ask again);
#: RESUMING and RESUMED belong to the runtime owner, whose run holds the next step (nobody needs
#: to act); UNCERTAIN goes to the operator, because no party has failed yet — a proof is pending
#: inside its deadline.
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
