"""The console's SQLite view, without Kafka: the demo scenario's real outputs (from the pure
Processor) applied, the queries and their filters, keyset cursors, idempotence, and the
offsets kept in the same transaction as the rows."""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streams.console.view import (
    LISTS,
    MAX_LIMIT,
    ConsoleView,
    Incoming,
    QueryError,
    decode_cursor,
    encode_cursor,
)
from streams.contracts.keys import scoped_key
from streams.contracts.models.enums import ApprovalVerdictCode, Owner, WorkItemKind
from streams.contracts.models.events import ClockTick
from streams.contracts.models.outputs import (
    Alert,
    ApprovalVerdict,
    ExecutionState,
    OperationState,
    ReconciliationWorkItem,
    Thresholds,
    WorkItemResolution,
)
from streams.core.approvals import to_verdict
from streams.engine.processor import Processor, Stores
from streams.kafka.partitioning import partition_of
from streams.local.scenario import REFERENCE_AT, Tick, demo_scenario
from tests.test_processor import TOPICS, env

CONSOLE_TOPICS = {
    TOPICS.execution_state.name,
    TOPICS.operation_state.name,
    TOPICS.approval_verdicts.name,
    TOPICS.reconciliation_work.name,
    TOPICS.alerts.name,
}
T0 = datetime(2026, 7, 26, 16, 0, tzinfo=UTC)


def demo_outputs() -> list[Incoming]:
    """The demo scenario through the pure Processor; the console topics' records with the
    partitions and offsets a broker would give them."""
    proc = Processor(TOPICS, Stores())
    emissions = []
    for s in demo_scenario():
        if isinstance(s, Tick):
            for spec in TOPICS.inputs():
                for p in range(3):
                    tick = ClockTick(ticker_id="t", partition=p, occurred_at=s.at)
                    emissions += proc.handle(env(tick, spec.name, key="", partition=p))
        else:
            emissions += proc.handle(env(s))
    offsets: dict[tuple[str, int], int] = {}
    out = []
    for e in emissions:
        if e.topic not in CONSOLE_TOPICS:
            continue
        p = partition_of(e.key or "", 3)
        o = offsets.get((e.topic, p), 0)
        offsets[(e.topic, p)] = o + 1
        out.append(Incoming(e.topic, p, o, e.record))
    return out


DEMO = demo_outputs()
#: the views' wall clock in these tests: an hour after the scenario's reference time
NOW = REFERENCE_AT + timedelta(hours=1)


def frozen() -> float:
    return NOW.timestamp()


@pytest.fixture
def view(tmp_path: Path) -> ConsoleView:
    v = ConsoleView(tmp_path / "console.sqlite3", clock=frozen)
    yield v
    v.close()


def everything(v: ConsoleView) -> dict[str, Any]:
    """Every answer of the view that does not depend on how it was filled."""
    out: dict[str, Any] = {"summary": v.summary()}
    for name in LISTS:
        params = {"limit": str(MAX_LIMIT)}
        if name == "work-items":
            params["open"] = "false"
        out[name] = v.query(name, params).to_json()
        if name == "work-items":
            out["work-items-open"] = v.query(name, {"limit": str(MAX_LIMIT)}).to_json()
        if name == "alerts":
            out["alerts-resolved"] = v.query(name, {"status": "RESOLVED", "limit": "500"}).items
    ids = {i["execution_id"] for i in out["executions"]["items"]}
    for ex in sorted(ids):
        out[f"ex:{ex}"] = v.execution(ex)
        out[f"tl:{ex}"] = v.timeline(ex)
    return out


# ------------------------------------------------------------------ the demo in the view


