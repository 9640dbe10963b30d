"""Input events: what agent runtimes, connectors, the approval service and tickers write."""

from __future__ import annotations

from pydantic import Field

from streams.contracts.models.base import Millis, Record
from streams.contracts.models.enums import (
    DecisionCode,
    DeliveryOutcome,
    EvidenceSource,
    ExecutionStatus,
    OperationEventKind,
    Risk,
)

NonEmpty = Field(min_length=1)


class ExecutionStatusChanged(Record):
    avro_name = "ExecutionStatusChanged"
    event_id: str = NonEmpty
    execution_id: str = NonEmpty
    sequence: int
    status: ExecutionStatus
    occurred_at: Millis
    agent_id: str | None = None
    reason: str | None = None
    traceparent: str | None = None


class OperationEvent(Record):
    avro_name = "OperationEvent"
    event_id: str = NonEmpty
    execution_id: str = NonEmpty
    operation_id: str = NonEmpty
    attempt: int = Field(ge=1, le=2**31 - 1)
    idempotency_key: str | None = None
    connector: str
    kind: OperationEventKind
    occurred_at: Millis
    reply_due_at: Millis | None = None
    verify_due_at: Millis | None = None
    effect_ref: str | None = None
    evidence_source: EvidenceSource = EvidenceSource.RUNTIME
    detail: str | None = None
    traceparent: str | None = None


class ApprovalRequested(Record):
    avro_name = "ApprovalRequested"
    event_id: str = NonEmpty
    execution_id: str = NonEmpty
    request_id: str = NonEmpty
    action: str
    action_digest: str
    occurred_at: Millis
    expires_at: Millis | None = None
    approver_ref: str | None = None
    resume_handle: str | None = None
    risk: Risk = Risk.LOW
    policy: str | None = None
    grace_seconds: int | None = None
    heartbeat_fresh_seconds: int | None = None
    delivery_deadline_seconds: int | None = None
    traceparent: str | None = None


class ApprovalDelivery(Record):
    avro_name = "ApprovalDelivery"
    event_id: str = NonEmpty
    execution_id: str = NonEmpty
    request_id: str = NonEmpty
    occurred_at: Millis
    outcome: DeliveryOutcome
    route_ref: str | None = None
    traceparent: str | None = None


class ApproverAcknowledgement(Record):
    avro_name = "ApproverAcknowledgement"
    event_id: str = NonEmpty
    execution_id: str = NonEmpty
    request_id: str = NonEmpty
    occurred_at: Millis
    approver_ref: str | None = None
    traceparent: str | None = None


class ApprovalDecision(Record):
    avro_name = "ApprovalDecision"
    event_id: str = NonEmpty
    execution_id: str = NonEmpty
    request_id: str = NonEmpty
    occurred_at: Millis
    decision: DecisionCode
    action_digest: str | None = None
    traceparent: str | None = None


class CurrentActionDigest(Record):
    avro_name = "CurrentActionDigest"
    event_id: str = NonEmpty
    execution_id: str = NonEmpty
    occurred_at: Millis
    action_digest: str
    traceparent: str | None = None


class ResumeReceipt(Record):
    avro_name = "ResumeReceipt"
    event_id: str = NonEmpty
    execution_id: str = NonEmpty
    request_id: str = NonEmpty
    occurred_at: Millis
    next_status: str | None = None
    traceparent: str | None = None


class RequesterHeartbeat(Record):
    avro_name = "RequesterHeartbeat"
    event_id: str = NonEmpty
    execution_id: str = NonEmpty
    occurred_at: Millis
    resume_handle: str | None = None
    traceparent: str | None = None


class ClockTick(Record):
    """Not an event of any execution: wall-clock time written into the log as data."""

    avro_name = "ClockTick"
    key_field = None
    ticker_id: str
    partition: int
    occurred_at: Millis


#: Events that belong to an execution (everything but ticks).
ExecutionEvent = (
    ExecutionStatusChanged
    | OperationEvent
    | ApprovalRequested
    | ApprovalDelivery
    | ApproverAcknowledgement
    | ApprovalDecision
    | CurrentActionDigest
    | ResumeReceipt
    | RequesterHeartbeat
)

INPUT_MODELS: tuple[type[Record], ...] = (
    ExecutionStatusChanged,
    OperationEvent,
    ApprovalRequested,
    ApprovalDelivery,
    ApproverAcknowledgement,
    ApprovalDecision,
    CurrentActionDigest,
    ResumeReceipt,
    RequesterHeartbeat,
    ClockTick,
)
