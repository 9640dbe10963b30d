"""Output records: vigil's public contract towards downstream services and alerting."""

from __future__ import annotations

from streams.contracts.models.base import Millis, Record
from streams.contracts.models.enums import (
    AlertKind,
    AlertStatus,
    AnomalyKind,
    ApprovalVerdictCode,
    CheckFinding,
    EvidenceSource,
    ExecutionStatus,
    OperationStatus,
    Owner,
    Proof,
    ProofState,
    ReconciliationState,
    RetryVerdict,
    Severity,
    WorkItemKind,
)


class ExecutionState(Record):
    avro_name = "ExecutionState"
    time_field = "last_event_at"
    execution_id: str
    status: ExecutionStatus
    since: Millis
    first_seen_at: Millis
    last_event_at: Millis
    last_sequence: int
    open_operation_ids: tuple[str, ...] = ()
    open_approval_ids: tuple[str, ...] = ()
    terminal: bool
    state_id: str
    traceparent: str | None = None


class OperationState(Record):
    avro_name = "OperationState"
    time_field = "since"
    key_field = "operation_id"
    key_scoped = True
    operation_id: str
    execution_id: str
    attempt: int
    idempotency_key: str | None = None
    connector: str
    status: OperationStatus
    retry: RetryVerdict
    reason: str | None = None
    since: Millis
    reply_due_at: Millis | None = None
    verify_due_at: Millis | None = None
    effect_ref: str | None = None
    open_work_item_id: str | None = None
    state_id: str
    held_by_operation_id: str | None = None
    held_by_attempt: int | None = None
    held_by_status: OperationStatus | None = None
    held_by_execution_id: str | None = None
    traceparent: str | None = None


class ReconciliationWorkItem(Record):
    avro_name = "ReconciliationWorkItem"
    time_field = "created_at"
    key_field = "operation_id"
    key_scoped = True
    work_item_id: str
    operation_id: str
    execution_id: str
    attempt: int
    idempotency_key: str | None = None
    connector: str
    kind: WorkItemKind
    deadline: Millis
    created_at: Millis
    effect_ref: str | None = None
    traceparent: str | None = None


class WorkItemResolution(Record):
    avro_name = "WorkItemResolution"
    time_field = "resolved_at"
    key_field = "operation_id"
    key_scoped = True
    resolution_id: str
    work_item_id: str
    operation_id: str
    execution_id: str
    attempt: int
    outcome: OperationStatus
    evidence_source: EvidenceSource
    resolved_at: Millis
    evidence: tuple[str, ...] = ()
    traceparent: str | None = None


class CheckAttempt(Record):
    # Nested in ReconciliationCheck.avsc: no file, no topic of its own.
    avro_name = "CheckAttempt"
    time_field = None
    key_field = None
    number: int
    at: Millis
    finding: CheckFinding
    detail: str | None = None
    effect_ref: str | None = None
    latency_ms: int


class ReconciliationCheck(Record):
    """The reconciler's progress on one work item (``<p>.reconciliation-checks``, compacted by
    work item id, written to the partition the work item was read from)."""

    avro_name = "ReconciliationCheck"
    time_field = "updated_at"
    key_field = "work_item_id"
    check_id: str
    work_item_id: str
    operation_id: str
    execution_id: str
    attempt: int
    connector: str
    idempotency_key: str | None = None
    item_effect_ref: str | None = None
    work_item_kind: WorkItemKind
    deadline: Millis
    item_created_at: Millis
    state: ReconciliationState
    first_seen_at: Millis
    updated_at: Millis
    next_check_at: Millis | None = None
    checks: tuple[CheckAttempt, ...] = ()
    outcome_event_id: str | None = None
    effect_ref: str | None = None
    note: str | None = None
    traceparent: str | None = None


class ProofFinding(Record):
    # Nested in ApprovalVerdict.avsc: no file, no topic of its own.
    avro_name = "ProofFinding"
    time_field = None
    key_field = None
    proof: Proof
    state: ProofState
    reason: str


