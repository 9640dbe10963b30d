"""The pure part of the recorder: what a call becomes, with no Kafka, no clock, no thread.

Everything an agent process tells vigil through ``streams.recorder`` is built here, as the
contract record the worker reads (``streams.contracts.models.events``), validated by the same
pydantic models the codec uses. What is decided here, and why:

- **Event ids are derived from the fact** (``deterministic_id`` over the fact's identity), so
  that sending the same fact twice (a retried call, an agent that records again after a
  restart) is the same event id, and the worker's duplicate checks make it one fact
  (docs/rules.md#applying-a-status-event, docs/rules.md#what-each-event-does; approval facts
  are kept as sets, docs/rules.md#approval-waits). Facts that happen once per subject
  (an operation attempt's kind, a request, its decision, its receipt) leave the time out of
  their identity; facts that may legitimately repeat with the same content (a heartbeat, a
  change of the current action's digest, which may come back to an earlier one) include it.
- **The execution's sequence is its event time in milliseconds**, or one more than the
  previous sequence when that is not higher (``next_sequence``). The worker orders status
  events by the producer's sequence and refuses a lower one as OUT_OF_ORDER, while a gap is
  accepted. A counter from 1 would make every status of a run resumed in another process
  (a durable resume after a restart) out of order; a time-based sequence continues above the
  earlier process's as long as the new one's clock is not behind it.
- **The action digest** (``action_digest``) is SHA-256 over a canonical JSON text of the
  action's name and material arguments: keys sorted, no insignificant whitespace, UTF-8,
  integers as integers, finite floats in Python's shortest round-trip form, tuples as lists.
  The same action with the same arguments gives the same digest in any process, whatever the
  order of the keys; anything that is not plain JSON data (a set, an object, NaN) is refused
  rather than guessed at, because two digests that differ for equal actions would make vigil
  report a STALE_REQUEST that is not (docs/rules.md#the-four-proofs, CURRENT_ACTION).
- **An illegal argument raises at the call** (``InvalidFact``, a ``ValueError``), naming the
  field: an unknown status, a decision outside accept/decline/cancel, an attempt below 1, a
  naive time. Symbolic values are read case-insensitively (``"running"``), and
  ``UNRECOGNIZED``, the readers' symbol for a value added later, is never accepted as input.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, TypeVar

from pydantic import ValidationError

from streams.contracts.models.base import Record
from streams.contracts.models.enums import (
    DecisionCode,
    DeliveryOutcome,
    EvidenceSource,
    ExecutionStatus,
    OperationEventKind,
    Risk,
)
from streams.contracts.models.events import (
    ApprovalDecision,
    ApprovalDelivery,
    ApprovalRequested,
    ApproverAcknowledgement,
    CurrentActionDigest,
    ExecutionStatusChanged,
    OperationEvent,
    RequesterHeartbeat,
    ResumeReceipt,
)
from streams.core.ids import deterministic_id

R = TypeVar("R", bound=Record)
E = TypeVar("E", bound=StrEnum)

#: the prefix of every digest this module computes: the samples and the worker compare
#: digests as opaque strings, and the prefix says how one was made
DIGEST_PREFIX = "sha256:"


class InvalidFact(ValueError):
    """A recorder call with an illegal argument. ``field`` names it (the first one, when
    several are wrong); the message names every one with what is allowed."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


# ---------------------------------------------------------------------------------------------
# Values


def symbol(enum: type[E], value: E | str, field: str) -> E:
    """``value`` as a symbol of ``enum``, read case-insensitively (``"running"``, ``"ACCEPT"``,
    ``ExecutionStatus.RUNNING``); ``InvalidFact`` naming ``field`` and the allowed values
    otherwise. UNRECOGNIZED is the readers' symbol for a value they do not know, never an
    input."""
    if isinstance(value, enum) and value != "UNRECOGNIZED":
        return value
    text = value.strip().upper() if isinstance(value, str) else None
    allowed = [m.value for m in enum if m.value != "UNRECOGNIZED"]
    if text in allowed:
        return enum(text)
    shown = ", ".join(a.lower() for a in allowed)
    raise InvalidFact(f"{field}: {value!r} is not one of {shown}", field)


def build(model: type[R], field_prefix: str = "", **values: Any) -> R:
    """``model`` validated from ``values``; ``InvalidFact`` naming each failing field
    (``attempt: Input should be greater than or equal to 1 (got 0)``)."""
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        parts = []
        first: str | None = None
        for error in exc.errors(include_url=False):
            where = field_prefix + (".".join(str(p) for p in error.get("loc", ())) or "record")
            first = first or where
            text = f"{where}: {error['msg']}"
            if "input" in error and error.get("type") != "missing":
                given = repr(error["input"])
                text += f" (got {given[:60] + '…' if len(given) > 60 else given})"
            parts.append(text)
        raise InvalidFact(f"{model.avro_name}: " + "; ".join(parts), first) from None


def aware(value: datetime, field: str) -> datetime:
    """An aware time, as the contract requires; a naive one is refused (its zone is a guess)."""
    if not isinstance(value, datetime):
        raise InvalidFact(f"{field}: a datetime is required (got {value!r})", field)
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidFact(f"{field}: a naive datetime has no time zone; give an aware one", field)
    return value


