"""What needs a person, one row per thing: the rows of the console's attention list.

The page's first view at fleet scale is one table of everything a person must act on, across
every execution: an approval wait in a verdict that alerts, an attempt whose effect is UNKNOWN or
under MANUAL_REVIEW (the operation's latest attempt, and an older attempt that holds its retry
verdict), and an open work item once its deadline has passed. Each is a row of the view's
``attention`` table, derived from the row it comes from whenever that row (or an alert about its
subject) changes, so the list is filtered, sorted, counted and paginated by SQLite with indexes
instead of being assembled in the browser.

The functions here are pure: they take the view's item of the source row (its record with the
view's own fields) and say which attention rows it makes; ``raised`` adds what the alerts
firing about a row's subject say. ``streams/console/view.py`` stores the rows, and reads each
row's source again for the rows of a page it answers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
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
    table and scoped key): every row of a source is replaced when the source changes.
    ``severity`` and ``next_step`` start as the row's own rule's (``base_*``) and are raised
    by the alerts firing about its subject (``with_alerts``)."""

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
    base_severity: str
    base_next_step: str
    connector: str | None
    action: str | None
    since_ms: int
    #: in the list once the wall clock has reached this (a work item: its deadline)
    due_ms: int
    severity: str = ""
    next_step: str = ""

    def __post_init__(self) -> None:
        if not self.severity:
            object.__setattr__(self, "severity", self.base_severity)
        if not self.next_step:
            object.__setattr__(self, "next_step", self.base_next_step)

    def with_alerts(self, alerts: Sequence[FiringAlert]) -> AttentionRow:
        severity, step = raised(self.kind, self.base_severity, self.base_next_step, alerts)
        if (severity, step) == (self.severity, self.next_step):
            return self
        return replace(self, severity=severity, next_step=step)

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


def raised(
    kind: str, base_severity: str, base_next_step: str, alerts: Sequence[FiringAlert]
) -> tuple[str, str]:
    """A row's severity and next step with the alerts firing about its subject: the most
    severe alert raises the severity (never lowers it); for an attempt, its next step is that
    alert's (a FORBIDDEN_RETRY says to stop the duplicate). An approval keeps its verdict's
    step, a work item its own."""
    top = _strongest(alerts)
    if top is None:
        return base_severity, base_next_step
    severity = top.severity if rank(top.severity) < rank(base_severity) else base_severity
    step = top.next_step if kind == "operation" and top.next_step else base_next_step
    return severity, step


def approval_rows(row_key: str, item: Mapping[str, Any], started_ms: int) -> list[AttentionRow]:
    """An open approval wait in a verdict that alerts; its severity is the alert's rule
    (streams/core/alerts.py), its next step the verdict's own."""
    verdict = str(item.get("verdict"))
    if not item.get("open") or verdict not in ATTENTION_VERDICTS:
        return []
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
            base_severity=ACTIONABLE[verdict].value,  # type: ignore[index]
            base_next_step=str(item.get("next_step") or ""),
            connector=None,
            action=item.get("action"),
            since_ms=started_ms,
            due_ms=0,
        )
    ]


def open_attempts(item: Mapping[str, Any]) -> dict[int, str]:
    """The attempts of an operation a person must settle (UNKNOWN or under MANUAL_REVIEW), by
    number, with their status: from every attempt the view knows of when the operation's
    item lists them (``attempts``), else from its state: the latest attempt, and the older
    attempt of the same operation that holds the retry verdict (``held_by_*``), which a later
    attempt's outcome does not settle."""
    op, ex = item["operation_id"], item["execution_id"]
    known = item.get("attempts")
    if isinstance(known, list) and known:
        return {
            int(a["attempt"]): str(a["status"])
            for a in known
            if isinstance(a, Mapping) and a.get("status") in REVIEWABLE
        }
    out: dict[int, str] = {}
    if item.get("status") in REVIEWABLE:
        out[int(item["attempt"])] = str(item["status"])
    held = item.get("held_by_attempt")
    if (
        item.get("held_by_operation_id") == op
        and item.get("held_by_execution_id") in (None, ex)
        and held is not None
        and item.get("held_by_status") in REVIEWABLE
    ):
        out.setdefault(int(held), str(item["held_by_status"]))
    return out


def operation_rows(
    row_key: str, item: Mapping[str, Any], since_ms: int, since_of: Mapping[int, int]
) -> list[AttentionRow]:
    """One row per attempt of the operation whose effect a person must settle
    (``open_attempts``). ``since_of``: when an older attempt entered its status, as far as
    the view knows (missing: the state's own time); the latest attempt's is the state's."""
    op, ex = item["operation_id"], item["execution_id"]
    latest = int(item["attempt"])

    def row(attempt: int, status: str) -> AttentionRow:
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
            base_severity=Severity.WARNING.value,
            base_next_step=NEXT_STEP_UNKNOWN if status == "UNKNOWN" else NEXT_STEP_REVIEW,
            connector=item.get("connector"),
            action=None,
            since_ms=since_ms if attempt == latest else since_of.get(attempt, since_ms),
            due_ms=0,
        )

    return [row(n, status) for n, status in sorted(open_attempts(item).items())]


def work_item_rows(row_key: str, item: Mapping[str, Any], deadline_ms: int) -> list[AttentionRow]:
    """An open work item, in the list once its deadline has passed (overdue: reconciliation
    is late), aged from the deadline."""
    if not item.get("open"):
        return []
    kind = str(item.get("kind"))
    overdue_verification = kind == WorkItemKind.VERIFICATION_TIMEOUT.value
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
            base_severity=Severity.WARNING.value,
            base_next_step=NEXT_STEP_OVERDUE if overdue_verification else NEXT_STEP_UNKNOWN,
            connector=item.get("connector"),
            action=None,
            since_ms=deadline_ms,
            due_ms=deadline_ms,
        )
    ]
