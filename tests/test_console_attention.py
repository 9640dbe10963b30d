"""The console's attention list and what the lists answer at fleet scale, without Kafka: which
rows the view derives (and drops) as records arrive, their severity and next step, the work
item that joins the list at its deadline, a file from before the list, counts, the text
search, and keyset cursors over several sort columns (hypothesis)."""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streams.console import attention as att
from streams.console.view import LISTS, ConsoleView, Incoming, QueryError, decode_cursor
from streams.contracts.models.enums import (
    AlertKind,
    AlertStatus,
    ApprovalVerdictCode,
    OperationStatus,
    Owner,
    RetryVerdict,
    Severity,
    WorkItemKind,
)
from streams.contracts.models.outputs import (
    Alert,
    ApprovalVerdict,
    OperationState,
    ReconciliationWorkItem,
    Thresholds,
    WorkItemResolution,
)
from streams.core.alerts import ACTIONABLE
from tests.test_console_view import DEMO, NOW, T0, frozen

TOPIC = "vigil.any"


def feed(v: ConsoleView, *records: Any) -> None:
    start = sum(v.positions().values())
    v.apply([Incoming(TOPIC, 0, start + i, r) for i, r in enumerate(records)])


def rows(v: ConsoleView, **params: str) -> list[dict[str, Any]]:
    return v.query("attention", {"limit": "500", **params}).items


def state(attempt: int, status: OperationStatus, **kw: Any) -> OperationState:
    return OperationState(
        operation_id="op-1",
        execution_id="ex-1",
        attempt=attempt,
        connector="payments",
        status=status,
        retry=RetryVerdict.FORBIDDEN,
        since=T0 + timedelta(minutes=attempt),
        state_id=f"s-{attempt}-{status}-{sorted(kw.items())}",
        **kw,
    )


def firing(alert_id: str, subject: str, severity: Severity, **kw: Any) -> Alert:
    return Alert(
        alert_id=alert_id,
        kind=kw.pop("kind", AlertKind.FORBIDDEN_RETRY),
        status=AlertStatus.FIRING,
        severity=severity,
        execution_id="ex-1",
        subject_id=subject,
        owner=Owner.RUNTIME_OWNER,
        next_step=kw.pop("next_step", "stop the duplicate"),
        occurred_at=T0,
        ends_with_resolved=kw.pop("ends_with_resolved", True),  # as vigil writes them
        **kw,
    )


@pytest.fixture
def view(tmp_path: Path) -> ConsoleView:
    v = ConsoleView(tmp_path / "console.sqlite3", clock=frozen)
    yield v
    v.close()


def test_the_demo_attention_list(view: ConsoleView) -> None:
    view.apply(DEMO)
    got = rows(view)
    approvals = [r for r in got if r["kind"] == "approval"]
    open_waits = view.query("approvals", {"open": "true", "limit": "500"}).items
    assert {a["subject_id"] for a in approvals} == {
        a["request_id"] for a in open_waits if a["verdict"] in att.ATTENTION_VERDICTS
    }
    for a in approvals:  # the severity vigil alerts the verdict with
        assert a["severity"] == ACTIONABLE[ApprovalVerdictCode(a["label"])].value
        assert a["next_step"] == a["record"]["next_step"]
    unknown = view.query("operations", {"status": "UNKNOWN"}).items
    ops = [r for r in got if r["kind"] == "operation"]
    # one row per attempt UNKNOWN or under review, older attempts that block a retry included
    assert sorted((o["subject_id"], o["attempt"]) for o in ops) == sorted(
        (u["operation_id"], a["attempt"])
        for u in unknown
        for a in u["attempts"]
        if a["status"] in ("UNKNOWN", "MANUAL_REVIEW")
    )
    # the forbidden retry's CRITICAL alert raises the operation's rows, and names the step
    assert ops[0]["severity"] == "CRITICAL" and ops[0]["next_step"].startswith("stop the")
    items = [r for r in got if r["kind"] == "work_item"]
    assert {i["subject_id"] for i in items} == {
        w["work_item_id"] for w in view.query("work-items", {}).items
    }
    assert all(i["label"].startswith("OVERDUE ") and i["owner"] == "CONNECTOR_OWNER" for i in items)
    # severity, then age: every CRITICAL first, each group the oldest first
    keys = [(att.rank(r["severity"]), r["since"]) for r in got]
    assert keys == sorted(keys)
    assert view.query("attention", {}).total == len(got)


