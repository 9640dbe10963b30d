"""The console's view: vigil's output records applied to an SQLite file, and the queries on it.

The view is a cache of the output topics, nothing more: every row can be rebuilt by reading
the topics again. What makes it safe to keep across restarts is that the position read in
each partition (``offsets``) is written in the same SQLite transaction as the rows the
records produced: after a crash the file holds either a batch and its positions, or neither,
so the consumer resumes exactly after the last record applied. Applying is idempotent twice
over: a record at an offset below the stored position is skipped, and a record whose id
(``state_id``, ``verdict_id``, ``work_item_id``, ``resolution_id``, ``alert_id``) was
applied before is skipped too (a worker may publish the same record again after a restart).

Nothing here talks to Kafka: the service feeds ``apply`` decoded records and queries answer
from the file. Ages run to the wall clock the view is given (``clock``): an age goes on while
the fleet is quiet.

The lists (``LISTS``) are answered a page at a time, filtered, sorted and counted by SQLite
on indexes that lead with their filters; the attention list (``streams/console/attention.py``)
is kept as a table of its own, derived in the same transaction as the rows it comes from,
so that a fleet's "what needs a person" is one indexed query, not a merge of every list.
"""

from __future__ import annotations

import base64
import binascii
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from streams.console import attention as att
from streams.console.attempts import WorkItem, derive
from streams.console.attention import SEVERITY_RANK_SQL
from streams.contracts.keys import scoped_key
from streams.contracts.models.base import Record
from streams.contracts.models.enums import (
    AlertKind,
    AlertStatus,
    ApprovalVerdictCode,
    ExecutionStatus,
    OperationStatus,
    Owner,
    Severity,
    WorkItemKind,
)
from streams.contracts.models.outputs import (
    Alert,
    ApprovalVerdict,
    ExecutionState,
    OperationState,
    ReconciliationCheck,
    ReconciliationWorkItem,
    WorkItemResolution,
)
from streams.core.approvals import CLOSED_VERDICTS
from streams.core.operations import NEXT_STEP_OVERDUE, NEXT_STEP_UNKNOWN

#: Alert kinds that had no RESOLVED record before ``Alert.ends_with_resolved``: one of them
#: written without that flag never ends, so the view does not count it as firing.
_ENDED_ONLY_SINCE = {AlertKind.FORBIDDEN_RETRY, AlertKind.ANOMALY}

#: Bumped when the tables change: an older file is dropped and rebuilt from the topics.
SCHEMA_VERSION = 4
#: Tables kept across a version change: written by the console itself (``review.py``), not
#: rebuilt from the topics.
KEPT_TABLES = frozenset({"review_log"})
MAX_LIMIT = 500
DEFAULT_LIMIT = 50
#: Longest free-text filter value accepted (ids, connectors, actions).
MAX_TEXT = 256

_SCHEMA = """
CREATE TABLE IF NOT EXISTS offsets (
    topic TEXT NOT NULL, partition INTEGER NOT NULL, next_offset INTEGER NOT NULL,
    PRIMARY KEY (topic, partition));
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS executions (
    execution_id TEXT PRIMARY KEY, status TEXT NOT NULL, since_ms INTEGER NOT NULL,
    terminal INTEGER NOT NULL, last_sequence INTEGER NOT NULL, record TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS executions_since ON executions (since_ms, execution_id);
CREATE TABLE IF NOT EXISTS operations (
    row_key TEXT PRIMARY KEY, operation_id TEXT NOT NULL, execution_id TEXT NOT NULL,
    status TEXT NOT NULL, connector TEXT NOT NULL, owner TEXT, since_ms INTEGER NOT NULL,
    record TEXT NOT NULL, attempts TEXT);
CREATE INDEX IF NOT EXISTS operations_since ON operations (since_ms, row_key);
CREATE INDEX IF NOT EXISTS operations_id ON operations (operation_id);
CREATE INDEX IF NOT EXISTS operations_execution ON operations (execution_id);
CREATE TABLE IF NOT EXISTS approvals (
    row_key TEXT PRIMARY KEY, request_id TEXT NOT NULL, execution_id TEXT NOT NULL,
    verdict TEXT NOT NULL,
    owner TEXT NOT NULL, action TEXT, open INTEGER NOT NULL, evaluated_at_ms INTEGER NOT NULL,
    started_ms INTEGER NOT NULL, record TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS approvals_started ON approvals (started_ms, row_key);
CREATE INDEX IF NOT EXISTS approvals_execution ON approvals (execution_id);
CREATE TABLE IF NOT EXISTS work_items (
    row_key TEXT PRIMARY KEY, work_item_id TEXT NOT NULL, operation_id TEXT NOT NULL,
    execution_id TEXT NOT NULL,
    kind TEXT NOT NULL, connector TEXT NOT NULL, deadline_ms INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL, open INTEGER NOT NULL, record TEXT NOT NULL,
    resolution TEXT, reconciler TEXT);
CREATE INDEX IF NOT EXISTS work_items_deadline ON work_items (deadline_ms, row_key);
CREATE INDEX IF NOT EXISTS work_items_execution ON work_items (execution_id);
CREATE TABLE IF NOT EXISTS resolutions (row_key TEXT PRIMARY KEY, record TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS reconciler_checks (
    work_item_id TEXT PRIMARY KEY, updated_ms INTEGER NOT NULL, record TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS alerts (
    alert_id TEXT PRIMARY KEY, kind TEXT NOT NULL, severity TEXT NOT NULL,
    owner TEXT NOT NULL, execution_id TEXT NOT NULL, firing INTEGER NOT NULL,
    occurred_at_ms INTEGER NOT NULL, record TEXT NOT NULL, resolved_by TEXT);
CREATE INDEX IF NOT EXISTS alerts_occurred ON alerts (occurred_at_ms, alert_id);
CREATE INDEX IF NOT EXISTS alerts_execution ON alerts (execution_id);
CREATE TABLE IF NOT EXISTS alert_resolutions (
    resolves_alert_id TEXT PRIMARY KEY, alert_id TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS attempts (
    op_row_key TEXT NOT NULL, attempt INTEGER NOT NULL, execution_id TEXT NOT NULL,
    operation_id TEXT NOT NULL, status TEXT NOT NULL, blocks_retry INTEGER NOT NULL,
    open_work_item_id TEXT, PRIMARY KEY (op_row_key, attempt));
CREATE INDEX IF NOT EXISTS attempts_blocking ON attempts (blocks_retry, status);
CREATE TABLE IF NOT EXISTS timeline (
    row_key TEXT PRIMARY KEY, record_id TEXT NOT NULL, execution_id TEXT NOT NULL,
    at_ms INTEGER NOT NULL,
    kind TEXT NOT NULL, subject_id TEXT NOT NULL, summary TEXT NOT NULL,
    topic TEXT NOT NULL, partition INTEGER NOT NULL, offset INTEGER NOT NULL,
    record TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS timeline_execution ON timeline (execution_id, at_ms);
CREATE TABLE IF NOT EXISTS attention (
    row_key TEXT PRIMARY KEY, source_key TEXT NOT NULL, kind TEXT NOT NULL,
    subject_id TEXT NOT NULL, alert_subject TEXT NOT NULL, execution_id TEXT NOT NULL,
    operation_id TEXT, attempt INTEGER, label TEXT NOT NULL, owner TEXT NOT NULL,
    severity TEXT NOT NULL, sev_rank INTEGER NOT NULL, connector TEXT, action TEXT,
    since_ms INTEGER NOT NULL, due_ms INTEGER NOT NULL, next_step TEXT NOT NULL,
    search TEXT NOT NULL, base_severity TEXT NOT NULL, base_next_step TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS attention_source ON attention (source_key);
CREATE INDEX IF NOT EXISTS attention_subject ON attention (execution_id, alert_subject);
CREATE INDEX IF NOT EXISTS attention_severity ON attention (sev_rank, since_ms, row_key);
CREATE INDEX IF NOT EXISTS attention_since ON attention (since_ms, row_key);
CREATE INDEX IF NOT EXISTS attention_owner ON attention (owner, sev_rank, since_ms, row_key);
CREATE INDEX IF NOT EXISTS attention_kind ON attention (kind, sev_rank, since_ms, row_key);
"""
#: Indexes that fit the lists' filters and sorts (a filter column first, then the sort and the
#: id, so a filtered page is a range of one index) and the summary's counts (covering).
_LIST_INDEXES = f"""
CREATE INDEX IF NOT EXISTS executions_status ON executions (status, since_ms, execution_id);
CREATE INDEX IF NOT EXISTS executions_terminal ON executions (terminal, since_ms, execution_id);
CREATE INDEX IF NOT EXISTS operations_status ON operations (status, since_ms, row_key);
CREATE INDEX IF NOT EXISTS approvals_open ON approvals (open, verdict, started_ms, row_key);
CREATE INDEX IF NOT EXISTS work_items_open ON work_items (open, deadline_ms, row_key);
CREATE INDEX IF NOT EXISTS alerts_firing ON alerts (firing, occurred_at_ms, alert_id);
CREATE INDEX IF NOT EXISTS alerts_firing_severity
    ON alerts (firing, {SEVERITY_RANK_SQL}, occurred_at_ms, alert_id);
"""


