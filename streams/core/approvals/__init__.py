"""Approval waits: the four proofs, the verdict and its precedence, and the book of one
execution's approval facts.

A pause for a human is valid only while four proofs hold (current action, verified route, live
resume, consumed decision). The package keeps, per approval request, the facts seen so far and
computes the verdict as a pure function ``evaluate(facts, at, thresholds)``, so arrival order
between topics cannot change an answer, and the live worker, a replay and the offline audit all
share this one function. Its modules, each resting on the ones before it:

- ``vocabulary``: verdict owners, next steps and severities, reason codes;
- ``thresholds``: the three deadlines and their overrides;
- ``facts``: what is known of one request, and the thresholds that apply to it;
- ``evaluation``: the proofs, the verdict, the instants where it can change;
- ``book``: one execution's facts and last verdicts as stored, and the steps on them: the
  readable form, and the reference the ledger is checked against;
- ``ledger``: the same book as the stream judges it (slotted records, integer epoch
  milliseconds, each request's thresholds and change points kept between calls).

Nothing here imports Kafka, Faust or asyncio, or reads a clock.
"""

from __future__ import annotations

from streams.core.approvals.book import (
    ApprovalBook,
    ApprovalEvent,
    LastVerdict,
    add_fact,
    advance,
    facts_for,
    next_change,
    open_request_ids,
    orphan_deadline,
    purge_closed,
    request_part,
    take_orphans,
)
from streams.core.approvals.evaluation import (
    REASON_SEPARATOR,
    Evaluation,
    change_points,
    evaluate,
    to_verdict,
)
from streams.core.approvals.facts import (
    ApprovalFacts,
    DecisionFact,
    DeliveryFact,
    DigestFact,
    FactTime,
    RequestPart,
    ThresholdResolver,
    resolve_thresholds,
    threshold_resolver,
)
from streams.core.approvals.ledger import Ledger, Request
from streams.core.approvals.thresholds import (
    ThresholdOverrides,
    ThresholdSet,
    request_overrides,
)
from streams.core.approvals.vocabulary import (
    ACK_MISSING,
    ACK_PENDING,
    ACTION_DIGEST_CHANGED,
    ACTION_DIGEST_UNKNOWN,
    CLOSED_VERDICTS,
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
    VERDICT_SEVERITY,
)

__all__ = [
    "ACK_MISSING",
    "ACK_PENDING",
    "ACTION_DIGEST_CHANGED",
    "ACTION_DIGEST_UNKNOWN",
    "CLOSED_VERDICTS",
    "CONTRADICTING_DECISION",
    "DECIDED_AFTER_DIGEST_CHANGE",
    "DECIDED_AFTER_EXPIRY",
    "DECISION_FOR_OTHER_DIGEST",
    "DECISION_UNRECOGNIZED",
    "DELIVERY_FAILED",
    "DELIVERY_PENDING",
    "DELIVERY_UNCONFIRMED",
    "DIGEST_CHANGED_AT_UNKNOWN_TIME",
    "HEARTBEAT_NEVER_SEEN",
    "HEARTBEAT_NOT_YET_SEEN",
    "HEARTBEAT_STALE",
    "NO_APPROVER",
    "NO_RESUME_HANDLE",
    "NO_RESUME_RECEIPT",
    "REASON_SEPARATOR",
    "REQUEST_EXPIRED",
    "RESUME_RECEIPT_PENDING",
    "VERDICT_GUIDANCE",
    "VERDICT_SEVERITY",
    "ApprovalBook",
    "ApprovalEvent",
    "ApprovalFacts",
    "DecisionFact",
    "DeliveryFact",
    "DigestFact",
    "Evaluation",
    "FactTime",
    "LastVerdict",
    "Ledger",
    "Request",
    "RequestPart",
    "ThresholdOverrides",
    "ThresholdResolver",
    "ThresholdSet",
    "add_fact",
    "advance",
    "change_points",
    "evaluate",
    "facts_for",
    "next_change",
    "open_request_ids",
    "orphan_deadline",
    "purge_closed",
    "request_overrides",
    "request_part",
    "resolve_thresholds",
    "take_orphans",
    "threshold_resolver",
    "to_verdict",
]
