"""Scenarios: sequences of input events and clock ticks, played in event-time order.

The bundled scenario (``vigil demo``) and the tests are built from here. A snapshot line of the
offline audit is turned into the events that would have produced it, so the same six reference
requests can be judged offline and through a running worker, and must agree.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from streams.audit import SnapshotLine
from streams.contracts.models import events as ev
from streams.contracts.models.base import Record
from streams.contracts.models.enums import (
    DecisionCode,
    DeliveryOutcome,
    EvidenceSource,
    ExecutionStatus,
    OperationEventKind,
    Risk,
)

SAMPLES = Path(__file__).resolve().parents[1] / "samples"
REFERENCE_AUDIT = SAMPLES / "reference-audit.jsonl"
REFERENCE_AT = datetime(2026, 7, 26, 16, 30, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Tick:
    """Advance every partition of every input topic to ``at``."""

    at: datetime


Step = Record | Tick


def _time(step: Step) -> datetime:
    return step.at if isinstance(step, Tick) else step.occurred_at  # type: ignore[attr-defined]


def snapshot_events(line: SnapshotLine) -> list[Record]:
    """The input events that make an approval snapshot line true."""
    assert line.requested_at is not None and line.execution_id is not None
    ex, rid, t0 = line.execution_id, line.request_id, line.requested_at
    out: list[Record] = [
        ev.ApprovalRequested(
            event_id=f"{rid}-requested",
            execution_id=ex,
            request_id=rid,
            action=line.action or "action",
            action_digest=line.action_digest or "",
            occurred_at=t0,
            expires_at=line.expires_at,
            approver_ref=line.approver_ref,
            resume_handle=line.resume_handle,
            risk=Risk.HIGH if line.risk == "high" else Risk.LOW,
            grace_seconds=int(line.grace_seconds) if line.grace_seconds is not None else None,
        )
    ]
    if line.delivery in ("delivered", "failed"):
        out.append(
            ev.ApprovalDelivery(
                event_id=f"{rid}-delivery",
                execution_id=ex,
                request_id=rid,
                occurred_at=t0 + timedelta(seconds=5),
                outcome=DeliveryOutcome.DELIVERED
                if line.delivery == "delivered"
                else DeliveryOutcome.FAILED,
                route_ref=line.approver_ref,
            )
        )
    if line.acknowledged_at:
        out.append(
            ev.ApproverAcknowledgement(
                event_id=f"{rid}-ack",
                execution_id=ex,
                request_id=rid,
                occurred_at=line.acknowledged_at,
                approver_ref=line.approver_ref,
            )
        )
    if line.current_action_digest and line.current_action_digest != line.action_digest:
        out.append(
            ev.CurrentActionDigest(
                event_id=f"{rid}-digest",
                execution_id=ex,
                occurred_at=t0 + timedelta(seconds=10),
                action_digest=line.current_action_digest,
            )
        )
    if line.requester_heartbeat_at:
        out.append(
            ev.RequesterHeartbeat(
                event_id=f"{rid}-hb",
                execution_id=ex,
                occurred_at=line.requester_heartbeat_at,
                resume_handle=line.resume_handle,
            )
        )
    if line.decision and line.decided_at:
        out.append(
            ev.ApprovalDecision(
                event_id=f"{rid}-decision",
                execution_id=ex,
                request_id=rid,
                occurred_at=line.decided_at,
                decision=DecisionCode(line.decision.upper()),
                action_digest=line.action_digest,
            )
        )
    if line.resume_receipt_at:
        out.append(
            ev.ResumeReceipt(
                event_id=f"{rid}-receipt",
                execution_id=ex,
                request_id=rid,
                occurred_at=line.resume_receipt_at,
            )
        )
    return out


def reference_audit_lines(path: Path = REFERENCE_AUDIT) -> list[SnapshotLine]:
    return [SnapshotLine.model_validate_json(x) for x in path.read_text().splitlines() if x.strip()]


def reference_approval_events() -> list[Record]:
    return [e for line in reference_audit_lines() for e in snapshot_events(line)]


def _status(ex: str, seq: int, status: ExecutionStatus, at: datetime) -> Record:
    return ev.ExecutionStatusChanged(
        event_id=f"{ex}-s{seq}", execution_id=ex, sequence=seq, status=status, occurred_at=at
    )


def _op(
    ex: str,
    op: str,
    attempt: int,
    kind: OperationEventKind,
    at: datetime,
    source: EvidenceSource = EvidenceSource.RUNTIME,
    **kw: object,
) -> Record:
    return ev.OperationEvent(
        event_id=f"{op}-{attempt}-{kind.lower()}",
        execution_id=ex,
        operation_id=op,
        attempt=attempt,
        idempotency_key=f"idem-{op}",
        connector=str(kw.pop("connector", "sms")),
        kind=kind,
        occurred_at=at,
        evidence_source=source,
        **kw,  # type: ignore[arg-type]
    )


def demo_scenario(base: datetime = datetime(2026, 7, 26, 16, 0, tzinfo=UTC)) -> list[Step]:
    """The bundled scenario: the reference audit, a connector that times out and is later
    reconciled, a forbidden retry, and a normal execution to completion; with ticks."""
    S, K, m = ExecutionStatus, OperationEventKind, lambda x: base + timedelta(minutes=x)
    steps: list[Step] = list(reference_approval_events())
    # A normal execution from created to completed, with a verified operation.
    ok = "exec-invoice-run"
    for i, st in enumerate(
        [S.CREATED, S.VALIDATING, S.RESOLVING_CONTEXT, S.PLANNING, S.RUNNING, S.WAITING_FOR_TOOL], 1
    ):
        steps.append(_status(ok, i, st, m(i * 0.1)))
    steps += [
        _op(ok, "op-email-1", 1, K.SENT, m(0.7), connector="mail"),
        _op(
            ok, "op-email-1", 1, K.ACKNOWLEDGED, m(0.8), EvidenceSource.CONNECTOR, connector="mail"
        ),
        _op(
            ok,
            "op-email-1",
            1,
            K.VERIFIED,
            m(1.0),
            EvidenceSource.RECONCILER,
            connector="mail",
            effect_ref="msg-4711",
        ),
        _status(ok, 7, S.RUNNING, m(1.1)),
        _status(ok, 8, S.VALIDATING_OUTPUT, m(1.2)),
        _status(ok, 9, S.COMPLETED, m(1.3)),
    ]
    # An SMS whose connector never answers: UNKNOWN at its deadline, reconciled later.
    sms = "exec-sms-reminder"
    steps += [
        _status(sms, 1, S.RUNNING, m(2)),
        _status(sms, 2, S.WAITING_FOR_TOOL, m(2.1)),
        _op(sms, "op-sms-1", 1, K.SENT, m(2.2), reply_due_at=m(2.7)),
        _op(sms, "op-sms-1", 1, K.VERIFIED, m(12), EvidenceSource.RECONCILER, effect_ref="sms-99"),
    ]
    # A payment retried while the first attempt is still unanswered: forbidden.
    pay = "exec-refund"
    steps += [
        _status(pay, 1, S.RUNNING, m(3)),
        _op(pay, "op-refund-1", 1, K.SENT, m(3.1), connector="payments", reply_due_at=m(5)),
        _op(pay, "op-refund-1", 2, K.SENT, m(3.5), connector="payments", reply_due_at=m(5.5)),
    ]
    steps += [Tick(m(x)) for x in range(0, 31)]
    steps.append(Tick(REFERENCE_AT + timedelta(seconds=1)))
    return sorted(steps, key=lambda s: (_time(s), isinstance(s, Tick)))


def shifted(steps: Iterable[Step], delta: timedelta) -> list[Step]:
    """The same steps ``delta`` later: every time a record carries (event times, expiries,
    deadlines) and every tick moves, durations and ids do not. ``vigil demo`` plays the
    scenario so that it ends now, and then keeps the clock running with wall-clock ticks."""
    out: list[Step] = []
    for step in steps:
        if isinstance(step, Tick):
            out.append(Tick(step.at + delta))
            continue
        update = {
            name: value + delta
            for name, value in step.__dict__.items()
            if isinstance(value, datetime)
        }
        out.append(step.model_copy(update=update))
    return out