def test_an_older_attempt_holding_the_retry_verdict_is_a_row_of_its_own(view) -> None:
    feed(view, state(1, OperationStatus.UNKNOWN))
    assert [(r["attempt"], r["label"]) for r in rows(view)] == [(1, "UNKNOWN")]
    # attempt 2 sent and verified: attempt 1 still UNKNOWN, named by held_by_*
    feed(
        view,
        state(2, OperationStatus.VERIFIED, held_by_operation_id="op-1", held_by_attempt=1,
              held_by_status=OperationStatus.UNKNOWN),
    )  # fmt: skip
    (row,) = rows(view)
    assert (row["attempt"], row["label"], row["record"]["holds_retry"]) == (1, "UNKNOWN", True)
    # its age: since it became UNKNOWN (the timeline), not since attempt 2's state
    assert row["since"] == (T0 + timedelta(minutes=1)).isoformat()
    # both open: two rows; attempt 1 settled: none
    feed(
        view,
        state(2, OperationStatus.MANUAL_REVIEW, held_by_operation_id="op-1", held_by_attempt=1,
              held_by_status=OperationStatus.UNKNOWN),
    )  # fmt: skip
    assert sorted(r["attempt"] for r in rows(view)) == [1, 2]
    feed(view, state(2, OperationStatus.VERIFIED))
    assert rows(view) == []
    # an older attempt of another operation holding this one's verdict is not this row's
    feed(
        view,
        state(3, OperationStatus.VERIFIED, held_by_operation_id="op-other", held_by_attempt=1,
              held_by_status=OperationStatus.UNKNOWN),
    )  # fmt: skip
    assert rows(view) == []


def test_alerts_raise_the_severity_and_their_end_lowers_it(view: ConsoleView) -> None:
    feed(view, state(1, OperationStatus.UNKNOWN))
    assert rows(view)[0]["severity"] == "WARNING"
    feed(view, firing("a-1", "op-1", Severity.CRITICAL, next_step="stop the duplicate"))
    (row,) = rows(view)
    assert (row["severity"], row["next_step"]) == ("CRITICAL", "stop the duplicate")
    assert rows(view, severity="CRITICAL") == [row]
    # an alert about another subject changes nothing
    feed(view, firing("a-2", "op-2", Severity.CRITICAL))
    ended = Alert(
        alert_id="a-1-end",
        kind=AlertKind.FORBIDDEN_RETRY,
        status=AlertStatus.RESOLVED,
        severity=Severity.INFO,
        execution_id="ex-1",
        subject_id="op-1",
        owner=Owner.RUNTIME_OWNER,
        next_step="none",
        occurred_at=T0 + timedelta(minutes=5),
        resolves_alert_id="a-1",
    )
    feed(view, ended)
    (row,) = rows(view)
    assert (
        row["severity"] == "WARNING"
        and row["next_step"] == "reconcile against the source; do not retry"
    )


def _item(deadline: Any, **kw: Any) -> ReconciliationWorkItem:
    return ReconciliationWorkItem(
        work_item_id="wi-1",
        operation_id="op-1",
        execution_id="ex-1",
        attempt=1,
        connector="payments",
        kind=kw.pop("kind", WorkItemKind.VERIFICATION_TIMEOUT),
        deadline=deadline,
        created_at=T0,
    )


def test_a_work_item_joins_the_list_at_its_deadline_and_leaves_it_resolved(tmp_path) -> None:
    clock = [NOW.timestamp()]
    v = ConsoleView(tmp_path / "c.sqlite3", clock=lambda: clock[0])
    feed(v, _item(NOW + timedelta(minutes=10)))
    assert rows(v) == [] and v.query("attention", {}).total == 0
    clock[0] += 11 * 60
    (row,) = rows(v)
    assert row["label"] == "OVERDUE VERIFICATION_TIMEOUT"
    assert row["next_step"] == "verify the effect at the source; do not retry"
    assert row["age_seconds"] == 60.0
    feed(
        v,
        WorkItemResolution(
            resolution_id="r-1", work_item_id="wi-1", operation_id="op-1", execution_id="ex-1",
            attempt=1, outcome=OperationStatus.VERIFIED, evidence_source="HUMAN",
            resolved_at=NOW,
        ),
    )  # fmt: skip
    assert rows(v) == []
    v.close()


