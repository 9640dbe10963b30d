"""What needs a person, one row per thing: the rows of the console's attention list.

The page's first view at fleet scale is one table of everything a person must act on, across
every execution: an approval wait in a verdict that alerts, an attempt whose effect is UNKNOWN or
under MANUAL_REVIEW (the operation's latest attempt, and an older attempt that holds its retry
verdict), and an open work item once its deadline has passed. Each is a row of the view's
``attention`` table, derived from the row it comes from whenever that row (or an alert about its
subject) changes, so the list is filtered, sorted, counted and paginated by SQLite with indexes
instead of being assembled in the browser.

The functions here are pure: they take the view's item of the source row (its record with the
view's own fields) and the alerts firing about its subject, and say which attention rows it
makes. ``streams/console/view.py`` stores them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from streams.contracts.models.enums import Owner, Severity, WorkItemKind
from streams.core.alerts import ACTIONABLE
from streams.core.operations import NEXT_STEP_OVERDUE, NEXT_STEP_UNKNOWN

#: The approval verdicts that need a person: the ones vigil alerts on.
ATTENTION_VERDICTS: frozenset[str] = frozenset(v.value for v in ACTIONABLE)
#: Attempt statuses a person settles (take into review, verified, failed).
REVIEWABLE: frozenset[str] = frozenset({"UNKNOWN", "MANUAL_REVIEW"})
#: Severities from the most urgent: the sort key of "severity, then age".
SEVERITY_ORDER: tuple[str, ...] = (
    Severity.CRITICAL.value,
    Severity.WARNING.value,
    Severity.INFO.value,
    Severity.UNRECOGNIZED.value,
)
SEVERITY_RANK: Mapping[str, int] = {s: i for i, s in enumerate(SEVERITY_ORDER)}
#: The same ranking as an SQL expression over a ``severity`` column (an index is built on it).
SEVERITY_RANK_SQL = (
    "(CASE severity"
    + "".join(f" WHEN '{s}' THEN {i}" for s, i in SEVERITY_RANK.items() if i < 3)
    + " ELSE 3 END)"
)
NEXT_STEP_REVIEW = (
    "check at the connector whether the effect happened, then record Verified or Failed"
)

KINDS: tuple[str, ...] = ("approval", "operation", "work_item")


def rank(severity: str | None) -> int:
    return SEVERITY_RANK.get(severity or "", 3)


@dataclass(frozen=True, slots=True)
class FiringAlert:
    """An alert firing about a subject of one execution: what it adds to a row."""

    severity: str
    next_step: str
    occurred_ms: int


@dataclass(frozen=True, slots=True)
class AttentionRow:
    """One thing that needs a person. ``source_key`` names the view row it comes from (its
    table and scoped key): every row of a source is replaced when the source changes."""

    row_key: str
    source_key: str
    kind: str
    subject_id: str
    #: the subject vigil's alerts about this thing name (a work item's alerts name its operation)
    alert_subject: str
    execution_id: str
    operation_id: str | None
    attempt: int | None
    label: str
    owner: str
    severity: str
    connector: str | None
    action: str | None
    since_ms: int
    #: in the list once the wall clock has reached this (a work item: its deadline)
    due_ms: int
    next_step: str
    item: dict[str, Any] = field(default_factory=dict)

    @property
    def search(self) -> str:
        """What the list's text filter matches, lowercased: ids, connector, action, label."""
        parts = (self.subject_id, self.execution_id, self.operation_id, self.connector,
                 self.action, self.label)  # fmt: skip
        return "\n".join(p for p in parts if p).lower()


def source_key(table: str, row_key: str) -> str:
    return f"{table}|{row_key}"


def _strongest(alerts: Sequence[FiringAlert]) -> FiringAlert | None:
    """The most severe firing alert, the newest among equals."""
    if not alerts:
        return None
    return min(alerts, key=lambda a: (rank(a.severity), -a.occurred_ms))


def _severity(base: str, alerts: Sequence[FiringAlert]) -> str:
    """The row's severity: its own rule's, raised by the most severe alert firing about it."""
    top = _strongest(alerts)
    if top is not None and rank(top.severity) < rank(base):
        return top.severity
    return base


