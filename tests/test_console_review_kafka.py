"""Manual review on the real broker: the demo through a real worker, a real console; a
review published by the console is applied by the pipeline like any other fact."""

from __future__ import annotations

import sqlite3
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from streams.cli.main import app as cli_app
from streams.client import BadRequest, Client, NotFound
from streams.contracts.models.enums import (
    AlertKind,
    AlertStatus,
    EvidenceSource,
    ExecutionStatus,
    OperationEventKind,
    OperationStatus,
    Owner,
    RetryVerdict,
)
from streams.contracts.models.events import ExecutionStatusChanged, OperationEvent
from streams.contracts.models.outputs import Alert, OperationState, WorkItemResolution
from streams.local.scenario import Tick, demo_scenario
from tests.support import Deployment, deployment, play, worker
from tests.test_console_kafka import console

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]
WRITE = "review-write-s3cret"
OP, EX = "op-refund-1", "exec-refund"
ANOMALY_TTL = "40s"


@pytest.fixture(scope="module")
def stack(cluster, tmp_path_factory):
    """The demo scenario, a worker that stays up (it applies the reviews) and a console
    with a write token."""
    dep = deployment(cluster, tmp_path_factory.mktemp("review"))
    play(dep, demo_scenario())
    # an anomaly's alert ends this long after it, in stream time (the last test ticks past)
    with worker(dep, env={"VIGIL_ANOMALY_ALERT_TTL": ANOMALY_TTL}) as _w:
        dep.read_until(
            [dep.topics.operation_state.name],
            lambda rs: any(
                isinstance(r.record, OperationState)
                and r.record.operation_id == OP
                and r.record.status is OperationStatus.UNKNOWN
                and r.record.attempt == 2
                for r in rs
            ),
            60,
        )
        db = dep.workdir / "console.sqlite3"
        with console(dep, db, VIGIL_CONSOLE_WRITE_TOKEN=WRITE) as (proc, base):
            wait_operation(base, OP, OperationStatus.UNKNOWN)
            yield dep, base, db, proc