def test_a_file_from_before_the_list_gets_it_derived(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    v = ConsoleView(path, clock=frozen)
    v.apply(DEMO)
    expected = rows(v)
    v.close()
    db = sqlite3.connect(path)
    db.execute("DROP TABLE attention")
    db.commit()
    db.close()
    again = ConsoleView(path, clock=frozen)
    assert rows(again) == expected and expected
    assert again.derive_attention() == len(expected)
    assert rows(again) == expected
    again.close()


def test_search_total_and_the_lists_description(view: ConsoleView) -> None:
    view.apply(DEMO)
    every = rows(view)
    refund = view.query("attention", {"q": "REFUND"})
    assert (
        refund.total
        == len(refund.items)
        == sum("refund" in r["execution_id"] or "refund" in r["subject_id"] for r in every)
    )
    # the refund's two attempts, each UNKNOWN or under review: one row each
    assert view.query("attention", {"q": "payments", "kind": "operation"}).total == 2
    assert view.query("executions", {"q": "sms"}).items[0]["execution_id"] == "exec-sms-reminder"
    assert view.query("alerts", {"q": "req-deploy"}).total == 1  # by its subject
    page = view.query("attention", {"limit": "2"})
    assert page.total == len(every) and len(page.items) == 2 and page.next_cursor
    later = view.query("attention", {"limit": "2", "cursor": page.next_cursor})
    assert later.total == len(every)  # every page counts the whole list
    assert LISTS["attention"].describe()["default_sort"] == "severity"
    for name, spec in LISTS.items():
        d = spec.describe()
        assert d["path"] == f"/api/{name}" and "q" in d["allowed"]
    with pytest.raises(QueryError, match="q: longer"):
        view.query("attention", {"q": "x" * 300})
    with pytest.raises(QueryError, match="cursor"):  # a one-column cursor on a two-column sort
        view.query(
            "attention",
            {"cursor": view.query("attention", {"sort": "age", "limit": "1"}).next_cursor},
        )
    value, _ = decode_cursor(page.next_cursor, "severity", {})
    assert isinstance(value, tuple) and len(value) == 2


def _approval(i: int, verdict: ApprovalVerdictCode, start: int) -> ApprovalVerdict:
    at = T0 + timedelta(minutes=start + 1)
    return ApprovalVerdict(
        verdict_id=f"v{i}",
        request_id=f"req-{i:03d}",
        execution_id=f"ex-{i % 5}",
        verdict=verdict,
        owner=Owner.RUNTIME_OWNER if i % 2 else Owner.POLICY_OWNER,
        next_step="step",
        thresholds=Thresholds(
            grace_ms=1, heartbeat_fresh_ms=1, delivery_deadline_ms=1, evaluated_at=at
        ),
        evaluated_at=at,
        requested_at=T0 + timedelta(minutes=start),
    )


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    made=st.lists(st.tuples(st.sampled_from(list(ACTIONABLE)), st.integers(0, 3)), max_size=30),
    limit=st.integers(1, 7),
    sort=st.sampled_from(list(LISTS["attention"].sorts)),
    owner=st.none() | st.sampled_from(["RUNTIME_OWNER", "POLICY_OWNER"]),
)
def test_cursors_walk_every_attention_row_once_in_order(tmp_path_factory, made, limit, sort, owner):
    v = ConsoleView(tmp_path_factory.mktemp("walk") / "v.sqlite3", clock=frozen)
    v.apply([Incoming(TOPIC, 0, i, _approval(i, *m)) for i, m in enumerate(made)])
    params = {"limit": str(limit), "sort": sort} | ({"owner": owner} if owner else {})
    seen: list[dict[str, Any]] = []
    cursor = None
    for _ in range(len(made) + 2):
        page = v.query("attention", params | ({"cursor": cursor} if cursor else {}))
        seen += page.items
        cursor = page.next_cursor
        if cursor is None:
            break
    want = {
        f"req-{i:03d}"
        for i, _ in enumerate(made)
        if owner is None
        or ((i % 2 and owner == "RUNTIME_OWNER") or (not i % 2 and owner == "POLICY_OWNER"))
    }
    ids = [r["subject_id"] for r in seen]
    assert len(ids) == len(set(ids)) and set(ids) == want
    assert page.total == len(want)
    key = {
        "severity": lambda r: (att.rank(r["severity"]), r["since"]),
        "age": lambda r: (r["since"],),
        "-age": lambda r: (r["since"],),
    }[sort]
    keys = [key(r) for r in seen]
    assert keys == sorted(keys, reverse=sort == "-age")
    v.close()


def test_open_attempts_from_the_state_or_from_every_known_attempt() -> None:
    base = {"operation_id": "op-1", "execution_id": "ex-1", "attempt": 3, "status": "VERIFIED"}
    held = base | {
        "held_by_operation_id": "op-1",
        "held_by_attempt": 1,
        "held_by_status": "UNKNOWN",
    }
    assert att.open_attempts(held) == {1: "UNKNOWN"}
    assert att.open_attempts(held | {"held_by_execution_id": "ex-other"}) == {}
    assert att.open_attempts(base | {"status": "MANUAL_REVIEW"}) == {3: "MANUAL_REVIEW"}
    # an operation's item that lists every attempt the view knows of: those, not held_by
    known = held | {
        "attempts": [
            {"attempt": 1, "status": "UNKNOWN", "blocks_retry": True},
            {"attempt": 2, "status": "MANUAL_REVIEW", "blocks_retry": True},
            {"attempt": 3, "status": "VERIFIED", "blocks_retry": False},
        ]
    }
    assert att.open_attempts(known) == {1: "UNKNOWN", 2: "MANUAL_REVIEW"}
    rows = att.operation_rows("ex-1/op-1", known, 1_000, {1: 10, 2: 20})
    assert [(r.attempt, r.label, r.since_ms) for r in rows] == [
        (1, "UNKNOWN", 10),
        (2, "MANUAL_REVIEW", 20),
    ]
    assert {r.row_key for r in rows} == {"operation|ex-1/op-1|1", "operation|ex-1/op-1|2"}
