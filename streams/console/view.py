"""The console's view: vigil's output records applied to an SQLite file, and the queries on it.

The view is a cache of the output topics, nothing more: every row can be rebuilt by reading
the topics again. What makes it safe to keep across restarts is that the position read in
each partition (``offsets``) is written in the same SQLite transaction as the rows the
records produced: after a crash the file holds either a batch and its positions, or neither,
so the consumer resumes exactly after the last record applied. Applying is idempotent twice
over: a record at an offset below the stored position is skipped, and a record whose id
(``state_id``, ``verdict_id``, ``work_item_id``, ``resolution_id``, ``alert_id``) was
applied before is skipped too (a worker may publish the same record again after a restart).

Nothing here talks to Kafka or reads a clock: the service feeds ``apply`` decoded records and
queries answer from the file. Ages are measured against the latest event time applied (the
view's own clock), so two replicas with the same offsets give the same answers.
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

from streams.console.attempts import WorkItem, derive
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
    kind: str = "text"  # text | bool | time_before | time_after


@dataclass(frozen=True)
class ListSpec:
    name: str
    table: str
    id_column: str
    sorts: Mapping[str, tuple[str, bool]]  # name -> (column, descending)
    default_sort: str
    filters: Mapping[str, Filter]
    #: filters applied when the query does not name them
    defaults: Mapping[str, str] = field(default_factory=dict)

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
            else:
                out[name] = f"text, at most {MAX_TEXT} characters"
        return out


def _names(enum: Any) -> tuple[str, ...]:
    return tuple(m.value for m in enum)


_OWNERS = _names(Owner)
LISTS: dict[str, ListSpec] = {
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
        },
    ),
    "alerts": ListSpec(
        "alerts",
        "alerts",
        "alert_id",
        {"occurred_at": ("occurred_at_ms", False), "-occurred_at": ("occurred_at_ms", True)},
        "occurred_at",
        {
            # FIRING: not closed by a later RESOLVED alert; RESOLVED: closed
            "status": Filter("firing", ("FIRING", "RESOLVED")),
            "owner": Filter("owner", _OWNERS),
            "severity": Filter("severity", _names(Severity)),
            "kind": Filter("kind", _names(AlertKind)),
            "execution_id": Filter("execution_id"),
        },
        {"status": "FIRING"},
    ),
}


def encode_cursor(sort: str, value: int, ident: str) -> str:
    raw = json.dumps({"s": sort, "v": value, "id": ident}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(text: str, sort: str, allowed: Mapping[str, Any]) -> tuple[int, str]:
    """The (sort value, id) a cursor resumes after; a QueryError for anything else."""
    try:
        padded = text + "=" * (-len(text) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
    except (ValueError, binascii.Error, UnicodeError, RecursionError):
        raise QueryError("cursor: not a cursor this console gave out", allowed) from None
    if not isinstance(data, dict) or set(data) != {"s", "v", "id"}:
        raise QueryError("cursor: not a cursor this console gave out", allowed)
    value, ident = data["v"], data["id"]
    if type(value) is not int or not isinstance(ident, str) or abs(value) > 2**62:
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

    def to_json(self) -> dict[str, Any]:
        return {"items": self.items, "next_cursor": self.next_cursor, "as_of": self.as_of}


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
        db.executescript(_SCHEMA)
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

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
            return self._apply_check(db, rec)
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
        return {"kind": kind, "id": subject, "execution_id": rec.execution_id}

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
        """One page of a list, from query-string parameters (all text, as given)."""
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
        column, desc = spec.sorts[sort]
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
            else:
                where.append(f"{f.column} = ?")
                args.append(_text_ok(fname, value, allowed))
        if "cursor" in params:
            value, ident = decode_cursor(params["cursor"], sort, allowed)
            op = "<" if desc else ">"
            where.append(f"({column} {op} ? OR ({column} = ? AND {spec.id_column} {op} ?))")
            args += [value, value, ident]
        order = "DESC" if desc else "ASC"
        sql = (
            f"SELECT {column}, {spec.id_column}, * FROM {spec.table}"
            + (f" WHERE {' AND '.join(where)}" if where else "")
            + f" ORDER BY {column} {order}, {spec.id_column} {order} LIMIT ?"
        )
        db = self._reader()
        db.execute("BEGIN")  # one snapshot for the rows and their as_of
        try:
            cur = db.execute(sql, [*args, limit + 1])
            names = [d[0] for d in cur.description or ()]
            rows = cur.fetchall()
            as_of = self._as_of(db)
            now = self._now_ms(db)
        finally:
            db.execute("COMMIT")
        more = len(rows) > limit
        rows = rows[:limit]
        items = [
            self._item(spec.table, dict(zip(names[2:], r[2:], strict=True)), now) for r in rows
        ]
        next_cursor = encode_cursor(sort, rows[-1][0], rows[-1][1]) if more and rows else None
        return Page(items, next_cursor, as_of)

    @staticmethod
    def _item(table: str, row: dict[str, Any], now: int | None) -> dict[str, Any]:
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
