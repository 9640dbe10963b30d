"""Which approval-verdict transitions and anomalies deserve a human's attention, as alerts,
and when an anomaly's alert ends.

Only actionable verdicts fire (STUCK_AFTER_DECISION, ORPHANED_WAIT, UNROUTABLE_WAIT,
STALE_REQUEST); leaving one of them publishes a RESOLVED alert naming the one it closes, so an
alerting subscriber can clear its page. One alert per transition, with an id derived from the
verdict record that caused it, so a replay gives the same alerts.

An anomaly is an input refused, an event rather than a condition: nothing that comes later can
make it not have happened. Its alert therefore ends by time: ``VIGIL_ANOMALY_ALERT_TTL`` of
stream time after the anomaly (docs/rules.md#alert-lifecycle). The shell keeps the ends still
to come (``Ends``) with the entry the anomaly belongs to and asks for the due ones as stream
time passes (``due_ends``); each is published as a RESOLVED alert naming the alert it ends,
stamped with the instant it ends, so a live run and a replay publish the same records.
"""

from __future__ import annotations

import json
from typing import NamedTuple

from streams.contracts.models.enums import (
    AlertKind,
    AlertStatus,
    ApprovalVerdictCode,
    Owner,
    Severity,
)
from streams.contracts.models.outputs import Alert, Anomaly, ApprovalVerdict
from streams.core.executions import from_ms, to_ms
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
                ends_with_resolved=True,
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
        ends_with_resolved=True,
    )


# -- the end of an anomaly's alert ----------------------------------------------------------


class PendingEnd(NamedTuple):
    """A FIRING alert that ends at a known instant of stream time, and what its RESOLVED
    alert repeats of it. Times in epoch ms."""

    ends_at: int
    alert_id: str
    execution_id: str
    subject_id: str
    verdict: str | None
    fired_at: int


#: The ends still to come of one entry, by (``ends_at``, ``alert_id``).
Ends = tuple[PendingEnd, ...]

#: The most ends one entry keeps. An entry is one changelog record: a flood of anomalies
#: must not make it grow without bound, so beyond this the end that comes first is brought
#: forward (``add_end``); the flood itself is what the VigilAnomalies rule reports.
MAX_PENDING = 256

#: The verdict of the RESOLVED alert that ends an anomaly's alert.
EXPIRED = "EXPIRED"


def anomaly_end(alert: Alert, ttl_ms: int) -> PendingEnd:
    """When an ANOMALY alert ends: ``ttl_ms`` after its own time (the anomaly's), in stream
    time. Its own time, not the stream time when it was found: that depends on how the input
    topics interleave, and a replay must end it at the same instant."""
    fired = to_ms(alert.occurred_at)
    return PendingEnd(
        fired + ttl_ms, alert.alert_id, alert.execution_id, alert.subject_id, alert.verdict, fired
    )


def add_end(
    ends: Ends | None, end: PendingEnd, limit: int = MAX_PENDING
) -> tuple[Ends, tuple[Alert, ...]]:
    """``ends`` with ``end`` added (unchanged if it is there: an input read again after a
    restart finds its anomaly again, with the same alert id), and the RESOLVED alerts of the
    ends brought forward to stay within ``limit``: the first to come, ended when ``end``
    fired (never before it began nor after it was due)."""
    ends = ends or ()
    if any(e.alert_id == end.alert_id for e in ends):
        return ends, ()
    kept = tuple(sorted((*ends, end)))
    early: list[Alert] = []
    while len(kept) > limit:
        first, kept = kept[0], kept[1:]
        at = min(first.ends_at, max(first.fired_at, end.fired_at))
        early.append(
            ended_alert(
                first,
                at,
                f"ended early: more than {limit} anomaly alerts of one execution or partition "
                "were open at once; the anomalies themselves are all on the anomalies topic",
            )
        )
    return kept, tuple(early)


def due_ends(ends: Ends | None, horizon: int) -> tuple[Ends, tuple[Alert, ...]]:
    """The ends at or before ``horizon`` (epoch ms) as RESOLVED alerts stamped with their
    own instants, in that order, and the ends still to come. Idempotent, and advancing in
    steps gives what one big step gives."""
    ends = ends or ()
    n = 0
    while n < len(ends) and ends[n].ends_at <= horizon:
        n += 1
    if n == 0:
        return ends, ()
    resolved = tuple(
        ended_alert(
            e,
            e.ends_at,
            f"none: it ended {(e.ends_at - e.fired_at) / 1000:g} s of stream time after the "
            "anomaly (VIGIL_ANOMALY_ALERT_TTL); the anomaly stays on the anomalies topic",
        )
        for e in ends[:n]
    )
    return ends[n:], resolved


def next_end(ends: Ends | None) -> int | None:
    """The first instant an end falls due (epoch ms), for the shell's timer index."""
    return ends[0].ends_at if ends else None


def ended_alert(end: PendingEnd, at: int, next_step: str) -> Alert:
    """The RESOLVED alert that ends ``end``'s alert at ``at`` (epoch ms). Its id derives from
    the alert it ends alone: an alert ends once, whenever and however."""
    return Alert(
        alert_id=deterministic_id("alert-resolved", AlertKind.ANOMALY, end.alert_id),
        kind=AlertKind.ANOMALY,
        status=AlertStatus.RESOLVED,
        severity=Severity.INFO,
        execution_id=end.execution_id,
        subject_id=end.subject_id,
        verdict=EXPIRED,
        owner=Owner.OPERATOR,
        next_step=next_step,
        evidence=(f"ended={end.verdict or ''}", f"fired_at={from_ms(end.fired_at).isoformat()}"),
        occurred_at=from_ms(at),
        resolves_alert_id=end.alert_id,
    )


def dump_ends(ends: Ends) -> str:
    """The stored text of an entry's ends: a JSON array of each end's fields in order."""
    return json.dumps([list(e) for e in ends], separators=(",", ":"), ensure_ascii=False)


def load_ends(text: str) -> Ends:
    """Inverse of ``dump_ends``."""
    return tuple(PendingEnd(int(a), b, c, d, v, int(f)) for a, b, c, d, v, f in json.loads(text))
