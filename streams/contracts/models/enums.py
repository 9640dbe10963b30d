"""Closed vocabularies shared by the contracts.

Every Avro enum carries a default symbol ``UNRECOGNIZED`` so that the vocabulary can grow
without breaking older readers; the Python enums mirror that symbol too.

These classes are the one source of the enums in ``schemas/``: each ``.avsc`` that uses one
holds a copy generated from the class (its symbols in order, its docstring as the doc), which
``vigil schemas enums`` rewrites after a change here (``streams.contracts.enum_copies``).
"""

from __future__ import annotations

from enum import StrEnum


class ExecutionStatus(StrEnum):
    """Where the agent's own work stands. UNRECOGNIZED is what an older
    reader sees for a symbol added later.
    """

    CREATED = "CREATED"
    VALIDATING = "VALIDATING"
    RESOLVING_CONTEXT = "RESOLVING_CONTEXT"
    PLANNING = "PLANNING"
    RUNNING = "RUNNING"
    WAITING_FOR_TOOL = "WAITING_FOR_TOOL"
    WAITING_FOR_APPROVAL = "WAITING_FOR_APPROVAL"
    VALIDATING_OUTPUT = "VALIDATING_OUTPUT"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    EXPIRED = "EXPIRED"
    UNRECOGNIZED = "UNRECOGNIZED"


class OperationEventKind(StrEnum):
    """What a producer observed about one attempt of an operation. UNKNOWN is never an input: only
    vigil derives it.
    """

    PREPARED = "PREPARED"
    SENT = "SENT"
    ACKNOWLEDGED = "ACKNOWLEDGED"
    VERIFIED = "VERIFIED"
    FAILED = "FAILED"
    MANUAL_REVIEW = "MANUAL_REVIEW"
    RECONCILING = "RECONCILING"
    CANCELLED = "CANCELLED"
    UNRECOGNIZED = "UNRECOGNIZED"


class EvidenceSource(StrEnum):
    """Who reported the fact: the agent runtime, the connector (transport), the reconciler (a read
    of the source of truth) or a human reviewer.
    """

    RUNTIME = "RUNTIME"
    CONNECTOR = "CONNECTOR"
    RECONCILER = "RECONCILER"
    HUMAN = "HUMAN"
    UNRECOGNIZED = "UNRECOGNIZED"


class Risk(StrEnum):
    """Risk class of the action from its policy; HIGH needs the approver's acknowledgement for a
    verified route.
    """

    LOW = "LOW"
    HIGH = "HIGH"
    UNRECOGNIZED = "UNRECOGNIZED"


class DeliveryOutcome(StrEnum):
    """Transport outcome of delivering the approval request to its route."""

    DELIVERED = "DELIVERED"
    FAILED = "FAILED"
    UNRECOGNIZED = "UNRECOGNIZED"


class DecisionCode(StrEnum):
    """Decision vocabulary of the MCP elicitation specification. A timeout is never a decline."""

    ACCEPT = "ACCEPT"
    DECLINE = "DECLINE"
    CANCEL = "CANCEL"
    UNRECOGNIZED = "UNRECOGNIZED"


class OperationStatus(StrEnum):
    """Did an effect happen in the outside world."""

    PREPARED = "PREPARED"
    SENT = "SENT"
    ACKNOWLEDGED = "ACKNOWLEDGED"
    VERIFIED = "VERIFIED"
    UNKNOWN = "UNKNOWN"
    FAILED = "FAILED"
    MANUAL_REVIEW = "MANUAL_REVIEW"
    RECONCILING = "RECONCILING"
    CANCELLED = "CANCELLED"
    UNRECOGNIZED = "UNRECOGNIZED"


class RetryVerdict(StrEnum):
    """May the agent retry the operation, by the operation's status: PREPARED=NOTHING_SENT,
    SENT/ACKNOWLEDGED/RECONCILING=WAIT, VERIFIED=NOT_NEEDED, UNKNOWN=FORBIDDEN,
    FAILED/CANCELLED=SAFE, MANUAL_REVIEW=OWNER_DECIDES.
    """

    NOTHING_SENT = "NOTHING_SENT"
    WAIT = "WAIT"
    NOT_NEEDED = "NOT_NEEDED"
    FORBIDDEN = "FORBIDDEN"
    SAFE = "SAFE"
    OWNER_DECIDES = "OWNER_DECIDES"
    UNRECOGNIZED = "UNRECOGNIZED"


class WorkItemKind(StrEnum):
    """Why reconciliation is needed: SENT with no reply by its deadline, or ACKNOWLEDGED with no
    verification by its deadline.
    """

    REPLY_TIMEOUT = "REPLY_TIMEOUT"
    VERIFICATION_TIMEOUT = "VERIFICATION_TIMEOUT"
    UNRECOGNIZED = "UNRECOGNIZED"