def wait_operation(base: str, op: str, status: OperationStatus, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    rows: list[Any] = []
    while time.monotonic() < deadline:
        r = httpx.get(f"{base}/api/operations", params={"execution_id": EX}, timeout=5)
        rows = [row for row in r.json()["items"] if row["operation_id"] == op]
        if rows and rows[0]["status"] == status:
            return rows[0]
        time.sleep(0.2)
    raise AssertionError(f"{op} not {status} in the console: {rows}")


def post(
    base: str, op: str, body: dict[str, Any], execution: str | None = EX, **headers: str
) -> httpx.Response:
    """A review of operation ``op`` of ``execution``, on the scoped path (operation ids repeat
    across executions), or by the operation id alone (None)."""
    url = f"{base}/api/operations/{op}/review"
    if execution is not None:
        url = f"{base}/api/executions/{execution}/operations/{op}/review"
    return httpx.post(url, json=body, headers=headers, timeout=20)


AUTH = {"Authorization": f"Bearer {WRITE}"}


def human_events(dep: Deployment) -> list[OperationEvent]:
    return [
        r.record
        for r in dep.read([dep.topics.operation_events.name], idle=1.0)
        if isinstance(r.record, OperationEvent) and r.record.evidence_source is EvidenceSource.HUMAN
    ]


def test_refusals_publish_nothing(stack) -> None:
    dep, base, _, _ = stack
    body = {"action": "verified", "note": "bank statement line 7", "reviewer": "alice"}
    r = post(base, OP, body)
    assert r.status_code == 401 and "a write token is required" in r.json()["error"]
    r = post(base, OP, body, Authorization="Bearer nope")
    assert r.status_code == 401 and "the write token is wrong" in r.json()["error"]
    r = post(base, OP, body, **AUTH, Origin="https://evil.example")
    assert r.status_code == 403 and "cross-site" in r.json()["error"]
    r = post(base, OP, body, **AUTH, **{"Sec-Fetch-Site": "cross-site"})
    assert r.status_code == 403
    # the page's own origin is welcome
    same = post(base, "op-nope", body, **AUTH, Origin=base, **{"Sec-Fetch-Site": "same-origin"})
    assert same.status_code == 404 and "op-nope" in same.json()["error"]
    # op-sms-1 was settled VERIFIED by the reconciler
    r = post(base, "op-sms-1", body, None, **AUTH)  # by its id alone: one execution uses it
    assert r.status_code == 409 and "VERIFIED" in r.json()["error"]
    r = post(base, OP, {"action": "approve", "note": "n", "reviewer": "a"}, **AUTH)
    assert r.status_code == 400 and r.json()["allowed"]["action"] == ["take", "verified", "failed"]
    r = httpx.post(
        f"{base}/api/operations/{OP}/review",
        content=b"action=verified",
        headers={**AUTH, "Content-Type": "application/x-www-form-urlencoded"},
        timeout=10,
    )
    assert r.status_code == 415
    assert human_events(dep) == []


def test_client_lists_from_the_console(stack) -> None:
    """``streams.client`` against the console: typed pages, cursors, typed 400s."""
    _, base, _, _ = stack
    with Client(console_url=base) as client:
        page = client.operations(status="UNKNOWN", limit=1)
        assert [o.operation_id for o in page.items] == [OP]
        assert page.items[0].status is OperationStatus.UNKNOWN
        assert page.items[0].retry is RetryVerdict.FORBIDDEN and page.as_of.offsets
        stuck = client.approvals(verdict="STUCK_AFTER_DECISION")
        assert [a.request_id for a in stuck.items] == ["req-deploy"]
        assert stuck.items[0].owner is Owner.RUNTIME_OWNER
        first = client.approvals(limit=2)
        assert len(first.items) == 2 and first.next_cursor is not None
        every = list(client.pages("approvals", limit=2))
        assert len(every) > 2 and len({a.request_id for a in every}) == len(every)
        # the same rows in the same order (their ages grow between the two reads)
        assert [(a.execution_id, a.request_id) for a in every[:2]] == [
            (a.execution_id, a.request_id) for a in first.items
        ]
        walked = [e.execution_id for e in client.pages("executions", limit=3)]
        assert walked == [e.execution_id for e in client.executions(limit=500).items]
        assert {EX, "exec-sms-reminder", "exec-invoice-run"} <= set(walked)
        assert any(w.operation_id == OP for w in client.work_items().items)
        with pytest.raises(BadRequest) as bad:
            client.operations(status="SOMETIMES")
        assert "UNKNOWN" in str(bad.value.allowed)
        with pytest.raises(NotFound):
            client.timeline("no-such-run")


def test_take_then_verified_settles_the_unknown_operation(stack) -> None:
    """`vigil review --take`, then a double POST of verified: one event each; the pipeline
    applies them, publishes VERIFIED, the work item's resolution and the RESOLVED alert, and
    the console shows it settled; settling it again is refused and publishes nothing."""
    dep, base, db, proc = stack
    runner = CliRunner()
    env = {"VIGIL_CONSOLE_WRITE_TOKEN": WRITE}
    take = ["review", OP, "--execution", EX, "--take", "--note", "bank", "--reviewer", "alice"]
    res = runner.invoke(cli_app, [*take, "--console", base], env=env)
    assert res.exit_code == 0, res.output
    assert "MANUAL_REVIEW" in res.output
    t0 = time.monotonic()
    body = {"action": "verified", "note": "bank statement line 7", "reviewer": "alice"}
    first, second = post(base, OP, body, **AUTH), post(base, OP, body, **AUTH)
    assert first.status_code == 202 and first.json()["published"] is True, first.text
    assert second.status_code == 200 and second.json()["published"] is False, second.text
    assert first.json()["event_id"] == second.json()["event_id"]
    # the ticker's part: move every partition past the reviews' event time
    dep.tick(datetime.now(UTC) + timedelta(seconds=1))

    outputs = [
        dep.topics.operation_state.name,
        dep.topics.reconciliation_work.name,
        dep.topics.alerts.name,
    ]

    def settled(rs: list[Any]) -> bool:
        recs = [r.record for r in rs]
        return (
            any(
                isinstance(x, OperationState)
                and x.operation_id == OP
                and x.status is OperationStatus.VERIFIED
                for x in recs
            )
            and {
                x.attempt
                for x in recs
                if isinstance(x, WorkItemResolution) and x.operation_id == OP
            }
            == {1, 2}
            and any(
                isinstance(x, Alert)
                and x.subject_id == OP
                and x.status is AlertStatus.RESOLVED
                and x.kind is AlertKind.OPERATION_UNKNOWN
                for x in recs
            )
            and any(
                isinstance(x, Alert)
                and x.subject_id == OP
                and x.status is AlertStatus.RESOLVED
                and x.kind is AlertKind.FORBIDDEN_RETRY
                for x in recs
            )
        )

    records = dep.read_until(outputs, settled, timeout=30)
    on_topics = time.monotonic() - t0
    states = [
        r.record
        for r in records
        if isinstance(r.record, OperationState) and r.record.operation_id == OP
    ]
    # attempt 2 verified, then published again once attempt 1, under the same idempotency
    # key, is settled with it (docs/rules.md#shared-idempotency-key-evidence)
    assert [s.status for s in states[-3:]] == [
        OperationStatus.MANUAL_REVIEW,
        OperationStatus.VERIFIED,
        OperationStatus.VERIFIED,
    ]
    assert (states[-2].held_by_attempt, states[-1].held_by_attempt) == (1, None)
    assert states[-1].retry is RetryVerdict.NOT_NEEDED
    resolutions = {
        r.record.attempt: r.record
        for r in records
        if isinstance(r.record, WorkItemResolution) and r.record.operation_id == OP
    }
    assert {a: r.evidence_source for a, r in resolutions.items()} == {
        1: EvidenceSource.HUMAN,
        2: EvidenceSource.HUMAN,
    }
    assert resolutions[2].evidence == ()
    assert resolutions[1].evidence == (
        "verified_by=op-refund-1#2",
        "idempotency_key=idem-op-refund-1",
    )
    row = wait_operation(base, OP, OperationStatus.VERIFIED)
    in_console = time.monotonic() - t0
    print(f"review → topics {on_topics:.1f} s, → console {in_console:.1f} s")
    assert row["attempt"] == 2
    # both attempts settled, one effect under their key: the duplicate send's alert ends
    retry_ends = [
        x
        for x in (r.record for r in records)
        if isinstance(x, Alert)
        and x.kind is AlertKind.FORBIDDEN_RETRY
        and x.status is AlertStatus.RESOLVED
        and x.subject_id == OP
    ]
    assert len(retry_ends) == 1 and retry_ends[0].resolves_alert_id
    assert wait_for(
        lambda: (
            httpx.get(
                f"{base}/api/alerts",
                params={"execution_id": EX, "kind": "FORBIDDEN_RETRY"},
                timeout=5,
            ).json()["items"]
            == []
            or None
        )
    )

    # one input event per action, double POST included
    events = human_events(dep)
    assert sorted(e.kind for e in events) == [
        OperationEventKind.MANUAL_REVIEW,
        OperationEventKind.VERIFIED,
    ]
    assert all(e.execution_id == EX and e.attempt == 2 for e in events)

    # settled now: the console refuses, the CLI says so in one line, nothing is published
    again = post(base, OP, body, **AUTH)
    assert again.status_code == 409 and "VERIFIED" in again.json()["error"]
    res = runner.invoke(
        cli_app,
        ["review", OP, "--failed", "--note", "n", "--reviewer", "bob", "--console", base],
        env=env,
    )
    assert res.exit_code == 1 and "409" in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) <= 3  # one message (rich may wrap it)
    assert len(human_events(dep)) == 2

    # every action recorded with who and when; the token in no log
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT reviewer, action, outcome, status, at, operation_id FROM review_log ORDER BY id"
        ).fetchall()
    assert ("alice", "take", "published", 202) in [r[:4] for r in rows]
    verified = [r[2] for r in rows if r[0] == "alice" and r[1] == "verified" and r[5] == OP]
    assert verified == ["published", "duplicate", "refused"]
    assert all(r[4] for r in rows)
    assert ("bob", "failed", "refused", 409) in [r[:4] for r in rows]
    assert WRITE not in proc.log_path.read_text()


