"""Which approval-verdict transitions deserve a human's attention, as alerts.

Only actionable verdicts fire (STUCK_AFTER_DECISION, ORPHANED_WAIT, UNROUTABLE_WAIT,
STALE_REQUEST); leaving one of them publishes a RESOLVED alert naming the one it closes, so an
alerting subscriber can clear its page. One alert per transition, with an id derived from the
verdict record that caused it, so a replay gives the same alerts.
"""

from __future__ import annotations

from streams.contracts.models.enums import (
    AlertKind,
    AlertStatus,
    ApprovalVerdictCode,
    Owner,
    Severity,
)
from streams.contracts.models.outputs import Alert, Anomaly, ApprovalVerdict
from streams.core.ids import deterministic_id

V = ApprovalVerdictCode
ACTIONABLE: dict[ApprovalVerdictCode, Severity] = {
    V.STUCK_AFTER_DECISION: Severity.CRITICAL,
    V.ORPHANED_WAIT: Severity.CRITICAL,
    V.UNROUTABLE_WAIT: Severity.WARNING,
    V.STALE_REQUEST: Severity.WARNING,
}


def _firing_id(request_id: str, verdict: ApprovalVerdictCode, since_verdict_id: str) -> str:
    return deterministic_id(
        "alert", AlertKind.APPROVAL_VERDICT, request_id, verdict, since_verdict_id
    )


def verdict_alerts(record: ApprovalVerdict, previous_verdict_id: str | None) -> tuple[Alert, ...]:
    """Alerts for one verdict transition. ``previous_verdict_id`` is the id of the verdict
    record being left (the one whose FIRING alert a RESOLVED alert closes)."""
    alerts: list[Alert] = []
    evidence = tuple(f"{f.proof}:{f.state}:{f.reason}" for f in record.failed_proofs)
    prev = record.previous_verdict
    if prev in ACTIONABLE and previous_verdict_id is not None and prev != record.verdict:
        fired = _firing_id(record.request_id, prev, previous_verdict_id)
        alerts.append(
            Alert(
                alert_id=deterministic_id("alert-resolved", fired, record.verdict_id),
                kind=AlertKind.APPROVAL_VERDICT,
                status=AlertStatus.RESOLVED,
                severity=Severity.INFO,
                execution_id=record.execution_id,
                subject_id=record.request_id,
                verdict=str(record.verdict),
                owner=record.owner,
                next_step=f"resolved: {prev} → {record.verdict}; {record.next_step}",
                evidence=evidence,
                occurred_at=record.evaluated_at,
                resolves_alert_id=fired,
                traceparent=record.traceparent,
            )
        )
    severity = ACTIONABLE.get(record.verdict)
    if severity is not None:
        alerts.append(
            Alert(
                alert_id=_firing_id(record.request_id, record.verdict, record.verdict_id),
                kind=AlertKind.APPROVAL_VERDICT,
                status=AlertStatus.FIRING,
                severity=severity,
                execution_id=record.execution_id,
                subject_id=record.request_id,
                verdict=str(record.verdict),
                owner=record.owner,
                next_step=record.next_step,
                evidence=evidence,
                occurred_at=record.evaluated_at,
                traceparent=record.traceparent,
            )
        )
    return tuple(alerts)


def anomaly_alert(anomaly: Anomaly) -> Alert:
    """An anomaly is an input that was not applied: somebody's producer is wrong, or an agent
    acted after it finished. The operator decides; nothing is retried or repaired."""
    return Alert(
        alert_id=deterministic_id("alert", AlertKind.ANOMALY, anomaly.anomaly_id),
        kind=AlertKind.ANOMALY,
        status=AlertStatus.FIRING,
        severity=Severity.WARNING,
        execution_id=anomaly.execution_id or "",
        subject_id=anomaly.event_id or anomaly.anomaly_id,
        verdict=str(anomaly.kind),
        owner=Owner.OPERATOR,
        next_step="inspect the producer of this event; it was reported, not applied",
        evidence=(
            str(anomaly.kind),
            anomaly.reason,
            f"{anomaly.source_topic}/{anomaly.source_partition}@{anomaly.source_offset}",
        ),
        occurred_at=anomaly.detected_at,
        traceparent=anomaly.traceparent,
    )