class Thresholds(Record):
    # Nested in ApprovalVerdict.avsc: no file, no topic of its own.
    avro_name = "Thresholds"
    time_field = "evaluated_at"
    key_field = None
    grace_ms: int
    heartbeat_fresh_ms: int
    delivery_deadline_ms: int
    evaluated_at: Millis


class ApprovalVerdict(Record):
    avro_name = "ApprovalVerdict"
    time_field = "evaluated_at"
    key_field = "request_id"
    key_scoped = True
    verdict_id: str
    request_id: str
    execution_id: str
    verdict: ApprovalVerdictCode
    previous_verdict: ApprovalVerdictCode | None = None
    failed_proofs: tuple[ProofFinding, ...] = ()
    owner: Owner
    next_step: str
    thresholds: Thresholds
    evaluated_at: Millis
    action: str | None = None
    requested_at: Millis | None = None
    traceparent: str | None = None


class Alert(Record):
    avro_name = "Alert"
    key_field = "subject_id"
    key_scoped = True
    alert_id: str
    kind: AlertKind
    status: AlertStatus
    severity: Severity
    execution_id: str
    subject_id: str
    verdict: str | None = None
    owner: Owner
    next_step: str
    evidence: tuple[str, ...] = ()
    occurred_at: Millis
    resolves_alert_id: str | None = None
    traceparent: str | None = None
    #: a RESOLVED alert naming this one ends it (docs/rules.md#alert-lifecycle); false on
    #: alerts written before FORBIDDEN_RETRY and ANOMALY alerts were ended
    ends_with_resolved: bool = False


class Anomaly(Record):
    avro_name = "Anomaly"
    time_field = "detected_at"
    anomaly_id: str
    kind: AnomalyKind
    reason: str
    execution_id: str | None = None
    event_id: str | None = None
    event_type: str | None = None
    source_topic: str
    source_partition: int
    source_offset: int
    occurred_at: Millis | None = None
    detected_at: Millis
    traceparent: str | None = None


class DeadLetter(Record):
    avro_name = "DeadLetter"
    time_field = "source_timestamp"
    key_field = None
    dead_letter_id: str
    source_topic: str
    source_partition: int
    source_offset: int
    source_timestamp: Millis | None = None
    reason: str
    original_key: bytes | None = None
    original_value: bytes | None = None
    original_size: int | None = None
    original_sha256: str | None = None
    traceparent: str | None = None


OUTPUT_MODELS: tuple[type[Record], ...] = (
    ExecutionState,
    OperationState,
    ReconciliationWorkItem,
    WorkItemResolution,
    ApprovalVerdict,
    Alert,
    Anomaly,
    DeadLetter,
)

#: records written by a vigil service other than the worker (``vigil reconcile``)
SERVICE_MODELS: tuple[type[Record], ...] = (ReconciliationCheck,)


class IdempotencyClaim(Record):
    """One status of one attempt carrying an idempotency key (``streams.core.claims``),
    keyed by ``claims_key(connector, idempotency_key)``."""

    avro_name = "IdempotencyClaim"
    key_field = None  # the emitter keys it by connector and key
    claim_id: str
    connector: str
    idempotency_key: str
    execution_id: str
    operation_id: str
    attempt: int
    status: OperationStatus
    occurred_at: Millis


class ClaimsProgress(Record):
    """Every claim of ``source_partition`` stamped before ``occurred_at`` is written; sent to
    every claims partition."""

    avro_name = "ClaimsProgress"
    key_field = None
    source_partition: int
    partitions: int
    occurred_at: Millis


class RetryLink(Record):
    """A blind retry across executions, told to one of its two executions
    (``streams.core.claims.Link``)."""

    avro_name = "RetryLink"
    link_id: str
    conflict_id: str
    kind: str
    role: str
    execution_id: str
    operation_id: str
    attempt: int
    other_execution_id: str
    other_operation_id: str
    other_attempt: int
    other_status: OperationStatus
    connector: str
    idempotency_key: str
    occurred_at: Millis


#: The records the workers write and read themselves (``Role.INTERNAL`` topics).
INTERNAL_MODELS: tuple[type[Record], ...] = (IdempotencyClaim, ClaimsProgress, RetryLink)