def test_cli_errors_are_one_line(stack) -> None:
    _, base, _, _ = stack
    runner = CliRunner()
    args = ["review", OP, "--verified", "--note", "n", "--reviewer", "r", "--console", base]
    # exit codes as README's table: refused 1, bad setting 3, bad argument 2, unreachable 8
    res = runner.invoke(cli_app, args, env={"VIGIL_CONSOLE_WRITE_TOKEN": "wrong"})
    assert res.exit_code == 1 and "401" in res.output and "Traceback" not in res.output
    assert "the write token is wrong" in res.output
    res = runner.invoke(cli_app, args, env={"VIGIL_CONSOLE_WRITE_TOKEN": ""})
    assert res.exit_code == 3 and "VIGIL_CONSOLE_WRITE_TOKEN" in res.output
    res = runner.invoke(
        cli_app, [*args[:-1], "127.0.0.1:9"], env={"VIGIL_CONSOLE_WRITE_TOKEN": WRITE}
    )
    assert res.exit_code == 2 and "--console" in res.output
    res = runner.invoke(
        cli_app, [*args[:-1], "http://127.0.0.1:9"], env={"VIGIL_CONSOLE_WRITE_TOKEN": WRITE}
    )
    assert res.exit_code == 8 and "cannot reach" in res.output and "Traceback" not in res.output