def test_demo_stuck_approval_and_unknown_operation(view: ConsoleView) -> None:
    view.apply(DEMO)
    stuck = view.query("approvals", {"verdict": "STUCK_AFTER_DECISION"}).items
    assert [a["request_id"] for a in stuck] == ["req-deploy"]
    (a,) = stuck
    assert a["owner"] == "RUNTIME_OWNER" and a["next_step"] and a["open"] is True
    assert a["action"] is not None and a["requested_at"] is not None
    assert a["age_seconds"] > 0 and a["failed_proofs"]
    (op,) = view.query("operations", {"status": "UNKNOWN"}).items
    assert op["operation_id"] == "op-refund-1" and op["owner"] == "CONNECTOR_OWNER"
    assert op["retry"] == "FORBIDDEN"
    # op-sms-1 went UNKNOWN, then was verified: its work item is resolved, its alert closed
    sms = view.execution("exec-sms-reminder")
    assert sms is not None
    assert [o["status"] for o in sms["operations"]] == ["VERIFIED"]
    (wi,) = sms["work_items"]
    assert wi["open"] is False and wi["resolution"]["outcome"] == "VERIFIED"
    open_items = view.query("work-items", {}).items
    assert {w["operation_id"] for w in open_items} == {"op-refund-1"}
    assert all(w["next_step"] for w in open_items)
    deadlines = [w["deadline"] for w in open_items]
    assert deadlines == sorted(deadlines)
    firing = view.query("alerts", {}).items
    assert {f["subject_id"] for f in firing} >= {"req-deploy", "op-refund-1"}
    assert all(f["firing"] for f in firing)
    assert not any(
        f["subject_id"] == "op-sms-1" and f["kind"] == "OPERATION_UNKNOWN" for f in firing
    )
    summary = view.summary()
    assert summary["approvals_open_by_verdict"]["STUCK_AFTER_DECISION"] == 1
    assert summary["operations_by_status"]["UNKNOWN"] == 1
    assert summary["executions_by_status"]["COMPLETED"] == 1
    # as_of: every partition read, and the latest event time applied
    as_of = summary["as_of"]
    assert as_of["event_time"] is not None
    latest = max(getattr(i.record, i.record.time_field) for i in DEMO)
    assert datetime.fromisoformat(as_of["event_time"]) == latest
    last = {}
    for i in DEMO:
        last[f"{i.topic}/{i.partition}"] = i.offset + 1
    assert as_of["offsets"] == last


def test_timeline_in_event_time_order(view: ConsoleView) -> None:
    view.apply(DEMO)
    tl = view.timeline("exec-sms-reminder")
    assert tl is not None
    times = [datetime.fromisoformat(i["at"]) for i in tl["items"]]
    assert times == sorted(times)
    kinds = {i["kind"] for i in tl["items"]}
    assert kinds == {"execution", "operation", "work_item", "alert"}
    assert view.timeline("no-such-execution") is None
    assert view.execution("no-such-execution") is None


def test_approvals_by_action_owner_and_age(view: ConsoleView) -> None:
    view.apply(DEMO)
    rows = view.query("approvals", {"limit": "500"}).items
    assert rows, "the demo has approvals"
    ages = [r["age_seconds"] for r in rows]
    assert ages == sorted(ages, reverse=True), "default: the oldest wait first"
    young = view.query("approvals", {"sort": "age", "limit": "500"}).items
    assert [r["age_seconds"] for r in young] == sorted(ages)
    action = rows[0]["action"]
    by_action = view.query("approvals", {"action": action}).items
    assert by_action and all(r["action"] == action for r in by_action)
    policy = view.query("approvals", {"owner": "POLICY_OWNER"}).items
    assert {r["request_id"] for r in policy} == {
        r["request_id"] for r in rows if r["owner"] == "POLICY_OWNER"
    }
    closed = view.query("approvals", {"open": "false"}).items
    assert {r["verdict"] for r in closed} <= {"CLOSED_BY_DECLINE", "CLOSED_BY_CANCEL", "RESUMED"}