@dataclass(frozen=True, slots=True)
class Incoming:
    """One record read from an output topic, decoded (``record`` None: it could not be, and
    only its position counts)."""

    topic: str
    partition: int
    offset: int
    record: Record | None


Change = dict[str, str]


class QueryError(ValueError):
    """A query the view refuses: bad filter name or value, bad cursor. ``allowed`` lists what
    would have been accepted, for the 400 answer."""

    def __init__(self, message: str, allowed: Mapping[str, Any]) -> None:
        super().__init__(message)
        self.allowed = dict(allowed)


# --------------------------------------------------------------------------------------------
# Derivations
# --------------------------------------------------------------------------------------------

_SETTLED = {OperationStatus.VERIFIED, OperationStatus.FAILED, OperationStatus.CANCELLED}
_RECONCILE = {OperationStatus.UNKNOWN, OperationStatus.RECONCILING, OperationStatus.MANUAL_REVIEW}


def operation_owner(state: OperationState) -> Owner | None:
    """Who owns the next step of an operation: whoever reconciles with the connector's source
    while its effect is unknown or a work item is open; the runtime while it is in flight;
    nobody once it is settled."""
    if state.status in _RECONCILE or state.open_work_item_id is not None:
        return Owner.CONNECTOR_OWNER
    if state.status in _SETTLED:
        return None
    return Owner.RUNTIME_OWNER


def work_item_next_step(kind: WorkItemKind) -> str:
    """The work item's next safe step: the one its alert names."""
    return NEXT_STEP_OVERDUE if kind is WorkItemKind.VERIFICATION_TIMEOUT else NEXT_STEP_UNKNOWN


def _ms(value: datetime) -> int:
    # Exact: a float timestamp can give the millisecond before.
    delta = value - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return (datetime(1970, 1, 1, tzinfo=UTC) + _td(ms)).isoformat()


def _td(ms: int) -> Any:
    from datetime import timedelta

    return timedelta(milliseconds=ms)


def _record_id(record: Record) -> str:
    for name in ("state_id", "verdict_id", "resolution_id", "work_item_id", "alert_id"):
        value = getattr(record, name, None)
        if value is not None:
            return str(value)
    raise TypeError(f"{type(record).__name__} has no record id")


def _event_ms(record: Record) -> int | None:
    value = getattr(record, record.time_field, None) if record.time_field else None
    return _ms(value) if value is not None else None


def _summary(record: Record) -> tuple[str, str, str]:
    """(kind, subject id, one-line summary) of a record for the timeline and change feed."""
    if isinstance(record, ExecutionState):
        return "execution", record.execution_id, f"execution {record.status}"
    if isinstance(record, OperationState):
        return (
            "operation",
            record.operation_id,
            f"operation {record.operation_id} #{record.attempt} {record.status}"
            f" (retry {record.retry})",
        )
    if isinstance(record, ApprovalVerdict):
        return (
            "approval",
            record.request_id,
            f"approval {record.request_id} {record.verdict} (owner {record.owner})",
        )
    if isinstance(record, ReconciliationWorkItem):
        return (
            "work_item",
            record.work_item_id,
            f"work item {record.kind} for {record.operation_id} #{record.attempt}",
        )
    if isinstance(record, WorkItemResolution):
        return (
            "work_item",
            record.work_item_id,
            f"work item resolved: {record.outcome} ({record.evidence_source})",
        )
    if isinstance(record, Alert):
        return (
            "alert",
            record.alert_id,
            f"alert {record.status} {record.kind} {record.severity} on {record.subject_id}",
        )
    raise TypeError(f"the console does not keep {type(record).__name__}")


def _dump(record: Record) -> str:
    return record.model_dump_json()


# --------------------------------------------------------------------------------------------
# List specifications
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Filter:
    column: str
    #: allowed values; None: free text (bounded length)
    values: tuple[str, ...] | None = None
    kind: str = "text"  # text | bool | time_before | time_after | search
    #: search: the columns (or expressions) the text is looked for in, case-insensitively
    columns: tuple[str, ...] = ()
    #: search: what those are, for the 400 answer and /api/lists
    about: str = ""


#: A sort: the column (or the columns, compared in order) and whether it runs descending. The
#: row's id breaks ties, so (sort columns, id) is a total order and a cursor is exact.
Sort = tuple[str | tuple[str, ...], bool]