PAY, PAY_OP = "exec-pay", "op-pay-1"


def test_an_unknown_attempt_under_a_verified_one_is_counted_reviewed_and_its_alerts_end(
    stack,
) -> None:
    """Attempt 1 times out (UNKNOWN), attempt 2 under another key is sent (a forbidden retry)
    and verified: the operation is VERIFIED, its retry FORBIDDEN, and the console counts,
    filters and lists attempt 1 as UNKNOWN and blocking. Reviewed through its work item,
    attempt 1 fails: nothing blocks a retry any more, and the FORBIDDEN_RETRY alert ends with
    a RESOLVED alert the console counts. A duplicate input's ANOMALY alert ends
    VIGIL_ANOMALY_ALERT_TTL of stream time later (docs/rules.md#alert-lifecycle). Runs last:
    it moves time on."""
    dep, base, _, _ = stack
    t = datetime.now(UTC).replace(microsecond=0)
    K = OperationEventKind

    def op(attempt: int, kind: OperationEventKind, at: datetime, key: str, **kw: Any):
        return OperationEvent(
            event_id=f"{PAY_OP}-{attempt}-{kind}",
            execution_id=PAY,
            operation_id=PAY_OP,
            attempt=attempt,
            idempotency_key=key,
            connector="payments",
            kind=kind,
            occurred_at=at,
            **kw,
        )

    status = ExecutionStatusChanged(
        event_id="pay-s1",
        execution_id=PAY,
        sequence=1,
        status=ExecutionStatus.RUNNING,
        occurred_at=t,
    )
    s = timedelta(seconds=1)
    play(
        dep,
        [
            status,
            op(1, K.SENT, t + s, "k-1", reply_due_at=t + 2 * s),
            Tick(t + 3 * s),
            op(2, K.SENT, t + 4 * s, "k-2", reply_due_at=t + 30 * s),
            op(2, K.VERIFIED, t + 5 * s, "k-2", evidence_source=EvidenceSource.CONNECTOR),
            status,  # a redelivery by its producer: a DUPLICATE anomaly
            Tick(t + 6 * s),
        ],
    )

    def pay_row() -> dict[str, Any] | None:
        r = httpx.get(f"{base}/api/operations", params={"execution_id": PAY}, timeout=5)
        rows = r.json()["items"]
        return rows[0] if rows and rows[0]["status"] == "VERIFIED" else None

    row = wait_for(pay_row)
    assert (row["attempt"], row["retry"], row["blocking"]) == (2, "FORBIDDEN", True)
    assert [(a["attempt"], a["status"], a["blocks_retry"]) for a in row["attempts"]] == [
        (1, "UNKNOWN", True),
        (2, "VERIFIED", False),
    ]
    found = httpx.get(
        f"{base}/api/operations", params={"status": "UNKNOWN", "execution_id": PAY}, timeout=5
    ).json()["items"]
    assert [o["operation_id"] for o in found] == [PAY_OP]
    summary = httpx.get(f"{base}/api/summary", timeout=5).json()
    assert summary["attempts_blocking_by_status"].get("UNKNOWN", 0) >= 1
    with Client(console_url=base) as client:
        (typed,) = client.operations(execution_id=PAY, blocking=True).items
        assert [a.attempt for a in typed.blocking_attempts()] == [1]

    def firing(kind: str) -> list[dict[str, Any]]:
        r = httpx.get(f"{base}/api/alerts", params={"execution_id": PAY, "kind": kind}, timeout=5)
        return r.json()["items"]

    (retry_alert,) = wait_for(lambda: firing("FORBIDDEN_RETRY") or None)
    (anomaly_alert,) = wait_for(lambda: firing("ANOMALY") or None)

    # attempt 1's work item has its own review
    (item,) = [
        w
        for w in httpx.get(
            f"{base}/api/work-items", params={"execution_id": PAY}, timeout=5
        ).json()["items"]
        if w["attempt"] == 1
    ]
    assert item["work_item_id"] == typed.attempts[0].open_work_item_id
    url = f"{base}/api/executions/{PAY}/work-items/{item['work_item_id']}/review"
    body = {"action": "failed", "note": "the bank never booked it", "reviewer": "carol"}
    r = httpx.post(url, json={**body, "attempt": 2}, headers=AUTH, timeout=20)
    assert r.status_code == 400 and "attempt 1" in r.json()["error"]
    first = httpx.post(url, json=body, headers=AUTH, timeout=20)
    assert first.status_code == 202, first.text
    assert (first.json()["attempt"], first.json()["operation_id"]) == (1, PAY_OP)
    again = httpx.post(url, json=body, headers=AUTH, timeout=20)
    assert again.status_code == 200 and again.json()["published"] is False
    # time on, past the review (stamped now) and the story's own last tick
    dep.tick(max(datetime.now(UTC), t + 6 * s) + s)

    def settled() -> dict[str, Any] | None:
        # Attempt 1's FAILED comes with the work item's resolution, attempt 2's new verdict
        # with its operation state: two topics, which the console may apply in either order.
        r = httpx.get(f"{base}/api/operations", params={"execution_id": PAY}, timeout=5)
        (o,) = r.json()["items"]
        return o if not o["blocking"] and o["retry"] != "FORBIDDEN" else None

    row = wait_for(settled)
    assert row["retry"] == "NOT_NEEDED"
    assert [(a["attempt"], a["status"]) for a in row["attempts"]] == [
        (1, "FAILED"),
        (2, "VERIFIED"),
    ]
    assert wait_for(lambda: firing("FORBIDDEN_RETRY") == [] or None)
    records = dep.read_until(
        [dep.topics.alerts.name],
        lambda rs: any(
            isinstance(x.record, Alert) and x.record.resolves_alert_id == retry_alert["alert_id"]
            for x in rs
        ),
        30,
    )
    (ended,) = [
        x.record
        for x in records
        if isinstance(x.record, Alert) and x.record.resolves_alert_id == retry_alert["alert_id"]
    ]
    assert (ended.kind, ended.status) == (AlertKind.FORBIDDEN_RETRY, AlertStatus.RESOLVED)
    again = httpx.post(url, json=body, headers=AUTH, timeout=20)
    assert again.status_code == 409 and "resolved already" in again.json()["error"]

    # the anomaly's alert: firing until VIGIL_ANOMALY_ALERT_TTL of stream time has passed
    assert [a["alert_id"] for a in firing("ANOMALY")] == [anomaly_alert["alert_id"]]
    dep.tick(t + 41 * s)
    assert wait_for(lambda: firing("ANOMALY") == [] or None)
    resolved = httpx.get(
        f"{base}/api/alerts",
        params={"execution_id": PAY, "kind": "ANOMALY", "status": "RESOLVED"},
        timeout=5,
    ).json()["items"]
    assert [a["alert_id"] for a in resolved] == [anomaly_alert["alert_id"]]
    assert resolved[0]["resolved_by"]