class ApprovalVerdictCode(StrEnum):
    """Verdict on an approval wait."""

    WAITING = "WAITING"
    STALE_REQUEST = "STALE_REQUEST"
    UNROUTABLE_WAIT = "UNROUTABLE_WAIT"
    ORPHANED_WAIT = "ORPHANED_WAIT"
    STUCK_AFTER_DECISION = "STUCK_AFTER_DECISION"
    CLOSED_BY_DECLINE = "CLOSED_BY_DECLINE"
    CLOSED_BY_CANCEL = "CLOSED_BY_CANCEL"
    RESUMING = "RESUMING"
    RESUMED = "RESUMED"
    UNCERTAIN = "UNCERTAIN"
    UNRECOGNIZED = "UNRECOGNIZED"


class Proof(StrEnum):
    """The four proofs of a valid approval wait."""

    CURRENT_ACTION = "CURRENT_ACTION"
    VERIFIED_ROUTE = "VERIFIED_ROUTE"
    LIVE_RESUME = "LIVE_RESUME"
    CONSUMED_DECISION = "CONSUMED_DECISION"
    UNRECOGNIZED = "UNRECOGNIZED"


class ProofState(StrEnum):
    """FAILED: the proof is refuted. UNKNOWN: neither confirmed nor refuted yet."""

    FAILED = "FAILED"
    UNKNOWN = "UNKNOWN"
    UNRECOGNIZED = "UNRECOGNIZED"


class Owner(StrEnum):
    """Who owns the next step."""

    APPROVER = "APPROVER"
    REQUESTER = "REQUESTER"
    POLICY_OWNER = "POLICY_OWNER"
    RUNTIME_OWNER = "RUNTIME_OWNER"
    CONNECTOR_OWNER = "CONNECTOR_OWNER"
    OPERATOR = "OPERATOR"
    UNRECOGNIZED = "UNRECOGNIZED"


class AlertKind(StrEnum):
    """What kind of actionable transition the alert reports."""

    APPROVAL_VERDICT = "APPROVAL_VERDICT"
    OPERATION_UNKNOWN = "OPERATION_UNKNOWN"
    VERIFICATION_OVERDUE = "VERIFICATION_OVERDUE"
    FORBIDDEN_RETRY = "FORBIDDEN_RETRY"
    ANOMALY = "ANOMALY"
    UNRECOGNIZED = "UNRECOGNIZED"


class AlertStatus(StrEnum):
    """FIRING opens an alert; RESOLVED closes the alert named by resolves_alert_id."""

    FIRING = "FIRING"
    RESOLVED = "RESOLVED"
    UNRECOGNIZED = "UNRECOGNIZED"


class Severity(StrEnum):
    """How urgently a human should look."""

    CRITICAL = "CRITICAL"
    WARNING = "WARNING"
    INFO = "INFO"
    UNRECOGNIZED = "UNRECOGNIZED"


class AnomalyKind(StrEnum):
    """Why an event was reported instead of applied."""

    ILLEGAL_TRANSITION = "ILLEGAL_TRANSITION"
    DUPLICATE = "DUPLICATE"
    OUT_OF_ORDER = "OUT_OF_ORDER"
    AFTER_TERMINAL = "AFTER_TERMINAL"
    UNRECOGNIZED_SYMBOL = "UNRECOGNIZED_SYMBOL"
    KEY_MISMATCH = "KEY_MISMATCH"
    MISSING_ID = "MISSING_ID"
    TIME_OUT_OF_RANGE = "TIME_OUT_OF_RANGE"
    ORPHAN_FACT = "ORPHAN_FACT"
    UNEXPECTED_EVENT = "UNEXPECTED_EVENT"
    VALUE_OUT_OF_RANGE = "VALUE_OUT_OF_RANGE"
    #: a text field longer than its bound (``streams.core.bounds.TEXT_BOUNDS``)
    VALUE_TOO_LARGE = "VALUE_TOO_LARGE"
    #: an approval request re-issued under its id with other content (docs/rules.md)
    CONFLICTING_REQUEST = "CONFLICTING_REQUEST"
    #: a second decision for a request that contradicts the first (docs/rules.md)
    CONFLICTING_DECISION = "CONFLICTING_DECISION"
    UNRECOGNIZED = "UNRECOGNIZED"


class CheckFinding(StrEnum):
    """What one reconciler check read at the source: VERIFIED (the effect exists), ABSENT (the
    source has no such effect), PENDING (the source has it, not yet settled), ERROR (no usable
    answer: unreachable, timed out, refused, malformed).
    """

    VERIFIED = "VERIFIED"
    ABSENT = "ABSENT"
    PENDING = "PENDING"
    ERROR = "ERROR"
    UNRECOGNIZED = "UNRECOGNIZED"


class ReconciliationState(StrEnum):
    """Where the reconciler stands on a work item: CHECKING (a next check is due), VERIFIED or
    FAILED (it published that fact), MANUAL_REVIEW (it gave up and handed the operation to a
    person), RESOLVED (settled by other evidence before it found an answer), UNCONFIGURED (no
    checker for its connector).
    """

    CHECKING = "CHECKING"
    VERIFIED = "VERIFIED"
    FAILED = "FAILED"
    MANUAL_REVIEW = "MANUAL_REVIEW"
    RESOLVED = "RESOLVED"
    UNCONFIGURED = "UNCONFIGURED"
    UNRECOGNIZED = "UNRECOGNIZED"
