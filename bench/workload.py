"""The benchmark's workload: a realistic mix of status, operation and approval events.

Every execution follows one of five shapes (weights in ``MIX``):

- ``tool``     (55 %): CREATED → … → WAITING_FOR_TOOL, an operation SENT / ACKNOWLEDGED /
  VERIFIED, RUNNING → VALIDATING_OUTPUT → COMPLETED (12 events);
- ``approval`` (20 %): … → WAITING_FOR_APPROVAL, ApprovalRequested, ApprovalDelivery,
  RequesterHeartbeat, ApproverAcknowledgement, ApprovalDecision(ACCEPT), ResumeReceipt,
  RUNNING → … → COMPLETED (15 events);
- ``lost_reply`` (10 %): an operation SENT with ``reply_due_at`` = SENT + ``deadline``, no
  reply: UNKNOWN at the deadline; the reconciler VERIFIES it later; COMPLETED (11 events);
- ``stuck`` (10 %): an approval ACCEPTed with ``grace_seconds`` = ``deadline`` and no resume
  receipt: STUCK_AFTER_DECISION at decision + grace; the execution stays in flight (11 events);
- ``failed`` (5 %): CREATED → … → RUNNING → FAILED (6 events).

Every event of one execution is ``step`` apart in event time; executions start at the times
the caller gives. ``inflight_only`` builds executions that stay in flight (RUNNING,
WAITING_FOR_TOOL and an operation SENT whose reply is due in an hour: 3 events) for the
memory section.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

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

S = ExecutionStatus
K = OperationEventKind
MIX = (("tool", 55), ("approval", 20), ("lost_reply", 10), ("stuck", 10), ("failed", 5))
_PREFIX = (S.CREATED, S.VALIDATING, S.RESOLVING_CONTEXT, S.PLANNING, S.RUNNING)


@dataclass(frozen=True, slots=True)
class Planned:
    """One input event with what the benchmark needs to know about it."""

    at_ms: int
    record: Record
    shape: str


def _shape_for(rng: random.Random) -> str:
    x = rng.randrange(100)
    for name, weight in MIX:
        if x < weight:
            return name
        x -= weight
    return MIX[-1][0]


def execution(
    ex: str, start: datetime, step: timedelta, shape: str, deadline: timedelta
) -> list[Record]:
    """The events of one execution of ``shape``, in event-time order."""
    out: list[Record] = []
    clock = [start]
    seq = [0]

    def now() -> datetime:
        t = clock[0]
        clock[0] = t + step
        return t

    def status(st: ExecutionStatus) -> None:
        seq[0] += 1
        out.append(
            ev.ExecutionStatusChanged(
                event_id=f"{ex}-s{seq[0]}",
                execution_id=ex,
                sequence=seq[0],
                status=st,
                occurred_at=now(),
                agent_id="agent-7",
            )
        )

    def op(kind: OperationEventKind, source: EvidenceSource, **kw: object) -> None:
        out.append(
            ev.OperationEvent(
                event_id=f"{ex}-op1-1-{kind.lower()}",
                execution_id=ex,
                operation_id=f"{ex}-op1",
                attempt=1,
                idempotency_key=f"idem-{ex}-op1",
                connector="payments" if shape == "lost_reply" else "mail",
                kind=kind,
                occurred_at=now(),
                evidence_source=source,
                **kw,  # type: ignore[arg-type]
            )
        )

    def approval(decide: bool, receipt: bool, grace: int | None) -> None:
        rid = f"{ex}-req1"
        common = dict(execution_id=ex, request_id=rid)
        out.append(
            ev.ApprovalRequested(
                event_id=f"{rid}-requested",
                action="refund",
                action_digest="d1",
                occurred_at=now(),
                approver_ref="approver-1",
                resume_handle=f"{ex}-resume",
                risk=Risk.HIGH,
                grace_seconds=grace,
                **common,  # type: ignore[arg-type]
            )
        )
        out.append(
            ev.ApprovalDelivery(
                event_id=f"{rid}-delivery",
                occurred_at=now(),
                outcome=DeliveryOutcome.DELIVERED,
                route_ref="approver-1",
                **common,  # type: ignore[arg-type]
            )
        )
        out.append(
            ev.RequesterHeartbeat(
                event_id=f"{rid}-hb",
                execution_id=ex,
                occurred_at=now(),
                resume_handle=f"{ex}-resume",
            )
        )
        out.append(
            ev.ApproverAcknowledgement(
                event_id=f"{rid}-ack",
                occurred_at=now(),
                approver_ref="approver-1",
                **common,  # type: ignore[arg-type]
            )
        )
        if decide:
            out.append(
                ev.ApprovalDecision(
                    event_id=f"{rid}-decision",
                    occurred_at=now(),
                    decision=DecisionCode.ACCEPT,
                    action_digest="d1",
                    **common,  # type: ignore[arg-type]
                )
            )
        if receipt:
            out.append(
                ev.ResumeReceipt(
                    event_id=f"{rid}-receipt",
                    occurred_at=now(),
                    next_status="RUNNING",
                    **common,  # type: ignore[arg-type]
                )
            )

    for st in (S.RUNNING,) if shape == "inflight" else _PREFIX:
        status(st)
    if shape == "tool":
        status(S.WAITING_FOR_TOOL)
        op(K.SENT, EvidenceSource.RUNTIME)
        op(K.ACKNOWLEDGED, EvidenceSource.CONNECTOR)
        op(K.VERIFIED, EvidenceSource.RECONCILER, effect_ref=f"{ex}-effect")
        status(S.RUNNING)
        status(S.VALIDATING_OUTPUT)
        status(S.COMPLETED)
    elif shape == "approval":
        status(S.WAITING_FOR_APPROVAL)
        approval(decide=True, receipt=True, grace=None)
        status(S.RUNNING)
        status(S.VALIDATING_OUTPUT)
        status(S.COMPLETED)
    elif shape == "lost_reply":
        status(S.WAITING_FOR_TOOL)
        sent = clock[0]
        op(K.SENT, EvidenceSource.RUNTIME, reply_due_at=sent + deadline)
        clock[0] = max(clock[0], sent + deadline + 2 * step)  # nothing until after the deadline
        op(K.VERIFIED, EvidenceSource.RECONCILER, effect_ref=f"{ex}-effect")
        status(S.RUNNING)
        status(S.VALIDATING_OUTPUT)
        status(S.COMPLETED)
    elif shape == "stuck":
        status(S.WAITING_FOR_APPROVAL)
        approval(decide=True, receipt=False, grace=max(1, int(deadline.total_seconds())))
    elif shape == "failed":
        status(S.FAILED)
    elif shape == "inflight":
        status(S.WAITING_FOR_TOOL)
        sent = clock[0]
        op(K.SENT, EvidenceSource.RUNTIME, reply_due_at=sent + timedelta(hours=1))
    else:
        raise ValueError(shape)
    return out


def plan(
    executions: int,
    *,
    start: datetime,
    spacing: timedelta,
    step: timedelta,
    deadline: timedelta = timedelta(seconds=2),
    seed: int = 8,
    run: str = "b",
    inflight_only: bool = False,
) -> list[Planned]:
    """Events of ``executions`` executions, the k-th starting at ``start + k * spacing``,
    merged in event-time order (each topic partition is then written in time order)."""
    rng = random.Random(seed)
    events: list[Planned] = []
    for k in range(executions):
        shape = "inflight" if inflight_only else _shape_for(rng)
        ex = f"ex-{run}-{k:07d}"
        for r in execution(ex, start + k * spacing, step, shape, deadline):
            events.append(Planned(_ms(r.occurred_at), r, shape))  # type: ignore[attr-defined]
    events.sort(key=lambda p: p.at_ms)
    return events


def shapes(events: Iterable[Planned]) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in events:
        out[p.record.avro_name] = out.get(p.record.avro_name, 0) + 1
    return out


def tick_times(first_ms: int, last_ms: int, every_ms: int) -> Iterator[int]:
    t = first_ms - first_ms % every_ms
    while t <= last_ms:
        yield t
        t += every_ms


def _ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


def from_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)