def wait_for(probe: Any, timeout: float = 30) -> Any:
    """``probe()`` until it gives something (not None), or fail."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = probe()
        if got is not None:
            return got
        time.sleep(0.2)
    raise AssertionError(f"not reached in {timeout} s: {probe}")


def test_a_replay_publishes_the_live_alert_ends(stack) -> None:
    """``vigil replay`` of everything the module wrote (the demo, the reviews, the payment
    story): the same alerts, FIRING and RESOLVED, with the same ids and times as live: the
    ends of the forbidden retries and of the anomaly are decided from the input log alone
    (docs/rules.md#alert-lifecycle). Runs after the story above, whose last tick it needs."""
    from dataclasses import replace as with_

    from streams.durations import parse_duration
    from streams.replay import run_replay

    dep, _, _, _ = stack
    live = {
        r.record.alert_id: r.record
        for r in dep.read([dep.topics.alerts.name], idle=2.0)
        if isinstance(r.record, Alert)
    }
    assert any(
        a.kind is AlertKind.ANOMALY and a.status is AlertStatus.RESOLVED for a in live.values()
    )
    settings = with_(dep.settings, anomaly_alert_ttl=parse_duration(ANOMALY_TTL))  # the worker's
    summary = run_replay(settings, dep.codec, datetime(2026, 1, 1, tzinfo=UTC), show_progress=False)
    assert summary.dead_letters == 0
    replayed = {
        r.record.alert_id: r.record
        for r in dep.read([dep.topics.alerts.name + "-replay"], idle=2.0)
        if isinstance(r.record, Alert)
    }
    ends = {i for i, a in live.items() if a.kind in (AlertKind.FORBIDDEN_RETRY, AlertKind.ANOMALY)}
    assert ends and {i: replayed.get(i) for i in ends} == {i: live[i] for i in ends}
    assert replayed == live