@dataclass(frozen=True)
class ListSpec:
    name: str
    table: str
    id_column: str
    sorts: Mapping[str, Sort]  # name -> (column or columns, descending)
    default_sort: str
    filters: Mapping[str, Filter]
    #: filters applied when the query does not name them
    defaults: Mapping[str, str] = field(default_factory=dict)
    #: a row is listed once the wall clock has reached this column (None: always)
    due_column: str | None = None
    #: a column naming the row another list's row comes from (``table|row_key``): that row's
    #: item is read for the rows of a page only, so the list's own table stays narrow and a
    #: count or a search scans little
    source_column: str | None = None

    def columns(self, sort: str) -> tuple[str, ...]:
        column = self.sorts[sort][0]
        return (column,) if isinstance(column, str) else column

    def allowed(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "params": sorted([*self.filters, "limit", "cursor", "sort"]),
            "sort": list(self.sorts),
            "limit": f"1..{MAX_LIMIT}",
        }
        for name, f in self.filters.items():
            if f.values is not None:
                out[name] = list(f.values)
            elif f.kind == "bool":
                out[name] = ["true", "false"]
            elif f.kind.startswith("time"):
                out[name] = "ISO 8601 time with a UTC offset"
            elif f.kind == "search":
                where = f.about or ", ".join(f.columns)
                out[name] = f"text found in {where} (any case), at most {MAX_TEXT} characters"
            else:
                out[name] = f"text, at most {MAX_TEXT} characters"
        return out

    def describe(self) -> dict[str, Any]:
        """The list for a client building its controls (``/api/lists``): its filters with
        their allowed values, the filters applied by default, its sorts and the default one."""
        return {
            "path": f"/api/{self.name}",
            "allowed": self.allowed(),
            "defaults": dict(self.defaults),
            "sorts": list(self.sorts),
            "default_sort": self.default_sort,
            "max_limit": MAX_LIMIT,
        }


def _names(enum: Any) -> tuple[str, ...]:
    return tuple(m.value for m in enum)


_OWNERS = _names(Owner)
_SEVERITIES = _names(Severity)
#: the tables an attention row may come from
_SOURCE_TABLES = frozenset({"approvals", "operations", "work_items"})


def _search(*columns: str, about: str = "") -> Filter:
    return Filter("", kind="search", columns=columns, about=about)


LISTS: dict[str, ListSpec] = {
    "attention": ListSpec(
        "attention",
        "attention",
        "row_key",
        # severity: the most severe first, then the oldest; age: the oldest first
        {
            "severity": (("sev_rank", "since_ms"), False),
            "age": ("since_ms", False),
            "-age": ("since_ms", True),
        },
        "severity",
        {
            "kind": Filter("kind", att.KINDS),
            "owner": Filter("owner", _OWNERS),
            "severity": Filter("severity", _SEVERITIES),
            # an approval verdict, an attempt status, or OVERDUE <work item kind>
            "label": Filter("label"),
            "connector": Filter("connector"),
            "execution_id": Filter("execution_id"),
            "q": _search("search", about="ids, connector, action, label"),
        },
        due_column="due_ms",
        source_column="source_key",
    ),
    "approvals": ListSpec(
        "approvals",
        "approvals",
        "row_key",
        # age: how long the wait has lasted; -age: the oldest first
        {
            "-age": ("started_ms", False),
            "age": ("started_ms", True),
            "evaluated_at": ("evaluated_at_ms", False),
        },
        "-age",
        {
            "verdict": Filter("verdict", _names(ApprovalVerdictCode)),
            "owner": Filter("owner", _OWNERS),
            "action": Filter("action"),
            "execution_id": Filter("execution_id"),
            "open": Filter("open", kind="bool"),
            "q": _search("request_id", "execution_id", "action"),
        },
    ),
    "operations": ListSpec(
        "operations",
        "operations",
        "row_key",
        {"since": ("since_ms", False), "-since": ("since_ms", True)},
        "since",
        {
            # the latest attempt's status, or that of any attempt still blocking a retry
            "status": Filter("status", _names(OperationStatus)),
            "connector": Filter("connector"),
            "owner": Filter("owner", _OWNERS),
            "execution_id": Filter("execution_id"),
            "q": _search("operation_id", "execution_id", "connector"),
            # an attempt of it is sent and not settled (``attempts.blocks_retry``)
            "blocking": Filter("blocking", kind="bool"),
        },
    ),
    "work-items": ListSpec(
        "work-items",
        "work_items",
        "row_key",
        {"deadline": ("deadline_ms", False), "created_at": ("created_at_ms", False)},
        "deadline",
        {
            "open": Filter("open", kind="bool"),
            "kind": Filter("kind", _names(WorkItemKind)),
            "connector": Filter("connector"),
            "execution_id": Filter("execution_id"),
            "q": _search("work_item_id", "operation_id", "execution_id", "connector"),
        },
        {"open": "true"},
    ),
    "executions": ListSpec(
        "executions",
        "executions",
        "execution_id",
        {"since": ("since_ms", False), "-since": ("since_ms", True)},
        "since",
        {
            "status": Filter("status", _names(ExecutionStatus)),
            "terminal": Filter("terminal", kind="bool"),
            "since_before": Filter("since_ms", kind="time_before"),
            "since_after": Filter("since_ms", kind="time_after"),
            "q": _search("execution_id"),
        },
    ),
    "alerts": ListSpec(
        "alerts",
        "alerts",
        "alert_id",
        # severity: the most severe first, then the oldest
        {
            "occurred_at": ("occurred_at_ms", False),
            "-occurred_at": ("occurred_at_ms", True),
            "severity": ((SEVERITY_RANK_SQL, "occurred_at_ms"), False),
        },
        "occurred_at",
        {
            # FIRING: not closed by a later RESOLVED alert; RESOLVED: closed
            "status": Filter("firing", ("FIRING", "RESOLVED")),
            "owner": Filter("owner", _OWNERS),
            "severity": Filter("severity", _SEVERITIES),
            "kind": Filter("kind", _names(AlertKind)),
            "execution_id": Filter("execution_id"),
            "q": _search(
                "alert_id",
                "execution_id",
                "json_extract(record, '$.subject_id')",
                about="alert_id, execution_id, subject_id",
            ),
        },
        {"status": "FIRING"},
    ),
}


CursorValue = int | tuple[int, ...]


