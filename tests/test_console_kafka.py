"""``vigil console`` on the real broker: the demo played through a real worker, the console
as a subprocess reading the output topics; a kill -9 during catch-up and a rebuild from an
empty file give the same answers, and two replicas answer the same."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from streams.contracts.models.enums import ExecutionStatus
from streams.contracts.models.outputs import ApprovalVerdict, ExecutionState, OperationState
from streams.local.scenario import REFERENCE_AT, demo_scenario
from tests.support import Deployment, deployment, free_port, play, worker

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(150)]
#: extra execution states published straight to the output topic, so that catching up takes
#: long enough to be interrupted
BULK = 50_000


@pytest.fixture(scope="module")
def demo(cluster, tmp_path_factory) -> Deployment:
    dep = deployment(cluster, tmp_path_factory.mktemp("console"))
    play(dep, demo_scenario())
    t0 = time.monotonic()
    with worker(dep):

        def done(rs: list[Any]) -> bool:
            stuck = any(
                isinstance(r.record, ApprovalVerdict)
                and r.record.evaluated_at > REFERENCE_AT - timedelta(minutes=5)
                for r in rs
            )
            unknown = any(
                isinstance(r.record, OperationState)
                and r.record.operation_id == "op-refund-1"
                and r.record.status == "UNKNOWN"
                for r in rs
            )
            return stuck and unknown

        dep.read_until(
            [dep.topics.approval_verdicts.name, dep.topics.operation_state.name], done, 60
        )
    print(f"demo through the worker: {time.monotonic() - t0:.1f} s")
    return dep


@contextmanager
def console(dep: Deployment, db: Path, **env: str) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    port = free_port()
    log = dep.workdir / f"console-{uuid.uuid4().hex[:6]}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "streams.cli.main",
                "console",
                "--port",
                str(port),
                "--db",
                str(db),
            ],
            env=dep.env() | env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=dep.workdir,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"console exited {proc.returncode}:\n{log.read_text()}")
            try:
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        proc.log_path = log  # type: ignore[attr-defined]
        yield proc, base
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


def caught_up(base: str, timeout: float = 40.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lag = httpx.get(f"{base}/api/lag", timeout=5).json()
        if lag["caught_up"] and all(p["log_end"] >= 0 for p in lag["partitions"]):
            return lag
        time.sleep(0.2)
    raise AssertionError(f"not caught up: {lag}")


def _timeless(body: Any) -> Any:
    """``body`` without what depends on when it was asked: the lag, the freshness, now, and
    the ages measured from now."""
    if isinstance(body, dict):
        drop = {"age_seconds", "lag", "fresh_at", "now"}
        return {k: _timeless(v) for k, v in body.items() if k not in drop}
    if isinstance(body, list):
        return [_timeless(v) for v in body]
    return body


def answers(base: str) -> dict[str, Any]:
    """Every query answer that two complete views must agree on (the lag aside)."""
    out: dict[str, Any] = {}

    def get(path: str, **params: str) -> Any:
        r = httpx.get(f"{base}{path}", params=params, timeout=10)
        assert r.status_code == 200, r.text
        return _timeless(r.json())

    out["summary"] = get("/api/summary")
    for name in ("approvals", "operations", "alerts", "work-items"):
        out[name] = get(f"/api/{name}", limit="500")
    out["work-items-all"] = get("/api/work-items", open="false", limit="500")
    items, cursor, pages = [], None, 0
    while True:  # every execution, walked by cursor
        page = get("/api/executions", limit="500", **({"cursor": cursor} if cursor else {}))
        items += page["items"]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    out["executions"] = items
    for ex in ("exec-deploy", "exec-refund", "exec-sms-reminder"):
        out[ex] = get(f"/api/executions/{ex}")
        out[f"{ex}/timeline"] = get(f"/api/executions/{ex}/timeline")
    return out


def publish_bulk(dep: Deployment) -> None:
    from datetime import UTC, datetime

    p = dep.producer()
    t = datetime(2026, 7, 26, 15, 0, tzinfo=UTC)
    for i in range(BULK):
        p.send(
            dep.topics.execution_state.name,
            ExecutionState(
                execution_id=f"ex-bulk-{i:05d}",
                status=ExecutionStatus.RUNNING,
                since=t + timedelta(milliseconds=i),
                first_seen_at=t,
                last_event_at=t + timedelta(milliseconds=i),
                last_sequence=1,
                terminal=False,
                state_id=f"bulk-{i}",
            ),
        )
    p.flush()


def test_console_shows_the_demo_and_survives_kill_and_rebuild(demo: Deployment) -> None:
    dep = demo
    t0 = time.monotonic()
    db_a = dep.workdir / "a" / "console.sqlite3"
    with console(dep, db_a) as (_, base):
        caught_up(base)
        # the stuck approval with its owner and next step
        r = httpx.get(f"{base}/api/approvals", params={"verdict": "STUCK_AFTER_DECISION"})
        assert r.status_code == 200
        (stuck,) = r.json()["items"]
        assert stuck["request_id"] == "req-deploy" and stuck["owner"] == "RUNTIME_OWNER"
        assert stuck["next_step"] and stuck["action"] and stuck["age_seconds"] > 0
        # its age runs to now on the wall clock, not to the newest record (minutes after it)
        started = datetime.fromisoformat(stuck["started_at"])
        lasted = (datetime.now(UTC) - started).total_seconds()
        assert lasted - 60 <= stuck["age_seconds"] <= lasted, stuck
        # "as of": when the view last held everything on the topics, a moment ago
        lag = httpx.get(f"{base}/api/lag", timeout=10).json()
        fresh = datetime.fromisoformat(lag["as_of"]["fresh_at"])
        assert timedelta(0) <= datetime.now(UTC) - fresh < timedelta(seconds=30), lag["as_of"]
        assert fresh > datetime.fromisoformat(lag["as_of"]["event_time"])
        # the UNKNOWN operation, owned by whoever reconciles with the connector
        (op,) = httpx.get(f"{base}/api/operations", params={"status": "UNKNOWN"}).json()["items"]
        assert op["operation_id"] == "op-refund-1" and op["owner"] == "CONNECTOR_OWNER"
        body = httpx.get(f"{base}/api/work-items").json()
        assert {w["operation_id"] for w in body["items"]} == {"op-refund-1"}
        assert body["as_of"]["lag"] == 0 and body["as_of"]["event_time"]
        # bad input: 400 with the allowed values
        bad = httpx.get(f"{base}/api/operations", params={"status": "SORT_OF"})
        assert bad.status_code == 400 and "UNKNOWN" in bad.json()["allowed"]["status"]
        assert httpx.get(f"{base}/api/executions/nope").status_code == 404
    demo_seconds = time.monotonic() - t0

    publish_bulk(dep)
    # kill -9 while it catches up with the bulk
    with console(dep, db_a) as (proc, base):
        deadline = time.monotonic() + 30
        while True:
            lag = httpx.get(f"{base}/api/lag", timeout=5).json()
            applied = sum(p["applied"] or 0 for p in lag["partitions"])
            if lag["lag"] and applied > 200:
                break
            assert time.monotonic() < deadline, lag
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
    assert lag["lag"] > 0, "killed after catching up: nothing was interrupted"

    t1 = time.monotonic()
    db_b = dep.workdir / "b" / "console.sqlite3"
    with console(dep, db_a) as (_, base_a), console(dep, db_b) as (_, base_b):
        caught_up(base_a)
        caught_up(base_b)
        rebuild_seconds = time.monotonic() - t1
        restarted, replica = answers(base_a), answers(base_b)
    assert len(restarted["executions"]) == BULK + len(
        [e for e in replica["executions"] if not e["execution_id"].startswith("ex-bulk")]
    )
    assert restarted == replica, "the restarted view differs from another replica's"

    # the view is a cache: delete the file, restart, the same answers
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db_a}{suffix}").unlink(missing_ok=True)
    with console(dep, db_a) as (_, base):
        caught_up(base)
        rebuilt = answers(base)
    assert rebuilt == replica
    print(
        f"demo view {demo_seconds:.1f} s; restart + fresh replica caught up with "
        f"{BULK} records in {rebuild_seconds:.1f} s; total {time.monotonic() - t0:.1f} s"
    )


def test_window_of_the_non_compacted_topics(demo: Deployment) -> None:
    """VIGIL_CONSOLE_ALERTS_SINCE counts back from each partition's newest record: a short
    window reads only the latest verdicts and alerts; the state topics are always read whole."""
    with console(
        demo, demo.workdir / "w" / "console.sqlite3", VIGIL_CONSOLE_ALERTS_SINCE="1ms"
    ) as (_, base):
        caught_up(base)
        lag = httpx.get(f"{base}/api/lag").json()
        verdicts = [
            p for p in lag["partitions"] if p["topic"] == demo.topics.approval_verdicts.name
        ]
        state = [p for p in lag["partitions"] if p["topic"] == demo.topics.operation_state.name]
        summary = httpx.get(f"{base}/api/summary").json()
        assert summary["operations_by_status"]["UNKNOWN"] == 1  # the state topic, whole
        approvals = httpx.get(f"{base}/api/approvals", params={"limit": "500"}).json()["items"]
        # within 1 ms of each partition's newest verdict: at most a few
        total_verdicts = sum(p["log_end"] for p in verdicts)
        assert 0 < len(approvals) < total_verdicts
        assert all(p["applied"] == p["log_end"] for p in state + verdicts if p["log_end"] > 0)