def test_the_verdict_carries_action_and_request_time_outside_its_id() -> None:
    """The approvals core fills the new optional fields; verdict_id does not depend on them."""
    verdicts = [i.record for i in DEMO if isinstance(i.record, ApprovalVerdict)]
    assert verdicts and all(v.action and v.requested_at for v in verdicts)
    deploy = next(v for v in verdicts if v.request_id == "req-deploy")
    assert deploy.requested_at <= deploy.evaluated_at
    from streams.core.approvals import Evaluation

    ev = Evaluation(
        request_id=deploy.request_id,
        execution_id=deploy.execution_id,
        verdict=deploy.verdict,
        failed_proofs=deploy.failed_proofs,
        owner=deploy.owner,
        next_step=deploy.next_step,
        thresholds=deploy.thresholds,
        evaluated_at=deploy.evaluated_at,
    )
    bare = to_verdict(ev, deploy.previous_verdict)
    assert bare.action is None and bare.requested_at is None
    assert bare.verdict_id == deploy.verdict_id


# ------------------------------------------------------------------ idempotence, crash


def test_reapplying_is_idempotent(tmp_path: Path) -> None:
    once = ConsoleView(tmp_path / "a.sqlite3", clock=frozen)
    once.apply(DEMO)
    expected = everything(once)
    again = ConsoleView(tmp_path / "b.sqlite3", clock=frozen)
    half = len(DEMO) // 2
    again.apply(DEMO[:half])
    again.apply(DEMO)  # the first half again, at the same offsets: skipped by position
    assert everything(again) == expected
    # the same records published again at later offsets (a worker's re-publication): skipped
    # by record id, only the positions move
    shift = max(i.offset for i in DEMO) + 1
    changes = again.apply(
        [Incoming(i.topic, i.partition, i.offset + shift, i.record) for i in DEMO]
    )
    assert changes == []
    got = everything(again)
    assert got["summary"]["as_of"]["offsets"] != expected["summary"]["as_of"]["offsets"]
    for key in expected:
        if key not in ("summary",):
            strip = json.loads(json.dumps(got[key]).replace('"as_of"', '"x"'))
            want = json.loads(json.dumps(expected[key]).replace('"as_of"', '"x"'))
            _drop_as_of(strip), _drop_as_of(want)
            assert strip == want, key


def _drop_as_of(d: Any) -> None:
    if isinstance(d, dict):
        d.pop("x", None)
        for v in d.values():
            _drop_as_of(v)


def test_offsets_commit_with_the_rows_or_not_at_all(tmp_path: Path) -> None:
    """A crash between applying rows and committing: neither rows nor offsets remain; the
    records are applied again on restart, once."""
    path = tmp_path / "crash.sqlite3"
    v = ConsoleView(path, clock=frozen)
    half = len(DEMO) // 2
    v.apply(DEMO[:half])
    before = everything(v)

    (applied,) = v.execute_read("SELECT count(*) AS n FROM timeline")

    def crash(db: sqlite3.Connection) -> None:
        # the rows of the second half are in the transaction at this point
        (n,) = db.execute("SELECT count(*) FROM timeline").fetchone()
        assert n > applied["n"]
        raise RuntimeError("killed before commit")

    with pytest.raises(RuntimeError):
        v.apply(DEMO[half:], before_commit=crash)
    v.close()
    reopened = ConsoleView(path, clock=frozen)  # what a restarted console finds
    assert everything(reopened) == before
    positions = reopened.positions()
    rest = [i for i in DEMO if i.offset >= positions.get((i.topic, i.partition), 0)]
    assert len(rest) == len(DEMO) - half
    reopened.apply(rest)
    fresh = ConsoleView(tmp_path / "fresh.sqlite3", clock=frozen)
    fresh.apply(DEMO)
    assert everything(reopened) == everything(fresh)


def test_undecodable_records_only_move_the_position(view: ConsoleView) -> None:
    changes = view.apply([Incoming(TOPICS.alerts.name, 0, 0, None)])
    assert changes == []
    assert view.positions() == {(TOPICS.alerts.name, 0): 1}
    assert view.query("alerts", {}).items == []


def test_changes_name_what_changed(view: ConsoleView) -> None:
    changes = view.apply(DEMO)
    kinds = {c["kind"] for c in changes}
    assert kinds == {"execution", "operation", "approval", "work_item", "alert"}
    assert {"kind": "approval", "id": "req-deploy", "execution_id": "exec-deploy"} in changes