def encode_cursor(sort: str, value: CursorValue, ident: str) -> str:
    """A cursor after the row with sort ``value`` (one int, or one per sort column) and id."""
    v: Any = list(value) if isinstance(value, tuple) else value
    raw = json.dumps({"s": sort, "v": v, "id": ident}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _cursor_int(value: Any) -> bool:
    return type(value) is int and abs(value) <= 2**62


def decode_cursor(text: str, sort: str, allowed: Mapping[str, Any]) -> tuple[CursorValue, str]:
    """The (sort value, id) a cursor resumes after; a QueryError for anything else."""
    try:
        padded = text + "=" * (-len(text) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
    except (ValueError, binascii.Error, UnicodeError, RecursionError):
        raise QueryError("cursor: not a cursor this console gave out", allowed) from None
    if not isinstance(data, dict) or set(data) != {"s", "v", "id"}:
        raise QueryError("cursor: not a cursor this console gave out", allowed)
    value, ident = data["v"], data["id"]
    if isinstance(value, list) and 1 < len(value) <= 4 and all(map(_cursor_int, value)):
        value = tuple(value)
    elif not _cursor_int(value):
        raise QueryError("cursor: not a cursor this console gave out", allowed)
    if not isinstance(ident, str):
        raise QueryError("cursor: not a cursor this console gave out", allowed)
    if data["s"] != sort:
        raise QueryError(f"cursor: given out for sort={data['s']}, not sort={sort}", allowed)
    _text_ok("cursor", ident, allowed)
    return value, ident


def _text_ok(name: str, value: str, allowed: Mapping[str, Any]) -> str:
    if len(value) > MAX_TEXT:
        raise QueryError(f"{name}: longer than {MAX_TEXT} characters", allowed)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise QueryError(f"{name}: not valid text", allowed) from None
    return value


def _parse_time(name: str, value: str, allowed: Mapping[str, Any]) -> int:
    try:
        t = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except (ValueError, TypeError):
        raise QueryError(f"{name}: not an ISO 8601 time: {value[:40]!r}", allowed) from None
    if t.tzinfo is None or t.utcoffset() is None:
        raise QueryError(f"{name}: give a UTC offset (for example 'Z')", allowed)
    try:
        return _ms(t)
    except OverflowError:
        raise QueryError(f"{name}: out of range", allowed) from None


@dataclass(frozen=True)
class Page:
    items: list[dict[str, Any]]
    next_cursor: str | None
    as_of: dict[str, Any]
    #: rows the filters select, on every page (not only the ones left after the cursor)
    total: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "items": self.items,
            "next_cursor": self.next_cursor,
            "total": self.total,
            "as_of": self.as_of,
        }


#: The operations with an attempt still blocking a retry (an SQL fragment, its closing
#: parentheses left to the caller: ``row_key IN (...)``).
_BLOCKING = "row_key IN (SELECT op_row_key FROM attempts WHERE blocks_retry = 1"


def _refresh_attempts(
    db: sqlite3.Connection,
    execution_id: str,
    operation_id: str,
    state: OperationState | None = None,
) -> None:
    """The attempts of one operation derived again from what the view holds of it (its
    state, given when just applied, its work items with their resolutions and the
    reconciler's progress): into the ``attempts`` table, for counts and filters, and the
    operation's row, for the lists."""
    key = scoped_key(execution_id, operation_id)
    if state is None:
        row = db.execute("SELECT record FROM operations WHERE row_key = ?", (key,)).fetchone()
        state = OperationState.model_validate_json(row[0]) if row else None
    if (
        state is not None
        and state.attempt == 1
        and state.held_by_attempt is None
        and state.open_work_item_id is None
    ):
        # the common case, one attempt and no work item open: its state says it all (an item
        # of it is resolved, and its state, the latest, says how)
        items: list[WorkItem] = []
    else:
        items = _work_items(db, execution_id, operation_id)
    known = derive(state, items)
    db.execute("DELETE FROM attempts WHERE op_row_key = ?", (key,))
    db.executemany(
        "INSERT INTO attempts VALUES (?, ?, ?, ?, ?, ?, ?)",
        [
            (key, a.attempt, execution_id, operation_id, a.status.value, int(a.blocks_retry),
             a.open_work_item_id)
            for a in known
        ],
    )  # fmt: skip
    db.execute(
        "UPDATE operations SET attempts = ? WHERE row_key = ?",
        (json.dumps([a.to_json() for a in known], separators=(",", ":")), key),
    )


def _work_items(db: sqlite3.Connection, execution_id: str, operation_id: str) -> list[WorkItem]:
    """The work items of one operation, with their resolutions and the reconciler's progress."""
    return [
        WorkItem(
            ReconciliationWorkItem.model_validate_json(item),
            WorkItemResolution.model_validate_json(res) if res else None,
            ReconciliationCheck.model_validate_json(check) if check else None,
        )
        for item, res, check in db.execute(
            "SELECT record, resolution, reconciler FROM work_items"
            " WHERE execution_id = ? AND operation_id = ?",
            (execution_id, operation_id),
        )
    ]


# --------------------------------------------------------------------------------------------
# The view
# --------------------------------------------------------------------------------------------


class ConsoleView:
    """The SQLite file: one writer (the consumer thread, and ``execute_write``), readers on
    any thread, each with its own connection (WAL: readers see the last committed batch and
    never wait for the writer)."""

    def __init__(self, path: str | Path, clock: Callable[[], float] = time.time) -> None:
        """``clock``: wall-clock seconds, what ages are measured from (a test gives its own)."""
        self.path = str(path)
        self._clock = clock
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._write_lock = threading.Lock()
        self._local = threading.local()
        self._db = self._connect()
        with self._write_lock:
            self._migrate()

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30)
        db.execute("PRAGMA journal_mode=WAL")
        # With WAL, NORMAL loses at most the last transactions on a power cut, rows and
        # offsets together: never one without the other.
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA busy_timeout=30000")
        return db

    def _migrate(self) -> None:
        db = self._db
        (version,) = db.execute("PRAGMA user_version").fetchone()
        if version not in (0, SCHEMA_VERSION):
            # A cache from another version of the console: drop it, the topics rebuild it.
            # Not the tables the topics cannot rebuild: the record of who reviewed what.
            names = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
            for name in names:
                if name not in KEPT_TABLES and not name.startswith("sqlite_"):
                    db.execute(f'DROP TABLE IF EXISTS "{name}"')
        had_attention = db.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'attention'"
        ).fetchone()
        db.executescript(_SCHEMA + _LIST_INDEXES)
        if not had_attention:
            # A file from before the attention list: derive it from the rows it holds.
            db.execute("BEGIN IMMEDIATE")
            try:
                self.derive_attention(db)
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def derive_attention(self, db: sqlite3.Connection | None = None) -> int:
        """Derive the attention list again from every approval, operation and work item the
        view holds; returns the rows it has. (On a file from before the list, and for a view
        whose tables were filled directly, as the scale tests do.)"""
        own = db is None
        db = self._db if db is None else db
        if own:
            self._write_lock.acquire()
            db.execute("BEGIN IMMEDIATE")
        try:
            db.execute("DELETE FROM attention")
            for table in ("approvals", "operations", "work_items"):
                keys = [k for (k,) in db.execute(f"SELECT row_key FROM {table}")]
                for key in keys:
                    self._attention(db, table, key)
            (n,) = db.execute("SELECT count(*) FROM attention").fetchone()
            if own:
                db.execute("COMMIT")
            return int(n)
        except BaseException:
            if own:
                db.execute("ROLLBACK")
            raise
        finally:
            if own:
                self._write_lock.release()

    def _reader(self) -> sqlite3.Connection:
        if self.path == ":memory:":
            return self._db  # one connection is the whole database (single-threaded tests)
        db = getattr(self._local, "db", None)
        if db is None:
            db = self._local.db = self._connect()
        return db

    def close(self) -> None:
        with self._write_lock:
            self._db.close()
        db = getattr(self._local, "db", None)
        if db is not None and db is not self._db:
            db.close()
            self._local.db = None

    # ---------------------------------------------------------------- writing

    def positions(self) -> dict[tuple[str, int], int]:
        """The next offset to read in every partition the view has applied records of."""
        rows = self._reader().execute("SELECT topic, partition, next_offset FROM offsets")
        return {(t, p): n for t, p, n in rows}

    def is_empty(self) -> bool:
        return self._reader().execute("SELECT 1 FROM offsets LIMIT 1").fetchone() is None

    def apply(
        self,
        batch: Sequence[Incoming],
        *,
        before_commit: Callable[[sqlite3.Connection], None] | None = None,
    ) -> list[Change]:
        """Apply a batch in one transaction with the positions it reaches; returns what
        changed (for the change hub). ``before_commit`` runs inside the transaction before
        it commits (an exception there rolls back rows and positions together)."""
        changes: list[Change] = []
        with self._write_lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                pos = {
                    (t, p): n
                    for t, p, n in db.execute("SELECT topic, partition, next_offset FROM offsets")
                }
                max_ms: int | None = None
                moved: dict[tuple[str, int], int] = {}
                for item in batch:
                    key = (item.topic, item.partition)
                    if item.offset < pos.get(key, -1):
                        continue  # applied before
                    pos[key] = moved[key] = item.offset + 1
                    if item.record is None:
                        continue
                    change = self._apply_one(db, item)
                    if change is not None:
                        changes.append(change)
                        t = _event_ms(item.record)
                        if t is not None and (max_ms is None or t > max_ms):
                            max_ms = t
                db.executemany(
                    "INSERT INTO offsets VALUES (?, ?, ?) ON CONFLICT (topic, partition)"
                    " DO UPDATE SET next_offset = excluded.next_offset",
                    [(t, p, n) for (t, p), n in moved.items()],
                )
                if max_ms is not None:
                    db.execute(
                        "INSERT INTO meta VALUES ('event_time_ms', ?) ON CONFLICT (key) DO UPDATE"
                        " SET value = max(CAST(value AS INTEGER), CAST(excluded.value AS INTEGER))",
                        (str(max_ms),),
                    )
                if before_commit is not None:
                    before_commit(db)
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return changes

    def _apply_one(self, db: sqlite3.Connection, item: Incoming) -> Change | None:
        rec = item.record
        assert rec is not None
        if isinstance(rec, ReconciliationCheck):
            change = self._apply_check(db, rec)
            if change is not None:  # the work item's row in the attention list shows it too
                for (key,) in db.execute(
                    "SELECT row_key FROM work_items WHERE work_item_id = ?", (rec.work_item_id,)
                ).fetchall():
                    self._attention(db, "work_items", key)
                self._operation_attention(db, rec.execution_id, rec.operation_id)
            return change
        if not isinstance(
            rec,
            ExecutionState
            | OperationState
            | ApprovalVerdict
            | ReconciliationWorkItem
            | WorkItemResolution
            | Alert,
        ):
            return None  # another record type on an output topic: its position only
        rid = _record_id(rec)
        kind, subject, summary = _summary(rec)
        at = _event_ms(rec) or 0
        body = _dump(rec)
        cur = db.execute(
            "INSERT OR IGNORE INTO timeline VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (scoped_key(rec.execution_id, rid), rid, rec.execution_id, at, kind, subject,
             summary, item.topic, item.partition, item.offset, body),
        )  # fmt: skip
        if cur.rowcount == 0:
            return None  # this record was applied before (published again)
        if isinstance(rec, ExecutionState):
            db.execute(
                "INSERT INTO executions VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (execution_id)"
                " DO UPDATE SET status=excluded.status, since_ms=excluded.since_ms,"
                " terminal=excluded.terminal, last_sequence=excluded.last_sequence,"
                " record=excluded.record WHERE excluded.last_sequence >= last_sequence",
                (rec.execution_id, rec.status.value, _ms(rec.since), int(rec.terminal),
                 rec.last_sequence, body),
            )  # fmt: skip
        elif isinstance(rec, OperationState):
            owner = operation_owner(rec)
            db.execute(
                "INSERT INTO operations (row_key, operation_id, execution_id, status, connector,"
                " owner, since_ms, record) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (row_key)"
                " DO UPDATE SET status=excluded.status,"
                " connector=excluded.connector, owner=excluded.owner,"
                " since_ms=excluded.since_ms, record=excluded.record",
                (scoped_key(rec.execution_id, rec.operation_id), rec.operation_id,
                 rec.execution_id, rec.status.value, rec.connector,
                 owner.value if owner else None, _ms(rec.since), body),
            )  # fmt: skip
            _refresh_attempts(db, rec.execution_id, rec.operation_id, rec)
        elif isinstance(rec, ApprovalVerdict):
            started = _ms(rec.requested_at) if rec.requested_at else _ms(rec.evaluated_at)
            db.execute(
                "INSERT INTO approvals VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (row_key)"
                " DO UPDATE SET verdict=excluded.verdict, owner=excluded.owner,"
                " action=coalesce(excluded.action, action), open=excluded.open,"
                " evaluated_at_ms=excluded.evaluated_at_ms,"
                " started_ms=min(started_ms, excluded.started_ms), record=excluded.record"
                " WHERE excluded.evaluated_at_ms >= evaluated_at_ms",
                (scoped_key(rec.execution_id, rec.request_id), rec.request_id,
                 rec.execution_id, rec.verdict.value, rec.owner.value,
                 rec.action, int(rec.verdict not in CLOSED_VERDICTS), _ms(rec.evaluated_at),
                 started, body),
            )  # fmt: skip
        elif isinstance(rec, ReconciliationWorkItem):
            # Keyed with the execution: items opened before ids were scoped may share an id.
            row_key = scoped_key(rec.execution_id, rec.work_item_id)
            res = db.execute(
                "SELECT record FROM resolutions WHERE row_key = ?", (row_key,)
            ).fetchone()
            checks = db.execute(
                "SELECT record FROM reconciler_checks WHERE work_item_id = ?", (rec.work_item_id,)
            ).fetchone()
            db.execute(
                "INSERT OR REPLACE INTO work_items VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (row_key, rec.work_item_id, rec.operation_id, rec.execution_id, rec.kind.value,
                 rec.connector, _ms(rec.deadline), _ms(rec.created_at), int(res is None), body,
                 res[0] if res else None, checks[0] if checks else None),
            )  # fmt: skip
            _refresh_attempts(db, rec.execution_id, rec.operation_id)
        elif isinstance(rec, WorkItemResolution):
            row_key = scoped_key(rec.execution_id, rec.work_item_id)
            db.execute("INSERT OR REPLACE INTO resolutions VALUES (?, ?)", (row_key, body))
            db.execute(
                "UPDATE work_items SET open = 0, resolution = ? WHERE row_key = ?",
                (body, row_key),
            )
            _refresh_attempts(db, rec.execution_id, rec.operation_id)
        elif isinstance(rec, Alert):
            if rec.status is AlertStatus.RESOLVED and rec.resolves_alert_id:
                db.execute(
                    "INSERT OR REPLACE INTO alert_resolutions VALUES (?, ?)",
                    (rec.resolves_alert_id, rec.alert_id),
                )
                db.execute(
                    "UPDATE alerts SET firing = 0, resolved_by = ? WHERE alert_id = ?",
                    (rec.alert_id, rec.resolves_alert_id),
                )
            else:
                closed = db.execute(
                    "SELECT alert_id FROM alert_resolutions WHERE resolves_alert_id = ?",
                    (rec.alert_id,),
                ).fetchone()
                # written before its kind was ended: nothing will end it
                endless = rec.kind in _ENDED_ONLY_SINCE and not rec.ends_with_resolved
                db.execute(
                    "INSERT OR REPLACE INTO alerts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (rec.alert_id, rec.kind.value, rec.severity.value, rec.owner.value,
                     rec.execution_id, int(closed is None and not endless),
                     _ms(rec.occurred_at), body, closed[0] if closed else None),
                )  # fmt: skip
        self._derive(db, rec)
        return {"kind": kind, "id": subject, "execution_id": rec.execution_id}

    # ------------------------------------------------------------ the attention list

    def _derive(self, db: sqlite3.Connection, rec: Record) -> None:
        """Keep the attention rows of what ``rec`` changed in step with it (attention.py)."""
        # Most records make no attention row: those only remove what their source had (one
        # indexed delete), read from the stored row where an older record may have been
        # kept over ``rec``.
        if isinstance(rec, ApprovalVerdict):
            key = scoped_key(rec.execution_id, rec.request_id)
            stored = db.execute(
                "SELECT open, verdict FROM approvals WHERE row_key = ?", (key,)
            ).fetchone()
            wanted = stored is not None and stored[0] and stored[1] in att.ATTENTION_VERDICTS
            self._attention(db, "approvals", key, derive=bool(wanted))
        elif isinstance(rec, OperationState):
            # the state always replaces the row: it is the stored one (an older attempt the
            # view knows of through its work item is the work item's to bring)
            wanted = (
                rec.status.value in att.REVIEWABLE
                or (rec.held_by_status is not None and rec.held_by_status.value in att.REVIEWABLE)
                or rec.open_work_item_id is not None
            )
            key = scoped_key(rec.execution_id, rec.operation_id)
            self._attention(db, "operations", key, derive=wanted)
        elif isinstance(rec, ReconciliationWorkItem | WorkItemResolution):
            key = scoped_key(rec.execution_id, rec.work_item_id)
            stored = db.execute("SELECT open FROM work_items WHERE row_key = ?", (key,)).fetchone()
            self._attention(db, "work_items", key, derive=bool(stored and stored[0]))
            self._operation_attention(db, rec.execution_id, rec.operation_id)
        elif isinstance(rec, Alert):
            # an alert raises the severity of the rows about its subject, a RESOLVED one
            # lowers it again: their severity and next step with the alerts firing now
            subjects = {rec.subject_id}
            if rec.resolves_alert_id:
                closed = db.execute(
                    "SELECT json_extract(record, '$.subject_id') FROM alerts WHERE alert_id = ?",
                    (rec.resolves_alert_id,),
                ).fetchone()
                if closed is not None and closed[0]:
                    subjects.add(closed[0])
            for subject in subjects:
                self._raise(db, rec.execution_id, subject)

    def _operation_attention(self, db: sqlite3.Connection, execution_id: str, op: str) -> None:
        """An operation's rows derived again when one of its work items changes: when the
        operation's item lists every attempt the view knows of, a work item is how an older
        attempt becomes known, or settled."""
        key = scoped_key(execution_id, op)
        if db.execute("SELECT 1 FROM operations WHERE row_key = ?", (key,)).fetchone():
            self._attention(db, "operations", key)

    @staticmethod
    def _firing(db: sqlite3.Connection, execution_id: str, subject: str) -> list[att.FiringAlert]:
        """The alerts firing about one subject of one execution."""
        return [
            att.FiringAlert(sev, step or "", at)
            for sev, step, at in db.execute(
                "SELECT severity, json_extract(record, '$.next_step'), occurred_at_ms"
                " FROM alerts WHERE execution_id = ? AND firing = 1"
                " AND json_extract(record, '$.subject_id') = ?",
                (execution_id, subject),
            )
        ]

    def _raise(self, db: sqlite3.Connection, execution_id: str, subject: str) -> None:
        """The severity and next step of the attention rows about a subject, with the alerts
        firing about it now (attention.raised)."""
        found = db.execute(
            "SELECT row_key, kind, base_severity, base_next_step, severity, next_step"
            " FROM attention WHERE execution_id = ? AND alert_subject = ?",
            (execution_id, subject),
        ).fetchall()
        if not found:
            return
        alerts = self._firing(db, execution_id, subject)
        for key, kind, base, base_step, severity, step in found:
            new = att.raised(kind, base, base_step, alerts)
            if new != (severity, step):
                db.execute(
                    "UPDATE attention SET severity = ?, sev_rank = ?, next_step = ?"
                    " WHERE row_key = ?",
                    (new[0], att.rank(new[0]), new[1], key),
                )

    def _attention(
        self, db: sqlite3.Connection, table: str, row_key: str, derive: bool = True
    ) -> None:
        """Replace the attention rows of one approval, operation or work item row (with
        ``derive`` False: only remove them, the row makes none)."""
        source = att.source_key(table, row_key)
        db.execute("DELETE FROM attention WHERE source_key = ?", (source,))
        if not derive:
            return
        cur = db.execute(f"SELECT * FROM {table} WHERE row_key = ?", (row_key,))
        found = cur.fetchone()
        if found is None:
            return
        row = dict(zip([d[0] for d in cur.description], found, strict=True))
        item = self._item(table, row, None)
        item.pop("age_seconds", None)
        ex = row["execution_id"]

        if table == "approvals":
            rows = att.approval_rows(row_key, item, row["started_ms"])
        elif table == "operations":
            # an older attempt's age: since its first state in that status (the timeline),
            # else since its work item was opened
            since_of: dict[int, int] = {}
            for n, status in att.open_attempts(item).items():
                if n == item["attempt"]:
                    continue
                (at,) = db.execute(
                    "SELECT min(at_ms) FROM timeline WHERE execution_id = ?"
                    " AND kind = 'operation' AND subject_id = ?"
                    " AND json_extract(record, '$.attempt') = ?"
                    " AND json_extract(record, '$.status') = ?",
                    (ex, item["operation_id"], n, status),
                ).fetchone()
                if at is None:
                    (at,) = db.execute(
                        "SELECT min(created_at_ms) FROM work_items WHERE execution_id = ?"
                        " AND operation_id = ? AND json_extract(record, '$.attempt') = ?",
                        (ex, item["operation_id"], n),
                    ).fetchone()
                if at is not None:
                    since_of[n] = at
            rows = att.operation_rows(row_key, item, row["since_ms"], since_of)
        else:
            rows = att.work_item_rows(row_key, item, row["deadline_ms"])
        if not rows:
            return
        alerts = self._firing(db, ex, rows[0].alert_subject)
        rows = [r.with_alerts(alerts) for r in rows]
        db.executemany(
            "INSERT OR REPLACE INTO attention VALUES"
            " (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (r.row_key, r.source_key, r.kind, r.subject_id, r.alert_subject, r.execution_id,
                 r.operation_id, r.attempt, r.label, r.owner, r.severity, att.rank(r.severity),
                 r.connector, r.action, r.since_ms, r.due_ms, r.next_step, r.search,
                 r.base_severity, r.base_next_step)
                for r in rows
            ],
        )  # fmt: skip

    @staticmethod
    def _apply_check(db: sqlite3.Connection, rec: ReconciliationCheck) -> Change | None:
        """The reconciler's progress on a work item (its latest record, by update time; one
        read before its work item is kept until the item comes), shown with the item."""
        body = _dump(rec)
        cur = db.execute(
            "INSERT INTO reconciler_checks VALUES (?, ?, ?) ON CONFLICT (work_item_id) DO UPDATE"
            " SET updated_ms=excluded.updated_ms, record=excluded.record"
            " WHERE excluded.updated_ms >= updated_ms AND excluded.record != record",
            (rec.work_item_id, _ms(rec.updated_at), body),
        )
        if cur.rowcount == 0:
            return None  # older or the same: applied before
        db.execute(
            "UPDATE work_items SET reconciler = ? WHERE work_item_id = ?", (body, rec.work_item_id)
        )
        _refresh_attempts(db, rec.execution_id, rec.operation_id)
        return {"kind": "work_item", "id": rec.work_item_id, "execution_id": rec.execution_id}

    def execute_write(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> int:
        """One statement in its own transaction, on the writer's connection (tables of other
        console modules, e.g. a review log kept in the same file). Returns the row count."""
        with self._write_lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                cur = db.execute(sql, params)
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            return cur.rowcount

    def execute_read(
        self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()
    ) -> list[dict[str, Any]]:
        """Rows of one query as dicts, on this thread's reader connection."""
        cur = self._reader().execute(sql, params)
        names = [d[0] for d in cur.description or ()]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    # ---------------------------------------------------------------- reading

    def _as_of(self, db: sqlite3.Connection) -> dict[str, Any]:
        offsets = {
            f"{t}/{p}": n
            for t, p, n in db.execute(
                "SELECT topic, partition, next_offset FROM offsets ORDER BY topic, partition"
            )
        }
        row = db.execute("SELECT value FROM meta WHERE key = 'event_time_ms'").fetchone()
        return {
            "offsets": offsets,
            # the newest record's event time: how far the pipeline's stream time has come
            "event_time": _iso(int(row[0])) if row else None,
            # the instant ages in this answer are measured from
            "now": _iso(self._now_ms(db)),
        }

    def _now_ms(self, db: sqlite3.Connection) -> int:
        """Now, on the wall clock: an age is how long something has lasted until now, which
        goes on while the fleet is quiet (the newest record's event time would stand
        still)."""
        return int(self._clock() * 1000)

    def as_of(self) -> dict[str, Any]:
        return self._as_of(self._reader())

    def query(self, name: str, params: Mapping[str, str]) -> Page:
        """One page of a list, from query-string parameters (all text, as given), with the
        number of rows the filters select (``total``: the page never hides that there are
        more)."""
        spec = LISTS.get(name)
        if spec is None:
            raise QueryError(f"no list {name!r}", {"lists": list(LISTS)})
        allowed = spec.allowed()
        common = {"limit", "cursor", "sort"}
        unknown = sorted(k for k in params if k not in spec.filters and k not in common)
        if unknown:
            raise QueryError(f"unknown parameter(s): {', '.join(map(repr, unknown))}", allowed)
        limit_text = params.get("limit", str(DEFAULT_LIMIT))
        try:
            limit = int(limit_text) if len(limit_text) <= 8 else -1
        except ValueError:
            limit = -1
        if not 1 <= limit <= MAX_LIMIT:
            raise QueryError(f"limit: want an integer in 1..{MAX_LIMIT}", allowed)
        sort = params.get("sort", spec.default_sort)
        if sort not in spec.sorts:
            raise QueryError(f"sort: unknown value {sort[:40]!r}", allowed)
        columns = spec.columns(sort)
        desc = spec.sorts[sort][1]
        where: list[str] = []
        args: list[Any] = []
        for fname, f in spec.filters.items():
            value = params.get(fname, spec.defaults.get(fname))
            if value is None:
                continue
            if f.values is not None:
                if value not in f.values:
                    raise QueryError(f"{fname}: unknown value {value[:40]!r}", allowed)
                if fname == "status" and spec.name == "alerts":
                    where.append("firing = ?")
                    args.append(int(value == "FIRING"))
                elif fname == "status" and spec.name == "operations":
                    where.append(f"(status = ? OR {_BLOCKING} AND status = ?))")
                    args += [value, value]
                else:
                    where.append(f"{f.column} = ?")
                    args.append(value)
            elif f.kind == "bool":
                if value not in ("true", "false"):
                    raise QueryError(f"{fname}: want true or false", allowed)
                if fname == "blocking" and spec.name == "operations":
                    where.append(("" if value == "true" else "NOT ") + _BLOCKING + ")")
                    continue
                where.append(f"{f.column} = ?")
                args.append(int(value == "true"))
            elif f.kind == "time_before":
                where.append(f"{f.column} < ?")
                args.append(_parse_time(fname, value, allowed))
            elif f.kind == "time_after":
                where.append(f"{f.column} >= ?")
                args.append(_parse_time(fname, value, allowed))
            elif f.kind == "search":
                text = _text_ok(fname, value, allowed).strip().lower()
                if text:
                    where.append(
                        "(" + " OR ".join(f"instr(lower({c}), ?) > 0" for c in f.columns) + ")"
                    )
                    args += [text] * len(f.columns)
            else:
                where.append(f"{f.column} = ?")
                args.append(_text_ok(fname, value, allowed))
        db = self._reader()
        db.execute("BEGIN")  # one snapshot for the rows, their count and their as_of
        try:
            now = self._now_ms(db)
            if spec.due_column is not None:
                where.append(f"{spec.due_column} <= ?")
                args.append(now)
            filtered = list(where)
            filtered_args = list(args)
            if "cursor" in params:
                value, ident = decode_cursor(params["cursor"], sort, allowed)
                values = value if isinstance(value, tuple) else (value,)
                if len(values) != len(columns):
                    raise QueryError("cursor: not a cursor this console gave out", allowed)
                op = "<" if desc else ">"
                # a row value: SQLite seeks the index to the cursor instead of scanning to it
                where.append(f"({', '.join(columns)}, {spec.id_column}) {op} "
                             f"({', '.join('?' * (len(columns) + 1))})")  # fmt: skip
                args += [*values, ident]
            order = "DESC" if desc else "ASC"
            clause = f" WHERE {' AND '.join(where)}" if where else ""
            sql = (
                f"SELECT {', '.join(columns)}, {spec.id_column}, * FROM {spec.table}{clause}"
                f" ORDER BY {', '.join(f'{c} {order}' for c in columns)},"
                f" {spec.id_column} {order} LIMIT ?"
            )
            cur = db.execute(sql, [*args, limit + 1])
            names = [d[0] for d in cur.description or ()]
            rows = cur.fetchall()
            count_clause = f" WHERE {' AND '.join(filtered)}" if filtered else ""
            (total,) = db.execute(
                f"SELECT count(*) FROM {spec.table}{count_clause}", filtered_args
            ).fetchone()
            more = len(rows) > limit
            rows = rows[:limit]
            n = len(columns)
            found = [dict(zip(names[n + 1 :], r[n + 1 :], strict=True)) for r in rows]
            if spec.source_column is not None and found:
                wanted: dict[str, set[str]] = {}
                for f in found:
                    table, _, key = f[spec.source_column].partition("|")
                    wanted.setdefault(table, set()).add(key)
                sources: dict[str, dict[str, Any]] = {}
                for table, keys in wanted.items():
                    if table not in _SOURCE_TABLES:
                        continue
                    cur = db.execute(
                        f"SELECT * FROM {table} WHERE row_key IN ({', '.join('?' * len(keys))})",
                        sorted(keys),
                    )
                    cols = [d[0] for d in cur.description or ()]
                    for r in cur:
                        src = dict(zip(cols, r, strict=True))
                        sources[f"{table}|{src['row_key']}"] = self._item(table, src, now)
                for f in found:
                    f["source"] = sources.get(f[spec.source_column], {})
            as_of = self._as_of(db)
        finally:
            db.execute("COMMIT")
        items = [self._item(spec.table, f, now) for f in found]
        next_cursor = None
        if more and rows:
            last = rows[-1]
            key: CursorValue = last[0] if n == 1 else tuple(last[:n])
            next_cursor = encode_cursor(sort, key, last[n])
        return Page(items, next_cursor, as_of, total)

    @staticmethod
    def _item(table: str, row: dict[str, Any], now: int | None) -> dict[str, Any]:
        if table == "attention":
            return ConsoleView._attention_item(row, now)
        item: dict[str, Any] = json.loads(row["record"])
        if table == "operations":
            item["owner"] = row["owner"]
            # every attempt the view knows of (streams/console/attempts.py)
            item["attempts"] = json.loads(row["attempts"]) if row.get("attempts") else []
            item["blocking"] = any(a["blocks_retry"] for a in item["attempts"])
        elif table == "approvals":
            item["open"] = bool(row["open"])
            item["started_at"] = _iso(row["started_ms"])
            item["age_seconds"] = (
                max(0.0, (now - row["started_ms"]) / 1000) if now is not None else None
            )
        elif table == "work_items":
            item["open"] = bool(row["open"])
            item["next_step"] = work_item_next_step(WorkItemKind(item["kind"]))
            item["resolution"] = json.loads(row["resolution"]) if row["resolution"] else None
            # vigil reconcile's checks of the item, their outcomes and the next one due
            item["reconciler"] = json.loads(row["reconciler"]) if row["reconciler"] else None
        elif table == "alerts":
            item["firing"] = bool(row["firing"])
            item["resolved_by"] = row["resolved_by"]
        elif table == "executions":
            pass
        return item

    @staticmethod
    def _attention_item(row: dict[str, Any], now: int | None) -> dict[str, Any]:
        """A row of the attention list, with the row it comes from (``record``, as its own
        list gives it; for an attempt, whether it is an older one holding the retry verdict)."""
        record = dict(row.get("source") or {})
        record.pop("age_seconds", None)
        if row["kind"] == "operation" and record:
            record["holds_retry"] = record.get("attempt") != row["attempt"]
            record["attempt_status"] = row["label"]
        return {
            "kind": row["kind"],
            "subject_id": row["subject_id"],
            "execution_id": row["execution_id"],
            "operation_id": row["operation_id"],
            "attempt": row["attempt"],
            "label": row["label"],
            "owner": row["owner"],
            "severity": row["severity"],
            "connector": row["connector"],
            "action": row["action"],
            "since": _iso(row["since_ms"]),
            "age_seconds": (max(0.0, (now - row["since_ms"]) / 1000) if now is not None else None),
            "next_step": row["next_step"],
            "record": record,
        }

    def execution(self, execution_id: str) -> dict[str, Any] | None:
        """One execution with its operations, approvals, work items and alerts; None when the
        view has nothing about it."""
        _text_ok("execution_id", execution_id, {})
        db = self._reader()
        db.execute("BEGIN")
        try:
            now = self._now_ms(db)
            out: dict[str, Any] = {"execution_id": execution_id}
            found = False
            for key, table, order in (
                ("execution", "executions", "since_ms"),
                ("operations", "operations", "since_ms, operation_id"),
                ("approvals", "approvals", "started_ms, request_id"),
                ("work_items", "work_items", "deadline_ms, work_item_id, row_key"),
                ("alerts", "alerts", "occurred_at_ms, alert_id"),
            ):
                cur = db.execute(
                    f"SELECT * FROM {table} WHERE execution_id = ? ORDER BY {order}",
                    (execution_id,),
                )
                names = [d[0] for d in cur.description or ()]
                items = [self._item(table, dict(zip(names, r, strict=True)), now) for r in cur]
                found = found or bool(items)
                out[key] = (items[0] if items else None) if key == "execution" else items
            out["as_of"] = self._as_of(db)
        finally:
            db.execute("COMMIT")
        return out if found else None

    def timeline(self, execution_id: str) -> dict[str, Any] | None:
        """Every applied record about an execution, in event-time order."""
        _text_ok("execution_id", execution_id, {})
        db = self._reader()
        db.execute("BEGIN")
        try:
            rows = db.execute(
                "SELECT at_ms, kind, subject_id, summary, record, record_id FROM timeline"
                " WHERE execution_id = ? ORDER BY at_ms, topic, partition, offset",
                (execution_id,),
            ).fetchall()
            as_of = self._as_of(db)
        finally:
            db.execute("COMMIT")
        if not rows:
            return None
        items = [
            {
                "at": _iso(at),
                "kind": kind,
                "id": subject,
                "record_id": rid,
                "summary": summary,
                "record": json.loads(body),
            }
            for at, kind, subject, summary, body, rid in rows
        ]
        return {"execution_id": execution_id, "items": items, "as_of": as_of}

    def attempts(self, execution_id: str, operation_id: str) -> dict[int, OperationStatus]:
        """The status of every attempt of one operation the view knows of
        (``streams/console/attempts.py``), by attempt number."""
        rows = self._reader().execute(
            "SELECT attempt, status FROM attempts WHERE op_row_key = ?",
            (scoped_key(execution_id, operation_id),),
        )
        return {n: OperationStatus(status) for n, status in rows}

    def summary(self) -> dict[str, Any]:
        """Counts for a header: open approval waits per verdict, operations per status (of
        their latest attempt), attempts still blocking a retry per status and the operations
        that have one, executions per status (in flight and terminal), open work items,
        firing alerts per severity."""
        db = self._reader()
        db.execute("BEGIN")
        try:

            def counts(sql: str) -> dict[str, int]:
                return {k: n for k, n in db.execute(sql)}

            out = {
                "approvals_open_by_verdict": counts(
                    "SELECT verdict, count(*) FROM approvals WHERE open = 1 GROUP BY verdict"
                ),
                "operations_by_status": counts(
                    "SELECT status, count(*) FROM operations GROUP BY status"
                ),
                "executions_by_status": counts(
                    "SELECT status, count(*) FROM executions GROUP BY status"
                ),
                "executions_in_flight": db.execute(
                    "SELECT count(*) FROM executions WHERE terminal = 0"
                ).fetchone()[0],
                "work_items_open": db.execute(
                    "SELECT count(*) FROM work_items WHERE open = 1"
                ).fetchone()[0],
                # every attempt still blocking a retry, by its status: attempt 1 UNKNOWN under
                # a VERIFIED attempt 2 is one UNKNOWN here (operations_by_status counts the
                # latest attempts), and the operations with at least one such attempt
                "attempts_blocking_by_status": counts(
                    "SELECT status, count(*) FROM attempts WHERE blocks_retry = 1 GROUP BY status"
                ),
                "operations_blocking": db.execute(
                    "SELECT count(DISTINCT op_row_key) FROM attempts WHERE blocks_retry = 1"
                ).fetchone()[0],
                "alerts_firing_by_severity": counts(
                    "SELECT severity, count(*) FROM alerts WHERE firing = 1 GROUP BY severity"
                ),
                "as_of": self._as_of(db),
            }
        finally:
            db.execute("COMMIT")
        return out