def due(value: datetime | timedelta | float | None, at: datetime, field: str) -> datetime | None:
    """A deadline given as a time, or as a delay after ``at`` (a ``timedelta`` or seconds)."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return aware(value, field)
    if isinstance(value, bool) or not isinstance(value, timedelta | int | float):
        raise InvalidFact(f"{field}: a datetime, a timedelta or seconds (got {value!r})", field)
    delay = value if isinstance(value, timedelta) else timedelta(seconds=value)
    if delay < timedelta(0):
        raise InvalidFact(f"{field}: a delay must not be negative (got {value!r})", field)
    return at + delay


def seconds(value: timedelta | float | None, field: str) -> int | None:
    """A threshold of a request in whole seconds (the contract's unit)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, timedelta | int | float):
        raise InvalidFact(f"{field}: a timedelta or seconds (got {value!r})", field)
    total = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if total < 0 or not math.isfinite(total):
        raise InvalidFact(f"{field}: must be zero or more seconds (got {value!r})", field)
    return int(total)


# ---------------------------------------------------------------------------------------------
# The action digest


def canonical_json(value: Any) -> str:
    """The canonical JSON text of plain data (see the module's docstring): equal data, equal
    text. ``InvalidFact`` for anything else."""
    return json.dumps(
        _plain(value, "arguments"),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )


def _plain(value: Any, where: str) -> Any:
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return int(value)  # an IntEnum or a bool subclass is written as its number
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidFact(f"{where}: {value!r} has no JSON form", "arguments")
        return int(value) if value.is_integer() else value
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise InvalidFact(f"{where}: key {k!r} is not a string", "arguments")
            out[k] = _plain(v, f"{where}.{k}")
        return out
    if isinstance(value, list | tuple):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise InvalidFact(
        f"{where}: {type(value).__name__} is not plain JSON data (str, number, bool, None, "
        "list, dict); pass the arguments that make the action what it is",
        "arguments",
    )


def action_digest(action: str, arguments: Mapping[str, Any] | None = None) -> str:
    """``sha256:<64 hex>`` over ``{"action": action, "arguments": arguments}`` in canonical
    JSON. ``arguments`` are the action's *material* arguments: those that change what the
    action does (the amount and the account of a refund), not a request id or a timestamp
    that differ on every attempt of the same action."""
    if not isinstance(action, str) or not action:
        raise InvalidFact(f"action: a non-empty string is required (got {action!r})", "action")
    text = canonical_json({"action": action, "arguments": dict(arguments or {})})
    return DIGEST_PREFIX + hashlib.sha256(text.encode()).hexdigest()


# ---------------------------------------------------------------------------------------------
# Sequence and ids


def millis(at: datetime) -> int:
    return int(at.timestamp() * 1000)


def next_sequence(previous: int | None, at: datetime) -> int:
    """The sequence of a status change at ``at`` after ``previous`` (None: the first this
    process records): the event time in milliseconds, or ``previous + 1`` when that is not
    higher, so the sequence strictly increases."""
    candidate = millis(at)
    return candidate if previous is None or candidate > previous else previous + 1


def status_id(execution_id: str, sequence: int, status: ExecutionStatus) -> str:
    return deterministic_id("st", execution_id, sequence, status.value)


def operation_event_id(
    execution_id: str, operation_id: str, attempt: int, kind: OperationEventKind
) -> str:
    """One per (operation, attempt, kind): the worker applies a kind once per attempt."""
    return deterministic_id("op", execution_id, operation_id, attempt, kind.value)


def approval_event_id(kind: str, execution_id: str, request_id: str, *parts: object) -> str:
    return deterministic_id(f"ap{kind}", execution_id, request_id, *parts)


def signal_event_id(kind: str, execution_id: str, *parts: object) -> str:
    return deterministic_id(f"sg{kind}", execution_id, *parts)


# ---------------------------------------------------------------------------------------------
# The records


def status_changed(
    execution_id: str,
    status: ExecutionStatus | str,
    at: datetime,
    sequence: int,
    *,
    agent_id: str | None = None,
    reason: str | None = None,
    traceparent: str | None = None,
) -> ExecutionStatusChanged:
    code = symbol(ExecutionStatus, status, "status")
    return build(
        ExecutionStatusChanged,
        event_id=status_id(execution_id, sequence, code),
        execution_id=execution_id,
        sequence=sequence,
        status=code,
        occurred_at=aware(at, "at"),
        agent_id=agent_id,
        reason=reason,
        traceparent=traceparent,
    )


def operation_event(
    execution_id: str,
    operation_id: str,
    attempt: int,
    kind: OperationEventKind | str,
    at: datetime,
    *,
    connector: str,
    idempotency_key: str | None = None,
    reply_due_at: datetime | None = None,
    verify_due_at: datetime | None = None,
    effect_ref: str | None = None,
    source: EvidenceSource | str = EvidenceSource.RUNTIME,
    detail: str | None = None,
    traceparent: str | None = None,
) -> OperationEvent:
    code = symbol(OperationEventKind, kind, "kind")
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        raise InvalidFact(f"attempt: must be an integer of 1 or more (got {attempt!r})", "attempt")
    return build(
        OperationEvent,
        event_id=operation_event_id(execution_id, operation_id, attempt, code),
        execution_id=execution_id,
        operation_id=operation_id,
        attempt=attempt,
        idempotency_key=idempotency_key,
        connector=connector,
        kind=code,
        occurred_at=aware(at, "at"),
        reply_due_at=reply_due_at,
        verify_due_at=verify_due_at,
        effect_ref=effect_ref,
        evidence_source=symbol(EvidenceSource, source, "source"),
        detail=detail,
        traceparent=traceparent,
    )


def approval_requested(
    execution_id: str,
    request_id: str,
    at: datetime,
    *,
    action: str,
    digest: str,
    approver_ref: str | None = None,
    resume_handle: str | None = None,
    risk: Risk | str = Risk.LOW,
    policy: str | None = None,
    expires_at: datetime | None = None,
    grace_seconds: int | None = None,
    heartbeat_fresh_seconds: int | None = None,
    delivery_deadline_seconds: int | None = None,
    traceparent: str | None = None,
) -> ApprovalRequested:
    return build(
        ApprovalRequested,
        event_id=approval_event_id("req", execution_id, request_id),
        execution_id=execution_id,
        request_id=request_id,
        action=action,
        action_digest=digest,
        occurred_at=aware(at, "at"),
        expires_at=None if expires_at is None else aware(expires_at, "expires_at"),
        approver_ref=approver_ref,
        resume_handle=resume_handle,
        risk=symbol(Risk, risk, "risk"),
        policy=policy,
        grace_seconds=grace_seconds,
        heartbeat_fresh_seconds=heartbeat_fresh_seconds,
        delivery_deadline_seconds=delivery_deadline_seconds,
        traceparent=traceparent,
    )


def approval_delivery(
    execution_id: str,
    request_id: str,
    outcome: DeliveryOutcome | str,
    at: datetime,
    *,
    route_ref: str | None = None,
    traceparent: str | None = None,
) -> ApprovalDelivery:
    code = symbol(DeliveryOutcome, outcome, "outcome")
    return build(
        ApprovalDelivery,
        event_id=approval_event_id("dlv", execution_id, request_id, code.value, route_ref),
        execution_id=execution_id,
        request_id=request_id,
        occurred_at=aware(at, "at"),
        outcome=code,
        route_ref=route_ref,
        traceparent=traceparent,
    )


def approver_acknowledgement(
    execution_id: str,
    request_id: str,
    at: datetime,
    *,
    approver_ref: str | None = None,
    traceparent: str | None = None,
) -> ApproverAcknowledgement:
    return build(
        ApproverAcknowledgement,
        event_id=approval_event_id("ack", execution_id, request_id, approver_ref),
        execution_id=execution_id,
        request_id=request_id,
        occurred_at=aware(at, "at"),
        approver_ref=approver_ref,
        traceparent=traceparent,
    )


def approval_decision(
    execution_id: str,
    request_id: str,
    decision: DecisionCode | str,
    at: datetime,
    *,
    digest: str | None = None,
    traceparent: str | None = None,
) -> ApprovalDecision:
    code = symbol(DecisionCode, decision, "decision")
    return build(
        ApprovalDecision,
        event_id=approval_event_id("dec", execution_id, request_id, code.value, digest),
        execution_id=execution_id,
        request_id=request_id,
        occurred_at=aware(at, "at"),
        decision=code,
        action_digest=digest,
        traceparent=traceparent,
    )


def resume_receipt(
    execution_id: str,
    request_id: str,
    at: datetime,
    *,
    next_status: ExecutionStatus | str | None = None,
    traceparent: str | None = None,
) -> ResumeReceipt:
    status = None if next_status is None else symbol(ExecutionStatus, next_status, "next_status")
    return build(
        ResumeReceipt,
        event_id=approval_event_id("rcp", execution_id, request_id),
        execution_id=execution_id,
        request_id=request_id,
        occurred_at=aware(at, "at"),
        next_status=None if status is None else status.value,
        traceparent=traceparent,
    )


def requester_heartbeat(
    execution_id: str,
    at: datetime,
    *,
    resume_handle: str | None = None,
    traceparent: str | None = None,
) -> RequesterHeartbeat:
    at = aware(at, "at")
    return build(
        RequesterHeartbeat,
        event_id=signal_event_id("hb", execution_id, millis(at), resume_handle),
        execution_id=execution_id,
        occurred_at=at,
        resume_handle=resume_handle,
        traceparent=traceparent,
    )


def current_action_digest(
    execution_id: str, digest: str, at: datetime, *, traceparent: str | None = None
) -> CurrentActionDigest:
    at = aware(at, "at")
    return build(
        CurrentActionDigest,
        event_id=signal_event_id("dg", execution_id, digest, millis(at)),
        execution_id=execution_id,
        occurred_at=at,
        action_digest=digest,
        traceparent=traceparent,
    )