def approval_rows(
    row_key: str, item: Mapping[str, Any], started_ms: int, alerts: Sequence[FiringAlert]
) -> list[AttentionRow]:
    """An open approval wait in a verdict that alerts; its severity is the alert's rule
    (streams/core/alerts.py), its next step the verdict's own."""
    verdict = str(item.get("verdict"))
    if not item.get("open") or verdict not in ATTENTION_VERDICTS:
        return []
    base = ACTIONABLE[verdict].value  # type: ignore[index]
    return [
        AttentionRow(
            row_key=f"approval|{row_key}",
            source_key=source_key("approvals", row_key),
            kind="approval",
            subject_id=item["request_id"],
            alert_subject=item["request_id"],
            execution_id=item["execution_id"],
            operation_id=None,
            attempt=None,
            label=verdict,
            owner=str(item.get("owner") or Owner.UNRECOGNIZED.value),
            severity=_severity(base, alerts),
            connector=None,
            action=item.get("action"),
            since_ms=started_ms,
            due_ms=0,
            next_step=str(item.get("next_step") or ""),
            item=dict(item),
        )
    ]


def operation_rows(
    row_key: str,
    item: Mapping[str, Any],
    since_ms: int,
    held_since_ms: int | None,
    alerts: Sequence[FiringAlert],
) -> list[AttentionRow]:
    """One row per attempt of the operation whose effect a person must settle: the latest
    attempt (the state's own status), and the older attempt of the same operation that holds
    the retry verdict (``held_by_*``) when it is UNKNOWN or under review too, which a later
    attempt's outcome does not settle. ``held_since_ms``: when that attempt entered its
    status, as far as the view's timeline knows (None: the state's own time)."""
    out: list[AttentionRow] = []
    op, ex = item["operation_id"], item["execution_id"]
    top = _strongest(alerts)

    def row(attempt: int, status: str, since: int, holds: bool) -> AttentionRow:
        default = NEXT_STEP_UNKNOWN if status == "UNKNOWN" else NEXT_STEP_REVIEW
        return AttentionRow(
            row_key=f"operation|{row_key}|{attempt}",
            source_key=source_key("operations", row_key),
            kind="operation",
            subject_id=op,
            alert_subject=op,
            execution_id=ex,
            operation_id=op,
            attempt=attempt,
            label=status,
            owner=Owner.CONNECTOR_OWNER.value,
            severity=_severity(Severity.WARNING.value, alerts),
            connector=item.get("connector"),
            action=None,
            since_ms=since,
            due_ms=0,
            next_step=top.next_step if top is not None else default,
            item={**item, "holds_retry": holds, "attempt_status": status},
        )

    latest = int(item["attempt"])
    if item.get("status") in REVIEWABLE:
        out.append(row(latest, str(item["status"]), since_ms, False))
    held = item.get("held_by_attempt")
    if (
        item.get("held_by_operation_id") == op
        and item.get("held_by_execution_id") in (None, ex)
        and held is not None
        and int(held) != latest
        and item.get("held_by_status") in REVIEWABLE
    ):
        since = held_since_ms if held_since_ms is not None else since_ms
        out.append(row(int(held), str(item["held_by_status"]), since, True))
    return out


def work_item_rows(
    row_key: str, item: Mapping[str, Any], deadline_ms: int, alerts: Sequence[FiringAlert]
) -> list[AttentionRow]:
    """An open work item, in the list once its deadline has passed (overdue: reconciliation
    is late), aged from the deadline."""
    if not item.get("open"):
        return []
    kind = str(item.get("kind"))
    overdue_verification = kind == WorkItemKind.VERIFICATION_TIMEOUT.value
    step = NEXT_STEP_OVERDUE if overdue_verification else NEXT_STEP_UNKNOWN
    return [
        AttentionRow(
            row_key=f"work_item|{row_key}",
            source_key=source_key("work_items", row_key),
            kind="work_item",
            subject_id=item["work_item_id"],
            alert_subject=item["operation_id"],
            execution_id=item["execution_id"],
            operation_id=item["operation_id"],
            attempt=int(item["attempt"]),
            label=f"OVERDUE {kind}",
            owner=Owner.CONNECTOR_OWNER.value,
            severity=_severity(Severity.WARNING.value, alerts),
            connector=item.get("connector"),
            action=None,
            since_ms=deadline_ms,
            due_ms=deadline_ms,
            next_step=step,
            item=dict(item),
        )
    ]