def test_a_newer_file_version_is_dropped_and_rebuilt(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    v = ConsoleView(path, clock=frozen)
    v.apply(DEMO)
    v.execute_write("PRAGMA user_version=999")  # a file written by another console version
    v.close()
    again = ConsoleView(path, clock=frozen)
    assert again.is_empty() and again.query("executions", {}).items == []


def test_the_review_log_outlives_a_version_change(tmp_path: Path) -> None:
    """Who reviewed what is the console's own record, not rebuilt from the topics."""
    from streams.console.review import REVIEW_LOG

    path = tmp_path / "old.sqlite3"
    v = ConsoleView(path, clock=frozen)
    v.apply(DEMO)
    v.execute_write(REVIEW_LOG)
    row = ("2026-12-01T00:00:00Z", "ana", "127.0.0.1", "op-1", "exec-1", 1, "take", "n", "x", 202)
    v.execute_write(
        "INSERT INTO review_log (at, reviewer, remote, operation_id, execution_id, attempt,"
        " action, note, outcome, status) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        row,
    )
    v.execute_write("PRAGMA user_version=1")  # the tables before ids were scoped
    v.close()
    again = ConsoleView(path, clock=frozen)
    assert again.is_empty()
    assert [r["reviewer"] for r in again.execute_read("SELECT * FROM review_log")] == ["ana"]


def test_execute_write_and_read(view: ConsoleView) -> None:
    view.execute_write("CREATE TABLE review_log (who TEXT, what TEXT)")
    assert view.execute_write("INSERT INTO review_log VALUES (?, ?)", ("ana", "take")) == 1
    assert view.execute_read("SELECT * FROM review_log") == [{"who": "ana", "what": "take"}]


# ------------------------------------------------------------------ cursors, filters


def _verdict(i: int, verdict: ApprovalVerdictCode, owner: Owner, start: int, action: str):
    at = T0 + timedelta(minutes=start + 1)
    return ApprovalVerdict(
        verdict_id=f"v{i}",
        request_id=f"req-{i:03d}",
        execution_id=f"ex-{i % 7}",
        verdict=verdict,
        owner=owner,
        next_step="step",
        thresholds=Thresholds(
            grace_ms=1, heartbeat_fresh_ms=1, delivery_deadline_ms=1, evaluated_at=at
        ),
        evaluated_at=at,
        action=action,
        requested_at=T0 + timedelta(minutes=start),
    )


rows = st.lists(
    st.tuples(
        st.sampled_from(list(ApprovalVerdictCode)),
        st.sampled_from([Owner.RUNTIME_OWNER, Owner.APPROVER, Owner.POLICY_OWNER]),
        st.integers(0, 5),  # few distinct start times: many ties broken by id
        st.sampled_from(["deploy", "refund"]),
    ),
    max_size=40,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=rows,
    limit=st.integers(1, 12),
    sort=st.sampled_from(list(LISTS["approvals"].sorts)),
    owner=st.none() | st.sampled_from(["RUNTIME_OWNER", "APPROVER"]),
)
def test_cursors_walk_every_row_exactly_once(tmp_path_factory, rows, limit, sort, owner) -> None:
    v = ConsoleView(tmp_path_factory.mktemp("walk") / "v.sqlite3", clock=frozen)
    v.apply(
        [Incoming("vigil.approval-verdicts", 0, i, _verdict(i, *r)) for i, r in enumerate(rows)]
    )
    params = {"limit": str(limit), "sort": sort}
    if owner:
        params["owner"] = owner
    seen: list[dict[str, Any]] = []
    cursor = None
    for _ in range(len(rows) + 2):
        page = v.query("approvals", params | ({"cursor": cursor} if cursor else {}))
        assert len(page.items) <= limit
        seen += page.items
        cursor = page.next_cursor
        if cursor is None:
            break
    ids = [r["request_id"] for r in seen]
    expected = {f"req-{i:03d}" for i, r in enumerate(rows) if owner is None or r[1] == owner}
    assert len(ids) == len(set(ids)) and set(ids) == expected
    _column, desc = LISTS["approvals"].sorts[sort]
    key = {"-age": "requested_at", "age": "requested_at", "evaluated_at": "evaluated_at"}[sort]
    # ties broken by the row's scoped key: request ids repeat across executions
    keys = [(r[key], scoped_key(r["execution_id"], r["request_id"])) for r in seen]
    assert keys == sorted(keys, reverse=desc)
    v.close()


def test_cursor_round_trip_and_refusals() -> None:
    c = encode_cursor("since", 12, "op-1")
    assert decode_cursor(c, "since", {}) == (12, "op-1")
    with pytest.raises(QueryError, match="sort"):
        decode_cursor(c, "-since", {})
    for bad in ("", "!!!", "e30", encode_cursor("since", 1, "x")[:-3], "bnVsbA"):
        with pytest.raises(QueryError):
            decode_cursor(bad, "since", {})


@pytest.mark.parametrize(
    ("name", "params", "match"),
    [
        ("approvals", {"verdict": "STUCK"}, "verdict"),
        ("approvals", {"colour": "red"}, "unknown parameter"),
        ("approvals", {"open": "yes"}, "open"),
        ("operations", {"status": "unknown"}, "status"),
        ("operations", {"sort": "age"}, "sort"),
        ("work-items", {"kind": "X"}, "kind"),
        ("executions", {"since_before": "yesterday"}, "since_before"),
        ("executions", {"since_after": "2026-07-26T16:00:00"}, "UTC offset"),
        ("alerts", {"severity": "LOUD"}, "severity"),
        ("alerts", {"limit": "0"}, "limit"),
        ("alerts", {"limit": "501"}, "limit"),
        ("alerts", {"limit": "ten"}, "limit"),
        ("alerts", {"execution_id": "x" * 300}, "longer"),
        ("alerts", {"execution_id": "\udc80"}, "not valid text"),
    ],
)
def test_bad_filters_are_refused_with_the_allowed_values(view, name, params, match) -> None:
    with pytest.raises(QueryError, match=match) as info:
        view.query(name, params)
    allowed = info.value.allowed
    assert "params" in allowed and "sort" in allowed
    for key in params:
        if key in LISTS[name].filters:
            assert key in allowed


def test_filters_select_exactly(view: ConsoleView) -> None:
    view.apply(DEMO)
    every = view.query("executions", {"limit": "500"}).items
    for status in {e["status"] for e in every}:
        got = view.query("executions", {"status": status, "limit": "500"}).items
        assert {e["execution_id"] for e in got} == {
            e["execution_id"] for e in every if e["status"] == status
        }
    cut = sorted(e["since"] for e in every)[len(every) // 2]
    before = view.query("executions", {"since_before": cut, "limit": "500"}).items
    after = view.query("executions", {"since_after": cut, "limit": "500"}).items
    assert {e["execution_id"] for e in before} | {e["execution_id"] for e in after} == {
        e["execution_id"] for e in every
    }
    assert all(e["since"] < cut for e in before)
    assert view.query("executions", {"terminal": "true"}).items == [
        e for e in every if e["terminal"]
    ]
    ops = view.query("operations", {"connector": "payments"}).items
    assert ops and all(o["connector"] == "payments" for o in ops)


params_strategy = st.dictionaries(
    st.sampled_from(
        ["limit", "cursor", "sort", "verdict", "owner", "status", "open", "since_before",
         "kind", "severity", "execution_id", "connector", "action", "terminal", "x"]
    ) | st.text(max_size=10),
    st.text(max_size=30) | st.sampled_from(["1", "500", "true", "FIRING", "UNKNOWN", "-age"]),
    max_size=5,
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(list(LISTS)), params=params_strategy)
def test_hostile_params_answer_or_refuse_never_crash(name: str, params: dict[str, str]) -> None:
    v = HOSTILE_VIEW
    try:
        page = v.query(name, params)
    except QueryError as exc:
        assert str(exc) and exc.allowed
        json.dumps(exc.allowed)
    else:
        json.dumps(page.to_json())


HOSTILE_VIEW = ConsoleView(":memory:", clock=frozen)
HOSTILE_VIEW.apply(DEMO)


def test_work_item_resolution_before_the_item(view: ConsoleView) -> None:
    """A resolution read before its item (the item older than the read window): closed."""
    item = ReconciliationWorkItem(
        work_item_id="wi-1",
        operation_id="op-1",
        execution_id="ex-1",
        attempt=1,
        connector="sms",
        kind=WorkItemKind.REPLY_TIMEOUT,
        deadline=T0,
        created_at=T0,
    )
    res = WorkItemResolution(
        resolution_id="r-1",
        work_item_id="wi-1",
        operation_id="op-1",
        execution_id="ex-1",
        attempt=1,
        outcome="VERIFIED",
        evidence_source="HUMAN",
        resolved_at=T0 + timedelta(minutes=1),
    )
    view.apply([Incoming("w", 0, 0, res), Incoming("w", 1, 0, item)])
    assert view.query("work-items", {}).items == []
    (closed,) = view.query("work-items", {"open": "false"}).items
    assert closed["resolution"]["outcome"] == "VERIFIED"


def test_a_resolved_alert_read_before_the_firing_one(view: ConsoleView) -> None:
    firing = Alert(
        alert_id="a-1",
        kind="OPERATION_UNKNOWN",
        status="FIRING",
        severity="WARNING",
        execution_id="ex-1",
        subject_id="op-1",
        owner="CONNECTOR_OWNER",
        next_step="x",
        occurred_at=T0,
    )
    resolved = Alert(
        **firing.model_dump()
        | {"alert_id": "a-2", "status": "RESOLVED", "resolves_alert_id": "a-1"}
    )
    view.apply([Incoming("a", 1, 0, resolved), Incoming("a", 0, 0, firing)])
    assert view.query("alerts", {}).items == []
    (r,) = view.query("alerts", {"status": "RESOLVED"}).items
    assert r["alert_id"] == "a-1" and r["resolved_by"] == "a-2"


def test_an_older_execution_state_does_not_replace_a_newer_one(view: ConsoleView) -> None:
    def state(seq: int, status: str) -> ExecutionState:
        return ExecutionState(
            execution_id="ex-1",
            status=status,
            since=T0 + timedelta(seconds=seq),
            first_seen_at=T0,
            last_event_at=T0 + timedelta(seconds=seq),
            last_sequence=seq,
            terminal=status == "COMPLETED",
            state_id=f"s{seq}",
        )

    view.apply(
        [Incoming("e", 0, 0, state(5, "COMPLETED")), Incoming("e", 0, 1, state(3, "RUNNING"))]
    )
    (e,) = view.query("executions", {}).items
    assert e["status"] == "COMPLETED"


def test_operation_owner_follows_the_status() -> None:
    from streams.console.view import operation_owner

    base = dict(
        operation_id="o",
        execution_id="e",
        attempt=1,
        connector="c",
        retry="WAIT",
        since=T0,
        state_id="s",
    )
    assert operation_owner(OperationState(status="UNKNOWN", **base)) is Owner.CONNECTOR_OWNER
    assert operation_owner(OperationState(status="SENT", **base)) is Owner.RUNTIME_OWNER
    assert operation_owner(OperationState(status="VERIFIED", **base)) is None
    acked = OperationState(status="ACKNOWLEDGED", open_work_item_id="wi", **base)
    assert operation_owner(acked) is Owner.CONNECTOR_OWNER


# ------------------------------------------------------------------ the JSON API over HTTP


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    """The console's aiohttp application on a real local socket, over the demo's view."""
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    from streams.console.api import create_app
    from streams.console.service import ChangeHub, ConsoleContext
    from streams.settings import Settings

    v = ConsoleView(tmp_path_factory.mktemp("api") / "console.sqlite3", clock=frozen)
    v.apply(DEMO)
    settings = Settings()

    def no_producer():
        raise RuntimeError("no producer in this test")

    def ctx(read_token=None):
        return ConsoleContext(
            view=v,
            settings=settings,
            hub=ChangeHub(),
            read_token=read_token,
            write_token="w-token" if read_token else None,
            producer_factory=no_producer,
        )

    loop = asyncio.new_event_loop()
    open_client = TestClient(TestServer(create_app(ctx())), loop=loop)
    locked_client = TestClient(TestServer(create_app(ctx("r-token"))), loop=loop)
    loop.run_until_complete(open_client.start_server())
    loop.run_until_complete(locked_client.start_server())
    yield loop, open_client, locked_client
    loop.run_until_complete(open_client.close())
    loop.run_until_complete(locked_client.close())
    loop.close()
    v.close()


def _get(api, path: str, client: int = 1, **kw: Any) -> tuple[int, Any]:
    loop, *clients = api

    async def go() -> tuple[int, Any]:
        r = await clients[client - 1].get(path, **kw)
        return r.status, await r.json(content_type=None)

    return loop.run_until_complete(go())


def test_api_lists_and_as_of(api) -> None:
    status, body = _get(api, "/api/approvals?verdict=STUCK_AFTER_DECISION")
    assert status == 200
    (a,) = body["items"]
    assert a["request_id"] == "req-deploy" and a["owner"] == "RUNTIME_OWNER"
    assert body["as_of"]["event_time"] and body["as_of"]["offsets"]
    assert "lag" in body["as_of"]
    status, body = _get(api, "/api/executions/exec-refund")
    assert status == 200 and body["operations"][0]["status"] == "UNKNOWN"
    status, body = _get(api, "/api/executions/exec-refund/timeline")
    assert status == 200 and body["items"]
    assert _get(api, "/api/executions/nope")[0] == 404
    assert _get(api, "/api/executions/nope/timeline")[0] == 404
    status, body = _get(api, "/api/summary")
    assert status == 200 and body["operations_by_status"]["UNKNOWN"] == 1
    status, body = _get(api, "/api/lag")
    assert status == 200 and body["consumer_alive"] is False
    assert _get(api, "/healthz")[0] == 503  # no consumer thread in this test


def test_api_refuses_bad_input_with_the_allowed_values(api) -> None:
    status, body = _get(api, "/api/operations?status=SORT_OF")
    assert status == 400 and "UNKNOWN" in body["allowed"]["status"]
    status, body = _get(api, "/api/operations?status=UNKNOWN&status=FAILED")
    assert status == 400 and "2 times" in body["error"]
    status, body = _get(api, "/api/summary?x=1")
    assert status == 400
    assert _get(api, "/api/executions/" + "x" * 300)[0] == 400


def test_api_read_token(api) -> None:
    assert _get(api, "/api/summary", client=2)[0] == 401
    bad = {"Authorization": "Bearer nope"}
    assert _get(api, "/api/summary", client=2, headers=bad)[0] == 401
    for token in ("r-token", "w-token"):
        ok = {"Authorization": f"Bearer {token}"}
        assert _get(api, "/api/summary", client=2, headers=ok)[0] == 200
    assert _get(api, "/api/summary", client=2, cookies={"vigil_console_token": "r-token"})[0] == 200
    assert _get(api, "/healthz", client=2)[0] == 503  # open, and says the consumer is down


hostile_text = st.text(max_size=40) | st.sampled_from(
    ["%00", "\x00", "' OR 1=1 --", "-1", "1e9", "999999999999", "🙂", "%ff%fe", "../../etc"]
)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    path=st.sampled_from(
        [*(f"/api/{n}" for n in LISTS), "/api/summary", "/api/lag", "/api/executions/{x}",
         "/api/executions/{x}/timeline"]
    ),
    params=st.lists(st.tuples(st.sampled_from(
        ["limit", "cursor", "sort", "verdict", "owner", "status", "open", "since_before",
         "since_after", "kind", "severity", "connector", "terminal", "action"]
    ) | st.text(max_size=8), hostile_text), max_size=4),
    x=hostile_text,
)  # fmt: skip
def test_api_never_answers_500_to_hostile_input(api, path, params, x) -> None:
    from urllib.parse import quote

    path = path.replace("{x}", quote(x, safe="") or "e")
    status, body = _get(api, path, params=params)
    assert status in (200, 400, 404), (status, body)
    if status == 400:
        assert body["error"]


def test_change_hub_fans_out_and_drops_a_slow_subscriber() -> None:
    import asyncio

    from streams.console.service import ChangeHub

    async def scenario() -> None:
        hub = ChangeHub(queue_size=2)
        hub.bind(asyncio.get_running_loop())
        fast_got: list[Any] = []

        async def fast() -> None:
            async for changes in hub.subscribe():
                fast_got.append(changes)
                if len(fast_got) == 5:
                    return

        slow = hub.subscribe()
        slow_first = asyncio.ensure_future(slow.__anext__())
        task = asyncio.ensure_future(fast())
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        for i in range(5):
            # published from another thread, as the consumer does
            await asyncio.to_thread(
                hub.publish, [{"kind": "alert", "id": str(i), "execution_id": "e"}]
            )
            await asyncio.sleep(0.01)
        await asyncio.wait_for(task, 5)
        assert [c[0]["id"] for c in fast_got] == ["0", "1", "2", "3", "4"]
        assert (await slow_first)[0]["id"] == "0"
        rest = [c async for c in slow]  # dropped once its queue was full: the iterator ends
        assert len(rest) < 4
        assert hub.subscribers == 0

    asyncio.run(scenario())


def test_two_executions_using_one_operation_id_have_rows_of_their_own(tmp_path: Path) -> None:
    """Issue 26's case (``charge-1`` in two executions, both timed out and rejected): two
    operation rows, two work items, each execution's page with its own; and work items opened
    before ids were scoped, which share an id, still two rows."""
    from tests.test_core_scoped_ids import issue_case

    v = ConsoleView(tmp_path / "v.sqlite3", clock=frozen)
    records = [r for outputs in issue_case().values() for r in outputs]
    old = "wi-efc461527188cbc977926975"  # the one id 83a7350 gave both
    for r in list(records):
        if isinstance(r, ReconciliationWorkItem):
            records.append(r.model_copy(update={"work_item_id": old}))
    v.apply([Incoming("vigil.any", 0, i, r) for i, r in enumerate(records)])
    operations = v.query("operations", {}).items
    assert sorted((o["execution_id"], o["operation_id"], o["status"]) for o in operations) == [
        ("exec-a", "charge-1", "FAILED"),
        ("exec-b", "charge-1", "FAILED"),
    ]
    items = v.query("work-items", {"open": "false"}).items + v.query("work-items", {}).items
    assert len({(i["execution_id"], i["work_item_id"]) for i in items}) == 4
    for execution_id in ("exec-a", "exec-b"):
        page = v.execution(execution_id)
        assert page is not None
        assert [o["execution_id"] for o in page["operations"]] == [execution_id]
        assert {i["execution_id"] for i in page["work_items"]} == {execution_id}
    v.close()


def test_ages_are_measured_from_now_not_from_the_newest_record(tmp_path: Path) -> None:
    """A quiet fleet: nothing new for an hour after the newest record. An approval's age
    and the answer's ``now`` go on with the wall clock; ``event_time`` stays the newest
    record's."""
    clock = [NOW.timestamp()]
    v = ConsoleView(tmp_path / "quiet.sqlite3", clock=lambda: clock[0])
    v.apply(DEMO)
    first = v.query("approvals", {"limit": "500"})
    clock[0] += 9 * 60
    later = v.query("approvals", {"limit": "500"})
    newest = datetime.fromisoformat(first.as_of["event_time"])
    assert newest < NOW
    assert datetime.fromisoformat(later.as_of["now"]) == NOW + timedelta(minutes=9)
    assert later.as_of["event_time"] == first.as_of["event_time"]
    for before, after in zip(first.items, later.items, strict=True):
        started = datetime.fromisoformat(after["started_at"])
        assert after["age_seconds"] == (NOW + timedelta(minutes=9) - started).total_seconds()
        assert after["age_seconds"] - before["age_seconds"] == 9 * 60
    v.close()
