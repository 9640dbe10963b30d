"""The operator surface over real HTTP against a running worker on the real broker."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from streams.contracts.models.enums import ExecutionStatus
from streams.contracts.models.events import ApprovalRequested, ExecutionStatusChanged
from streams.contracts.models.outputs import ApprovalVerdict
from streams.local.scenario import REFERENCE_AT, Tick, demo_scenario
from tests.support import deployment, play, worker

pytestmark = pytest.mark.kafka
T0 = datetime(2026, 7, 26, 16, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def running(cluster, tmp_path_factory):
    dep = deployment(cluster, tmp_path_factory.mktemp("api"))
    play(dep, demo_scenario())
    with worker(dep) as w:
        dep.read_until(
            [dep.topics.approval_verdicts.name],
            lambda rs: any(
                isinstance(r.record, ApprovalVerdict)
                and r.record.evaluated_at > REFERENCE_AT - timedelta(minutes=5)
                for r in rs
            ),
        )
        yield dep, f"http://127.0.0.1:{w.web_port}"


def test_execution_view(running) -> None:
    _, base = running
    r = httpx.get(f"{base}/v1/executions/exec-sms-reminder", timeout=10)
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "WAITING_FOR_TOOL" and body["in_flight"] is True
    (op,) = body["operations"]
    assert op["operation_id"] == "op-sms-1" and op["status"] == "VERIFIED"
    assert op["retry"] == "NOT_NEEDED"
    r = httpx.get(f"{base}/v1/executions/exec-deploy", timeout=10)
    (appr,) = r.json()["approvals"]
    assert appr["verdict"] == "STUCK_AFTER_DECISION" and appr["owner"] == "RUNTIME_OWNER"
    # exec-deploy has no status event, only an approval still open: in flight, status unknown
    deploy = r.json()
    assert deploy["status"] is None and deploy["status_known"] is False
    assert deploy["in_flight"] is True and deploy["open_approval_ids"] == [appr["request_id"]]
    sms = httpx.get(f"{base}/v1/executions/exec-sms-reminder", timeout=10).json()
    assert sms["status_known"] is True and sms["open_operation_ids"] == []


def test_unknown_and_malformed_ids(running) -> None:
    _, base = running
    r = httpx.get(f"{base}/v1/executions/no-such-run", timeout=10)
    assert r.status_code == 404 and "error" in r.json()
    r = httpx.get(f"{base}/v1/executions/%20bad%20id", timeout=10)
    assert r.status_code == 400 and "malformed" in r.json()["error"]
    r = httpx.get(f"{base}/v1/approvals/no-such-request", timeout=10)
    assert r.status_code == 404


def test_approval_view(running) -> None:
    _, base = running
    r = httpx.get(f"{base}/v1/approvals/req-rotation", timeout=10)
    assert r.status_code == 200
    body = r.json()
    assert body["verdict"] == "UNROUTABLE_WAIT" and body["owner"] == "POLICY_OWNER"
    assert any(f["proof"] == "VERIFIED_ROUTE" for f in body["failed_proofs"])


def test_faust_table_views_are_off(running) -> None:
    _, base = running
    assert httpx.get(f"{base}/table/", timeout=10).status_code == 404
    assert httpx.get(f"{base}/router/", timeout=10).status_code == 404


def test_metrics(running) -> None:
    _, base = running
    text = httpx.get(f"{base}/metrics", timeout=10).text
    for name in (
        "vigil_events_in_total",
        "vigil_verdicts_total",
        "vigil_executions_in_flight",
        "vigil_approvals_open",
        "vigil_operations_unknown",
        "vigil_work_items_open",
        "vigil_dead_letters_total",
        "vigil_consumer_lag",
        "vigil_processing_latency_seconds_bucket",
    ):
        assert name in text, name
    assert 'vigil_verdicts_total{verdict="STUCK_AFTER_DECISION"}' in text


def _sse(
    base: str, path: str, headers: dict[str, str] | None = None, until=None, timeout: float = 30.0
) -> list[dict[str, str]]:
    events: list[dict[str, str]] = []
    with httpx.stream("GET", f"{base}{path}", headers=headers or {}, timeout=timeout) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        cur: dict[str, str] = {}
        for line in r.iter_lines():
            if line.startswith(":"):
                cur = {"comment": line}
            elif line == "":
                if cur:
                    events.append(cur)
                cur = {}
                if until and until(events):
                    break
            else:
                k, _, v = line.partition(": ")
                cur[k] = v
    return events


def test_sse_follows_an_execution_and_resumes_with_last_event_id(running) -> None:
    dep, base = running
    ex = "exec-live"

    def status(seq: int, st: ExecutionStatus) -> ExecutionStatusChanged:
        return ExecutionStatusChanged(
            event_id=f"{ex}-{seq}",
            execution_id=ex,
            sequence=seq,
            status=st,
            occurred_at=T0 + timedelta(minutes=40 + seq),
        )

    play(dep, [status(1, ExecutionStatus.RUNNING), Tick(T0 + timedelta(minutes=41, seconds=1))])
    # an execution the worker has not processed yet is a 404: wait until it has
    dep.read_until(
        [dep.topics.execution_state.name],
        lambda rs: any(getattr(r.record, "execution_id", None) == ex for r in rs),
    )
    first = _sse(base, f"/v1/executions/{ex}/stream", until=lambda es: len(es) >= 1)
    assert first[0]["event"] == "ExecutionState" and first[0]["id"].startswith("exec-")

    def later() -> None:
        play(
            dep,
            [
                status(2, ExecutionStatus.VALIDATING_OUTPUT),
                status(3, ExecutionStatus.COMPLETED),
                Tick(T0 + timedelta(minutes=44)),
            ],
        )

    threading.Timer(1.0, later).start()
    rest = _sse(
        base, f"/v1/executions/{ex}/stream", headers={"Last-Event-ID": first[0]["id"]}
    )  # ends at the terminal state
    data = [e for e in rest if "id" in e]
    assert first[0]["id"] not in [e["id"] for e in data]
    assert '"COMPLETED"' in data[-1]["data"] and len(data) == 2


def test_sse_keepalive_and_bearer_token(cluster, tmp_path: Path) -> None:
    dep = deployment(cluster, tmp_path)
    play(
        dep,
        [
            ExecutionStatusChanged(
                event_id="k-1",
                execution_id="k",
                sequence=1,
                status=ExecutionStatus.RUNNING,
                occurred_at=T0,
            ),
            Tick(T0 + timedelta(seconds=1)),
        ],
    )
    env = {"VIGIL_API_TOKEN": "s3cret", "VIGIL_SSE_KEEPALIVE": "0.5"}
    with worker(dep, env=env) as w:
        base = f"http://127.0.0.1:{w.web_port}"
        dep.read_until([dep.topics.execution_state.name], lambda rs: len(rs) >= 1)
        assert httpx.get(f"{base}/v1/executions/k", timeout=10).status_code == 401
        assert httpx.get(f"{base}/metrics", timeout=10).status_code == 401
        # every path, Faust's own index page at / and paths that do not exist included
        assert httpx.get(f"{base}/", timeout=10).status_code == 401
        assert httpx.get(f"{base}/no-such-path", timeout=10).status_code == 401
        wrong = {"Authorization": "Bearer s3cre"}
        assert httpx.get(f"{base}/", headers=wrong, timeout=10).status_code == 401
        auth = {"Authorization": "Bearer s3cret"}
        assert httpx.get(f"{base}/", headers=auth, timeout=10).status_code == 200
        assert httpx.get(f"{base}/v1/executions/k", headers=auth, timeout=10).status_code == 200
        events = _sse(
            base,
            "/v1/executions/k/stream",
            headers=auth,
            until=lambda es: any("comment" in e for e in es),
        )
        assert any(e.get("comment") == ": keep-alive" for e in events)
        log = w.log_path.read_text()
    assert "s3cret" not in log


def test_status_and_watch_commands(running) -> None:
    from typer.testing import CliRunner

    from streams.cli.main import _mount_optional
    from streams.cli.main import app as cli

    _mount_optional()
    _, base = running
    runner = CliRunner(env={"COLUMNS": "220"})
    res = runner.invoke(cli, ["status", "exec-refund", "--url", base])
    assert res.exit_code == 0, res.output
    assert "op-refund-1" in res.output and "UNKNOWN" in res.output
    res = runner.invoke(cli, ["status", "exec-refund", "--url", base, "--json"])
    assert res.exit_code == 0
    import json

    assert json.loads(res.stdout)["operations"][0]["retry"] == "FORBIDDEN"
    res = runner.invoke(cli, ["status", "nobody", "--url", base])
    assert res.exit_code == 1
    res = runner.invoke(cli, ["status", "exec-deploy", "--url", base])
    assert res.exit_code == 0, res.output
    headline = res.stdout.splitlines()[0]
    assert "status unknown" in headline and "in flight: 1 open approval" in headline, headline
    assert "closed" not in headline
    res = runner.invoke(cli, ["watch", "exec-invoice-run", "--url", base])
    assert res.exit_code == 0, res.output
    assert "COMPLETED" in res.output and "op-email-1" in res.output
    # every change is readable: an execution's state that is not its end says its status,
    # since when, and what is open (no bare record name)
    lines = res.stdout.strip().splitlines()
    assert not [line for line in lines if "ExecutionState" in line], lines
    changes = [line for line in lines if " execution " in line and "COMPLETED" not in line]
    assert changes and all(" since " in line and "open: " in line for line in changes), lines


def test_two_workers_redirect_to_the_owner(cluster, tmp_path: Path) -> None:
    import time

    dep = deployment(cluster, tmp_path, partitions=4)
    ids = [f"multi-{i}" for i in range(12)]
    play(
        dep,
        [
            ExecutionStatusChanged(
                event_id=f"{x}-1",
                execution_id=x,
                sequence=1,
                status=ExecutionStatus.RUNNING,
                occurred_at=T0,
            )
            for x in ids
        ]
        + [
            ApprovalRequested(
                event_id=f"{x}-req",
                execution_id=x,
                request_id=f"{x}-req",
                action="refund",
                action_digest="d1",
                occurred_at=T0,
            )
            for x in ids
        ]
        + [Tick(T0 + timedelta(seconds=1))],
    )
    with worker(dep) as a, worker(dep) as b:
        bases = [f"http://127.0.0.1:{w.web_port}" for w in (a, b)]
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            codes = {
                (base, x): httpx.get(f"{base}/v1/executions/{x}", timeout=10).status_code
                for base in bases
                for x in ids
            }
            # settled: every id is served by exactly one worker and redirected by the other
            if all(sorted(codes[(base, x)] for base in bases) == [200, 307] for x in ids):
                break
            time.sleep(1)
        else:
            raise AssertionError(f"workers never settled: {codes}")
        for x in ids:
            for base in bases:
                r = httpx.get(f"{base}/v1/executions/{x}", timeout=10, follow_redirects=True)
                assert r.status_code == 200 and r.json()["execution_id"] == x
        served = {base: sum(codes[(base, x)] == 200 for x in ids) for base in bases}
        assert all(n > 0 for n in served.values()), served
        # an approval id names no partition: a worker without it asks the other one
        deadline = time.monotonic() + 30
        while True:
            got = {
                (base, x): httpx.get(f"{base}/v1/approvals/{x}-req", timeout=30)
                for base in bases
                for x in ids
            }
            if all(r.status_code == 200 for r in got.values()) or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert {k: r.status_code for k, r in got.items()} == {k: 200 for k in got}
        assert all(r.json()["execution_id"] == x for (_, x), r in got.items())
        for base in bases:
            assert httpx.get(f"{base}/v1/approvals/nope", timeout=30).status_code == 404
