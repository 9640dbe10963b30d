"""Benchmark of ``vigil console``: catch-up from the topics, output-to-page latency, list queries,
the page in a browser.

Run from the repository root against a running cluster (``vigil dev up`` prints the env):

    python -m bench.console --executions 100000 --events 24000 --out /tmp/console.json

Sections (``--sections``, comma-separated, default all):

- ``catchup``: synthetic output records of ``--executions`` in-flight executions (every one
  RUNNING, waiting for a tool or for an approval; operations, approval verdicts, work items
  and alerts among them) are produced onto a fresh deployment's five output topics; then a
  real ``vigil console`` starts on an empty view and reads them. Figure: records applied per
  second, from the first record applied to the last (and from the process start).
- ``queries``: on that same console (its view filled through its own consumer), the p50/p99
  of list pages over HTTP, ``limit=50``: executions by status, approvals by verdict, the
  page's own lists, the summary, and cursor walks.
- ``page``: on that same console, Debian's chromium (Playwright, headless): a fresh tab's first
  paint (navigation start to the first rows of the attention list), and the time each filter
  control takes to be answered on the page (the server's filter and count, the fetch, the
  render), ``--page-rounds`` times each.
- ``latency``: one real worker, the real ticker, a console on an empty view and an observer
  that follows ``/api/stream`` like the page (SSE ``change`` frames, then after the page's
  200 ms debounce the fetches the page makes for those kinds). Inputs offered at ``--rate``
  events/s. Figures per output record: its LogAppendTime to the SSE frame that names it, and
  to the end of the first refresh whose answers include it (their ``as_of`` offsets are past
  the record's offset).
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from confluent_kafka import Consumer, TopicPartition

from bench import harness as h
from bench.sections import dist
from bench.workload import plan
from streams.console.view import _summary
from streams.contracts.models.base import Record
from streams.contracts.models.enums import (
    AlertKind,
    AlertStatus,
    ApprovalVerdictCode,
    ExecutionStatus,
    OperationStatus,
    Owner,
    RetryVerdict,
    Severity,
    WorkItemKind,
)
from streams.contracts.models.outputs import (
    Alert,
    ApprovalVerdict,
    ExecutionState,
    OperationState,
    ReconciliationWorkItem,
    Thresholds,
)
from streams.kafka.partitioning import partition_of
from streams.settings import Settings

ALL = ("catchup", "queries", "page", "latency")
#: The lists a change of each kind makes the page fetch again (KIND_LISTS in
#: streams/console/static/app.js), on its first view, the attention list.
KIND_FETCHES = {
    "approval": ("attention",),
    "operation": ("attention",),
    "work_item": ("attention",),
    "alert": ("attention",),
    "execution": (),
}
ATTENTION_VERDICTS = ("STUCK_AFTER_DECISION", "ORPHANED_WAIT", "UNROUTABLE_WAIT", "STALE_REQUEST")
PAGE_SIZE = 50  # the page's page size
#: the first page of the page's first view
ATTENTION_PAGE = f"/api/attention?sort=severity&limit={PAGE_SIZE}"
DEBOUNCE_S = 0.2  # the page's debounce after a change frame
SUMMARY_EVERY_S = 1.0  # the page reads the summary at most this often

Log = Callable[[str], None]


# -- a console process --------------------------------------------------------------------------
@dataclass
class ConsoleProc:
    proc: subprocess.Popen[bytes]
    base: str
    log_path: Path
    started: float  # time.time() at launch


@contextmanager
def console(dep: h.Deployment, db: Path, **env: str) -> Iterator[ConsoleProc]:
    """``vigil console`` on ``db`` (a subprocess), up when /healthz answers 200."""
    port = h.free_port()
    log_path = dep.workdir / f"console-{uuid.uuid4().hex[:6]}.log"
    extra = {"VIGIL_CONSOLE_ALERTS_SINCE": "all"} | env
    t0 = time.time()
    with log_path.open("wb") as out:
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
            env=dep.env(**extra),
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=dep.workdir,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"console exited {proc.returncode}:\n{log_path.read_text()}")
            try:
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"console not up:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.05)
        yield ConsoleProc(proc, base, log_path, t0)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


def applied_and_end(client: httpx.Client, base: str) -> tuple[int, int | None]:
    """Records applied (sum of next offsets) and the sum of log ends (None while unknown)."""
    lag = client.get(f"{base}/api/lag", timeout=10).json()
    applied = sum(lag["as_of"]["offsets"].values())
    ends = [p["log_end"] for p in lag["partitions"]]
    return applied, (sum(ends) if ends and all(e >= 0 for e in ends) else None)


# -- synthetic in-flight outputs ----------------------------------------------------------------
def inflight_outputs(executions: int, start: datetime, seed: int = 18) -> list[Record]:
    """Output records of ``executions`` executions in flight, as a worker would have published
    them: every execution RUNNING (sequence 1); then 3 % stay PLANNING, 22 % RUNNING, 50 %
    wait for a tool (an operation SENT; a fifth of those UNKNOWN with their work item and
    alert), 25 % wait for an approval (verdicts: 60 % WAITING, the rest in the four verdicts
    the page calls for attention, each with its alert)."""
    rng = random.Random(seed)
    out: list[Record] = []
    verdicts = [ApprovalVerdictCode.WAITING] * 12 + [
        ApprovalVerdictCode.STUCK_AFTER_DECISION,
        ApprovalVerdictCode.STUCK_AFTER_DECISION,
        ApprovalVerdictCode.ORPHANED_WAIT,
        ApprovalVerdictCode.ORPHANED_WAIT,
        ApprovalVerdictCode.UNROUTABLE_WAIT,
        ApprovalVerdictCode.STALE_REQUEST,
        ApprovalVerdictCode.STALE_REQUEST,
        ApprovalVerdictCode.STALE_REQUEST,
    ]
    owners = {
        ApprovalVerdictCode.WAITING: Owner.APPROVER,
        ApprovalVerdictCode.STUCK_AFTER_DECISION: Owner.RUNTIME_OWNER,
        ApprovalVerdictCode.ORPHANED_WAIT: Owner.REQUESTER,
        ApprovalVerdictCode.UNROUTABLE_WAIT: Owner.POLICY_OWNER,
        ApprovalVerdictCode.STALE_REQUEST: Owner.POLICY_OWNER,
    }
    for k in range(executions):
        ex = f"ex-c-{k:07d}"
        t = start + timedelta(milliseconds=10 * k)

        def state(
            seq: int,
            status: ExecutionStatus,
            at: datetime,
            ex: str = ex,
            t: datetime = t,
            **kw: Any,
        ) -> ExecutionState:
            return ExecutionState(
                execution_id=ex,
                status=status,
                since=at,
                first_seen_at=t,
                last_event_at=at,
                last_sequence=seq,
                terminal=False,
                state_id=f"{ex}-s{seq}",
                **kw,
            )

        x = rng.randrange(100)
        if x < 3:
            out.append(state(1, ExecutionStatus.PLANNING, t))
            continue
        out.append(state(1, ExecutionStatus.RUNNING, t))
        t2 = t + timedelta(seconds=1)
        if x < 25:
            continue
        if x < 75:
            op = f"{ex}-op1"
            out.append(state(2, ExecutionStatus.WAITING_FOR_TOOL, t2, open_operation_ids=(op,)))
            common = dict(
                operation_id=op,
                execution_id=ex,
                attempt=1,
                idempotency_key=f"idem-{op}",
                connector=rng.choice(("payments", "mail", "crm")),
            )
            out.append(
                OperationState(
                    status=OperationStatus.SENT,
                    retry=RetryVerdict.WAIT,
                    since=t2,
                    reply_due_at=t2 + timedelta(minutes=5),
                    state_id=f"{op}-1-sent",
                    **common,  # type: ignore[arg-type]
                )
            )
            if x < 35:  # the reply deadline passed: UNKNOWN, a work item, an alert
                t3 = t2 + timedelta(minutes=5)
                wi = f"{op}-1-wi"
                out.append(
                    OperationState(
                        status=OperationStatus.UNKNOWN,
                        retry=RetryVerdict.FORBIDDEN,
                        since=t3,
                        open_work_item_id=wi,
                        state_id=f"{op}-1-unknown",
                        **common,  # type: ignore[arg-type]
                    )
                )
                out.append(
                    ReconciliationWorkItem(
                        work_item_id=wi,
                        kind=WorkItemKind.REPLY_TIMEOUT,
                        deadline=t3 + timedelta(hours=1),
                        created_at=t3,
                        **common,  # type: ignore[arg-type]
                    )
                )
                out.append(
                    Alert(
                        alert_id=f"{op}-1-alert",
                        kind=AlertKind.OPERATION_UNKNOWN,
                        status=AlertStatus.FIRING,
                        severity=Severity.CRITICAL,
                        execution_id=ex,
                        subject_id=op,
                        verdict="UNKNOWN",
                        owner=Owner.CONNECTOR_OWNER,
                        next_step="check the connector's source before any retry",
                        occurred_at=t3,
                    )
                )
            continue
        rid = f"{ex}-req1"
        out.append(state(2, ExecutionStatus.WAITING_FOR_APPROVAL, t2, open_approval_ids=(rid,)))
        verdict = rng.choice(verdicts)
        t3 = t2 + timedelta(seconds=30)
        out.append(
            ApprovalVerdict(
                verdict_id=f"{rid}-v1",
                request_id=rid,
                execution_id=ex,
                verdict=verdict,
                owner=owners[verdict],
                next_step="wait for the approver" if verdict == "WAITING" else "escalate",
                thresholds=Thresholds(
                    grace_ms=60_000,
                    heartbeat_fresh_ms=120_000,
                    delivery_deadline_ms=300_000,
                    evaluated_at=t3,
                ),
                evaluated_at=t3,
                action=rng.choice(("refund", "deploy", "delete")),
                requested_at=t2,
            )
        )
        if verdict != ApprovalVerdictCode.WAITING:
            out.append(
                Alert(
                    alert_id=f"{rid}-alert",
                    kind=AlertKind.APPROVAL_VERDICT,
                    status=AlertStatus.FIRING,
                    severity=Severity.WARNING,
                    execution_id=ex,
                    subject_id=rid,
                    verdict=verdict.value,
                    owner=owners[verdict],
                    next_step="escalate",
                    occurred_at=t3,
                )
            )
    return out


def topic_for(dep: h.Deployment, record: Record) -> str:
    t = dep.topics
    return {
        "ExecutionState": t.execution_state.name,
        "OperationState": t.operation_state.name,
        "ApprovalVerdict": t.approval_verdicts.name,
        "ReconciliationWorkItem": t.reconciliation_work.name,
        "WorkItemResolution": t.reconciliation_work.name,
        "Alert": t.alerts.name,
    }[record.avro_name]


def encode_outputs(dep: h.Deployment, records: list[Record]) -> list[h.Wire]:
    """Keyed and partitioned like the worker's outputs (murmur2 of the record's key)."""
    n = dep.settings.partitions
    out = []
    for i, r in enumerate(records):
        topic = topic_for(dep, r)
        key = r.kafka_key() or ""
        ts = int(getattr(r, r.time_field).timestamp() * 1000)  # type: ignore[arg-type]
        out.append(
            h.Wire(topic, partition_of(key, n), key.encode(), dep.codec.encode(topic, r), ts, i)
        )
    return out


def console_topic_names(dep: h.Deployment) -> list[str]:
    t = dep.topics
    return [
        t.execution_state.name,
        t.operation_state.name,
        t.approval_verdicts.name,
        t.reconciliation_work.name,
        t.alerts.name,
    ]


# -- catch-up -----------------------------------------------------------------------------------
def catchup(cp: ConsoleProc, total: int, log: Log, timeout: float = 1800.0) -> dict[str, Any]:
    """Poll /api/lag every 0.2 s until ``total`` records are applied."""
    samples: list[tuple[float, int]] = []
    first_at: float | None = None
    with httpx.Client() as client:
        deadline = time.monotonic() + timeout
        last_log = time.monotonic()
        while True:
            applied, _ = applied_and_end(client, cp.base)
            now = time.time()
            samples.append((now, applied))
            if applied and first_at is None:
                first_at = now
            if applied >= total:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"console applied {applied:,} of {total:,} in {timeout} s")
            if time.monotonic() - last_log > 10:
                log(f"  applied {applied:,} / {total:,}")
                last_log = time.monotonic()
            time.sleep(0.2)
    done_at = samples[-1][0]
    assert first_at is not None
    # the steady rate: between 10 % and 90 % of the records
    lo = next(t for t, a in samples if a >= total * 0.1)
    hi = next(t for t, a in samples if a >= total * 0.9)
    lo_a = next(a for t, a in samples if a >= total * 0.1)
    hi_a = next(a for t, a in samples if a >= total * 0.9)
    # Below a few poll intervals the first-applied clock says nothing: the rate from the start.
    span = done_at - first_at if done_at - first_at >= 1.0 else done_at - cp.started
    return {
        "records": total,
        "from_start_s": done_at - cp.started,
        "from_first_applied_s": done_at - first_at,
        "records_per_s": total / max(1e-9, span),
        "records_per_s_from_start": total / max(1e-9, done_at - cp.started),
        "records_per_s_10_to_90pct": (hi_a - lo_a) / (hi - lo) if hi - lo >= 1.0 else None,
        "console_cpu_s": h.cpu_seconds(cp.proc.pid),
        "console_rss_mib": h.rss_bytes(cp.proc.pid) / 2**20,
        "poll_interval_s": 0.2,
    }


# -- queries ------------------------------------------------------------------------------------
def queries(cp: ConsoleProc, repeat: int, walk_pages: int, log: Log) -> dict[str, Any]:
    """p50/p99 of each list page over HTTP (one keep-alive client, one request at a time)."""
    cases: list[tuple[str, str, dict[str, str]]] = []
    for s in ("WAITING_FOR_TOOL", "WAITING_FOR_APPROVAL", "RUNNING", "PLANNING", "COMPLETED"):
        cases.append((f"executions status={s}", "/api/executions", {"status": s, "limit": "50"}))
    cases.append(
        (
            "executions status=WAITING_FOR_TOOL sort=-since",
            "/api/executions",
            {"status": "WAITING_FOR_TOOL", "sort": "-since", "limit": "50"},
        )
    )
    cases.append(("executions (no filter)", "/api/executions", {"limit": "50"}))
    for v in ("WAITING", *ATTENTION_VERDICTS):
        cases.append(
            (
                f"approvals verdict={v} open=true",
                "/api/approvals",
                {"verdict": v, "open": "true", "limit": "50"},
            )
        )
    cases.append(
        (
            "approvals owner=POLICY_OWNER action=refund",
            "/api/approvals",
            {"owner": "POLICY_OWNER", "action": "refund", "limit": "50"},
        )
    )
    cases.append(("approvals (default: open, oldest wait)", "/api/approvals", {"limit": "50"}))
    cases.append(("operations status=UNKNOWN", "/api/operations", {"status": "UNKNOWN"}))
    cases.append(("work-items open=true", "/api/work-items", {"open": "true"}))
    cases.append(("alerts status=FIRING", "/api/alerts", {"status": "FIRING"}))
    for name, params in (
        ("attention (first view: severity, then age)", {}),
        ("attention sort=age", {"sort": "age"}),
        ("attention owner=POLICY_OWNER", {"owner": "POLICY_OWNER"}),
        ("attention kind=operation", {"kind": "operation"}),
        ("attention q=ex-c-00012 (rare)", {"q": "ex-c-00012"}),
        ("attention q=payments (common)", {"q": "payments"}),
    ):
        cases.append((name, "/api/attention", {"limit": "50"} | params))
    cases.append(("alerts sort=severity", "/api/alerts", {"sort": "severity", "limit": "50"}))
    cases.append(("executions q=ex-c-00999", "/api/executions", {"q": "ex-c-00999", "limit": "50"}))
    cases.append(("summary", "/api/summary", {}))
    out: dict[str, Any] = {"repeat": repeat, "pages": {}}
    with httpx.Client(base_url=cp.base, timeout=30) as client:
        counts = client.get("/api/summary").json()
        out["summary_counts"] = {k: v for k, v in counts.items() if k != "as_of"}
        for _ in range(3):  # warm the SQLite page cache and the connections
            for _, path, params in cases:
                client.get(path, params=params).raise_for_status()
        for name, path, params in cases:
            times: list[float] = []
            items = 0
            for _ in range(repeat):
                t0 = time.perf_counter()
                r = client.get(path, params=params)
                body = r.json()
                times.append((time.perf_counter() - t0) * 1000)
                r.raise_for_status()
                items = len(body.get("items", ()))
            out["pages"][name] = dist(times) | {"items": items, "path": path, "params": params}
            d = out["pages"][name]
            log(f"  {name}: p50 {d['p50']:.1f} ms, p99 {d['p99']:.1f} ms ({items} items)")
        out["walks"] = {}
        for name, path, params in (
            ("executions status=WAITING_FOR_TOOL limit=50", "/api/executions",
             {"status": "WAITING_FOR_TOOL", "limit": "50"}),
            ("approvals verdict=WAITING open=true limit=50", "/api/approvals",
             {"verdict": "WAITING", "open": "true", "limit": "50"}),
            ("executions (all) limit=500", "/api/executions", {"limit": "500"}),
        ):  # fmt: skip
            times, seen, cursor, pages = [], set(), None, 0
            t_walk = time.perf_counter()
            while pages < walk_pages:
                q = params | ({"cursor": cursor} if cursor else {})
                t0 = time.perf_counter()
                r = client.get(path, params=q)
                body = r.json()
                times.append((time.perf_counter() - t0) * 1000)
                r.raise_for_status()
                pages += 1
                for it in body["items"]:
                    ident = it.get("execution_id") if path.endswith("executions") else None
                    seen.add(ident or it.get("request_id"))
                cursor = body["next_cursor"]
                if cursor is None:
                    break
            out["walks"][name] = dist(times) | {
                "pages": pages,
                "rows": len(seen),
                "complete": cursor is None,
                "walk_s": time.perf_counter() - t_walk,
            }
            d = out["walks"][name]
            log(
                f"  walk {name}: {pages} pages, {len(seen):,} rows, p50 {d['p50']:.1f} ms, "
                f"p99 {d['p99']:.1f} ms, {d['walk_s']:.1f} s"
            )
    return out


# -- the page in a browser ----------------------------------------------------------------------
CHROMIUM = "/usr/bin/chromium"
#: In the page: change a filter control and resolve once the list shows the answer to the
#: query ``expect`` (the page's "vigil:rendered" event), with the milliseconds it took.
_CHANGE_JS = """
async ([selector, value, event, expect]) => {
  const node = document.querySelector(selector);
  const shown = new Promise((resolve) => {
    const seen = (e) => {
      if (e.detail.query === expect) {
        document.removeEventListener("vigil:rendered", seen);
        resolve(e.detail.query);
      }
    };
    document.addEventListener("vigil:rendered", seen);
  });
  const t0 = performance.now();
  node.value = value;
  node.dispatchEvent(new Event(event, { bubbles: true }));
  const query = await shown;
  const rows = document.querySelectorAll("#list-table tbody tr").length;
  return { ms: performance.now() - t0, query, rows };
}
"""


def page(cp: ConsoleProc, rounds: int, log: Log) -> dict[str, Any]:
    """The page in Debian's chromium (Playwright, headless) on the console's view: the first
    paint of a fresh tab, and how long each kind of filter takes to be answered on the page."""
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        raise RuntimeError(f"{CHROMIUM} missing (apt-get install chromium)")
    out: dict[str, Any] = {"rounds": rounds}
    with httpx.Client(base_url=cp.base, timeout=30) as client:
        out["attention_total"] = client.get("/api/attention", params={"limit": "1"}).json()["total"]
        out["executions_total"] = client.get("/api/executions", params={"limit": "1"}).json()[
            "total"
        ]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            first: list[float] = []
            shown: list[float] = []
            nodes = 0
            for _ in range(rounds):
                context = browser.new_context(viewport={"width": 1280, "height": 900})
                tab = context.new_page()
                t0 = time.perf_counter()
                tab.goto(f"{cp.base}/")
                tab.wait_for_selector("#list-table tbody tr", timeout=30_000)
                shown.append((time.perf_counter() - t0) * 1000)
                mark = tab.evaluate("performance.getEntriesByName('vigil:first-rows')[0].startTime")
                first.append(float(mark))
                nodes = int(tab.evaluate("document.getElementsByTagName('*').length"))
                context.close()
            out["first_paint_ms"] = dist(first)
            out["goto_to_rows_ms"] = dist(shown)
            out["dom_elements"] = nodes
            log(
                f"  first paint (navigation start to the first rows): p50 "
                f"{out['first_paint_ms']['p50']:.0f} ms, max {max(first):.0f} ms; "
                f"{nodes:,} DOM elements"
            )
            context = browser.new_context(viewport={"width": 1280, "height": 900})
            tab = context.new_page()
            tab.goto(f"{cp.base}/")
            tab.wait_for_selector("#list-table tbody tr", timeout=30_000)
            top = "sort=severity&limit=50"  # the first view's own query
            cases: list[tuple[str, str, str, str, list[tuple[str, str]]]] = [
                ("attention owner", "#/", "#filter-owner", "change",
                 [("POLICY_OWNER", f"owner=POLICY_OWNER&{top}"), ("", top),
                  ("RUNTIME_OWNER", f"owner=RUNTIME_OWNER&{top}"), ("", top),
                  ("CONNECTOR_OWNER", f"owner=CONNECTOR_OWNER&{top}"), ("", top)]),
                ("attention kind", "#/", "#filter-kind", "change",
                 [("operation", f"kind=operation&{top}"), ("", top),
                  ("work_item", f"kind=work_item&{top}"), ("", top),
                  ("approval", f"kind=approval&{top}"), ("", top)]),
                ("attention sort", "#/", "#filter-sort", "change",
                 [("age", "sort=age&limit=50"), ("-age", "sort=-age&limit=50"),
                  ("severity", top)]),
                ("attention search, typed (with the page's 80 ms debounce)", "#/", "#filter-q",
                 "input",
                 [("ex-c-00012", f"q=ex-c-00012&{top}"), ("payments", f"q=payments&{top}"),
                  ("ex-c-0999", f"q=ex-c-0999&{top}"), ("", top)]),
                ("alerts kind", "#/alerts", "#filter-kind", "change",
                 [("APPROVAL_VERDICT", f"kind=APPROVAL_VERDICT&{top}"), ("", top),
                  ("OPERATION_UNKNOWN", f"kind=OPERATION_UNKNOWN&{top}"), ("", top)]),
                ("executions status", "#/list/executions", "#filter-status",
                 "change",
                 [("WAITING_FOR_TOOL", "status=WAITING_FOR_TOOL&limit=50"), ("", "limit=50"),
                  ("PLANNING", "status=PLANNING&limit=50"), ("", "limit=50")]),
            ]  # fmt: skip
            out["filters"] = {}
            for name, route, selector, event, steps in cases:
                tab.goto(f"{cp.base}/{route}")
                tab.wait_for_selector(selector, timeout=30_000)
                tab.wait_for_selector("#list-table tbody tr", timeout=30_000)
                times: list[float] = []
                for _ in range(rounds):
                    for value, expect in steps:
                        got = tab.evaluate(_CHANGE_JS, [selector, value, event, expect])
                        times.append(float(got["ms"]))
                out["filters"][name] = dist(times)
                d = out["filters"][name]
                log(f"  filter {name}: p50 {d['p50']:.0f} ms, p99 {d['p99']:.0f} ms")
            context.close()
        finally:
            browser.close()
    every = [v["p99"] for v in out["filters"].values()]
    out["filter_p99_ms"] = max(every)
    return out


# -- live latency -------------------------------------------------------------------------------
@dataclass
class Frame:
    at: float
    changes: list[tuple[str, str]]


@dataclass
class Refresh:
    start: float
    end: float
    last_frame: int  # index of the last frame this refresh answers
    covered: dict[str, int]  # "topic/p" -> next offset, the minimum over the answers
    requests: int
    failed: int


@dataclass
class Observer:
    """Follows /api/stream like the page: a reader thread timestamps ``change`` frames; a
    refresher thread, 200 ms after the first frame not yet answered, makes the page's fetches
    for the kinds named (the first page of its attention list, the summary, the lag)
    on six connections, as a browser would."""

    base: str
    debounce: float = DEBOUNCE_S
    frames: list[Frame] = field(default_factory=list)
    refreshes: list[Refresh] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    hello: threading.Event = field(default_factory=threading.Event)
    errors: list[str] = field(default_factory=list)
    _cv: threading.Condition = field(default_factory=threading.Condition)
    _summary_at: float = -1e9

    def start(self) -> None:
        self._threads = [
            threading.Thread(target=self._read, daemon=True),
            threading.Thread(target=self._refresh, daemon=True),
        ]
        for t in self._threads:
            t.start()
        if not self.hello.wait(20):
            raise RuntimeError(f"no hello from /api/stream: {self.errors}")

    def close(self) -> None:
        self.stop.set()
        with self._cv:
            self._cv.notify_all()
        for t in self._threads:
            t.join(10)

    def _read(self) -> None:
        try:
            with (
                httpx.Client(timeout=httpx.Timeout(10, read=None)) as client,
                client.stream("GET", f"{self.base}/api/stream") as r,
            ):
                event = None
                for line in r.iter_lines():
                    if self.stop.is_set():
                        return
                    if line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("data: "):
                        if event == "hello":
                            self.hello.set()
                        elif event == "change":
                            now = time.time()
                            changes = [(c["kind"], c["id"]) for c in json.loads(line[6:])]
                            with self._cv:
                                self.frames.append(Frame(now, changes))
                                self._cv.notify_all()
                    elif line == "":
                        event = None
            if not self.stop.is_set():
                self.errors.append("the stream ended (dropped as a slow subscriber?)")
        except Exception as exc:  # recorded, the run's figures say so
            if not self.stop.is_set():
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def _paths(self, kinds: set[str]) -> list[tuple[str, bool]]:
        """(path, is a list) of what the page on its first view (the attention list)
        fetches after changes of ``kinds``: the lag, the summary at most once a second, and
        the list's page when a change can alter it."""
        names = {n for k in kinds for n in KIND_FETCHES.get(k, ())}
        paths = [("/api/lag", False)]
        now = time.monotonic()
        if now - self._summary_at >= SUMMARY_EVERY_S:
            self._summary_at = now
            paths.append(("/api/summary", False))
        if "attention" in names:
            paths.append((ATTENTION_PAGE, True))
        return paths

    @staticmethod
    def _fetch(client: httpx.Client, path: str, is_list: bool) -> list[dict[str, Any]]:
        """One answer: the page reads one page of a list, never the whole list."""
        r = client.get(path)
        r.raise_for_status()
        return [r.json()]

    def _refresh(self) -> None:
        done = -1
        with (
            httpx.Client(base_url=self.base, timeout=30, limits=httpx.Limits(max_connections=6))
            as client,
            ThreadPoolExecutor(6) as pool,
        ):  # fmt: skip
            while not self.stop.is_set():
                with self._cv:
                    while len(self.frames) - 1 <= done and not self.stop.is_set():
                        self._cv.wait(0.5)
                    if self.stop.is_set():
                        return
                    first = self.frames[done + 1].at
                wait = first + self.debounce - time.time()
                if wait > 0:
                    time.sleep(wait)
                with self._cv:
                    last = len(self.frames) - 1
                    kinds = {k for f in self.frames[done + 1 : last + 1] for k, _ in f.changes}
                start = time.time()
                paths = self._paths(kinds)
                futures = [pool.submit(self._fetch, client, p, lst) for p, lst in paths]
                covered: dict[str, int] = {}
                failed = 0
                requests = 0
                for fut in futures:
                    try:
                        answers = fut.result()
                    except Exception as exc:
                        failed += 1
                        self.errors.append(f"refresh: {type(exc).__name__}: {exc}")
                        continue
                    for body in answers:
                        requests += 1
                        for key, n in body["as_of"]["offsets"].items():
                            covered[key] = min(n, covered.get(key, n))
                end = time.time()
                self.refreshes.append(Refresh(start, end, last, covered, requests, failed))
                done = last


@dataclass(frozen=True, slots=True)
class OutAt:
    topic: str
    partition: int
    offset: int
    append_ms: int
    value: bytes


def read_outputs(settings: Settings, topics: list[str]) -> list[OutAt]:
    """Every record of ``topics`` with its position and LogAppendTime."""
    c = Consumer(
        settings.confluent_conf()
        | {"group.id": f"bench-read-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False}
    )
    try:
        meta = c.list_topics(timeout=10)
        want: dict[tuple[str, int], int] = {}
        tps = []
        for t in topics:
            for p in meta.topics[t].partitions:
                low, high = c.get_watermark_offsets(TopicPartition(t, p), timeout=10)
                if high > low:
                    want[(t, p)] = high
                    tps.append(TopicPartition(t, p, low))
        c.assign(tps)
        out: list[OutAt] = []
        while want:
            for msg in c.consume(10_000, 1.0):
                if msg.error():
                    continue
                tp = (msg.topic(), msg.partition())
                out.append(OutAt(tp[0], tp[1], msg.offset(), msg.timestamp()[1], msg.value()))
                if tp in want and msg.offset() + 1 >= want[tp]:
                    del want[tp]
        return out
    finally:
        c.close()


def match(
    dep: h.Deployment, outs: list[OutAt], frames: list[Frame], refreshes: list[Refresh]
) -> dict[str, Any]:
    """For each output record R: the first refresh whose answers all include R (as_of past R's
    offset), and the SSE frame that named R (the first frame naming R's kind and id after the
    frames the previous refresh answered: R was applied after that refresh read the view, so
    its frame came later, and a later record of the same id comes after R's frame)."""
    by_key: dict[tuple[str, str], list[int]] = {}
    for j, f in enumerate(frames):
        for c in f.changes:
            lst = by_key.setdefault(c, [])
            if not lst or lst[-1] != j:
                lst.append(j)
    cov: dict[str, list[int]] = {}
    sse: list[float] = []
    shown: list[float] = []
    sse_to_shown: list[float] = []
    by_kind: dict[str, list[float]] = {}
    unmatched = 0
    unmatched_kinds: dict[str, int] = {}
    unshown = 0
    for o in outs:
        key = f"{o.topic}/{o.partition}"
        if key not in cov:
            cov[key] = [r.covered.get(key, 0) for r in refreshes]
        k = bisect.bisect_right(cov[key], o.offset)  # first refresh with next offset > offset
        if k >= len(refreshes):
            unshown += 1
            continue
        rec = dep.codec.decode(o.topic, o.value)
        kind, subject, _ = _summary(rec)
        lower = refreshes[k - 1].last_frame + 1 if k > 0 else 0
        idx = by_key.get((kind, subject), [])
        i = bisect.bisect_left(idx, lower)
        end_ms = refreshes[k].end * 1000
        shown.append(end_ms - o.append_ms)
        by_kind.setdefault(kind, []).append(end_ms - o.append_ms)
        # R's frame may come after refresh k read the view, not after the next one did
        upper = refreshes[k + 1].last_frame if k + 1 < len(refreshes) else len(frames) - 1
        if i < len(idx) and idx[i] <= upper:
            f_ms = frames[idx[i]].at * 1000
            sse.append(f_ms - o.append_ms)
            sse_to_shown.append(end_ms - f_ms)
        else:
            unmatched += 1
            unmatched_kinds[kind] = unmatched_kinds.get(kind, 0) + 1
    return {
        "outputs": len(outs),
        "shown_ms": dist(shown),
        "sse_ms": dist(sse),
        "sse_to_shown_ms": dist(sse_to_shown),
        "shown_ms_by_kind": {k: dist(v) for k, v in sorted(by_kind.items())},
        "not_shown_by_a_refresh": unshown,
        "no_frame_found": unmatched,
        "no_frame_found_by_kind": unmatched_kinds,
        "frames": len(frames),
        "refreshes": len(refreshes),
        "refresh_ms": dist([(r.end - r.start) * 1000 for r in refreshes]),
        "requests_per_refresh": dist([float(r.requests) for r in refreshes]),
        "failed_fetches": sum(r.failed for r in refreshes),
    }


def live(
    base: Settings, workdir: Path, events: int, rate: float, tick: str, log: Log
) -> dict[str, Any]:
    """One worker, the ticker, a console on an empty view and the page-like observer; inputs
    at ``rate`` events/s on a fixed schedule (the workload of bench.run's latency section)."""
    dep = h.deployment(base, workdir, "conlat")
    per_exec = 11.8
    executions = max(1, int(events / per_exec))
    spacing = timedelta(seconds=per_exec / rate)
    lead = 15.0 + executions * per_exec * 60e-6
    start = datetime.now(UTC) + timedelta(seconds=lead)
    planned = plan(
        executions,
        start=start,
        spacing=spacing,
        step=timedelta(milliseconds=100),
        deadline=timedelta(seconds=2),
        run="cl",
    )
    wires = h.encode(dep, planned, ())
    errors: list[str] = []
    behind: list[float] = []
    log(f"  live: {len(wires):,} events at {rate:,.0f}/s")
    db = dep.workdir / "console.sqlite3"
    with (
        h.workers(dep, 1) as procs,
        h.ticker(dep, tick),
        console(dep, db) as cp,
    ):
        h.wait_group_stable(dep, 1)
        obs = Observer(cp.base)
        obs.start()
        p = h.producer(base, **{"linger.ms": 1})
        cpu0 = h.cpu_seconds(cp.proc.pid)
        wcpu0 = h.cpu_seconds(procs[0].pid)
        wait = start.timestamp() - time.time()
        if wait > 0:
            time.sleep(wait)
        else:
            log(f"  ! encoding overran the lead by {-wait:.1f}s")

        def report(err: Any, _msg: Any) -> None:
            if err is not None:
                errors.append(str(err))

        for w in wires:
            due = w.ts_ms / 1000
            now = time.time()
            if due > now:
                time.sleep(due - now)
                now = time.time()
            behind.append(now - due)
            p.produce(
                w.topic,
                value=w.value,
                key=w.key,
                partition=w.partition,
                timestamp=w.ts_ms,
                on_delivery=report,
            )
            p.poll(0)
        p.flush(30)
        sent_s = time.time() - start.timestamp()
        time.sleep(7)  # the last deadlines pass and are judged
        off = h.Offsets(base, console_topic_names(dep))
        h.wait_outputs(off, {}, settle=4.0, timeout=900.0)
        off.close()
        with httpx.Client() as client:  # the console drains what is left
            t_end = time.monotonic() + 120
            while time.monotonic() < t_end:
                applied, end = applied_and_end(client, cp.base)
                if end is not None and applied >= end:
                    break
                time.sleep(0.2)
        time.sleep(1.5)  # the last refresh
        obs.close()
        cpu1 = h.cpu_seconds(cp.proc.pid)
        wcpu1 = h.cpu_seconds(procs[0].pid)
    outs = read_outputs(base, console_topic_names(dep))
    m = match(dep, outs, obs.frames, obs.refreshes)
    result = {
        "method": (
            "one worker, the real `vigil ticker --interval " + tick + f"`, inputs offered at "
            f"{rate:,.0f} events/s on a fixed schedule (bench.run's latency workload); a "
            "`vigil console` on an empty view started before the inputs; an observer thread "
            "follows /api/stream (SSE) and stamps each `change` frame on receipt; a second "
            "thread, 200 ms after the first unanswered frame (the page's debounce), makes the "
            "fetches the page makes for the kinds named (the lag, the summary at most once a "
            "second, the attention list's first page of 50 when the kinds can change it) on 6 "
            "connections. Per output record of the five console topics: "
            "sse_ms = frame receipt - the record's LogAppendTime; shown_ms = end of the first "
            "refresh whose every answer's as_of offsets are past the record's offset - "
            "LogAppendTime (the record is in what the page fetched). The worker's own part "
            "(input to output append) is bench.run's latency section."
        ),
        "rate": rate,
        "tick_interval": tick,
        "events": len(wires),
        "offered_s": (wires[-1].ts_ms - wires[0].ts_ms) / 1000,
        "sender_behind_ms": dist([b * 1000 for b in behind]),
        "delivery_errors": len(errors),
        "console_cpu_s_per_offered_s": (cpu1 - cpu0) / max(1e-9, sent_s),
        "worker_cpu_s_per_offered_s": (wcpu1 - wcpu0) / max(1e-9, sent_s),
        "observer_errors": obs.errors[:5],
    } | m
    log(
        f"  SSE frame: p50 {m['sse_ms']['p50']} p99 {m['sse_ms']['p99']} ms; shown (fetched): "
        f"p50 {m['shown_ms']['p50']} p99 {m['shown_ms']['p99']} ms over {m['shown_ms']['n']:,} "
        f"outputs ({m['not_shown_by_a_refresh']} not shown, {m['no_frame_found']} no frame)"
    )
    result["deployment"] = dep
    return result


# -- main ---------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.console", description=__doc__.split("\n")[0])
    ap.add_argument(
        "--executions",
        type=int,
        default=100_000,
        help="in-flight executions whose output records the catch-up and query sections use",
    )
    ap.add_argument(
        "--events", type=int, default=24_000, help="input events of the live latency section"
    )
    ap.add_argument("--rate", type=float, default=2000.0, help="offered load, events/s")
    ap.add_argument("--tick", default="100ms", help="ticker interval of the latency section")
    ap.add_argument("--repeat", type=int, default=200, help="requests per query case")
    ap.add_argument("--walk-pages", type=int, default=400, help="pages per cursor walk at most")
    ap.add_argument(
        "--page-rounds", type=int, default=10, help="fresh tabs, and rounds of each filter"
    )
    ap.add_argument("--sections", default=",".join(ALL), help=f"any of {', '.join(ALL)}")
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/vigil-bench-console"))
    ap.add_argument("--keep-topics", action="store_true", help="do not delete the bench topics")
    args = ap.parse_args(argv)
    wanted = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = set(wanted) - set(ALL)
    if unknown:
        ap.error(f"unknown sections {sorted(unknown)}")

    base = Settings.from_env()
    args.workdir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "command": " ".join(
            ["python -m bench.console", *(argv if argv is not None else sys.argv[1:])]
        ),
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": _git("rev-parse", "--short", "HEAD"),
        "nproc": os.cpu_count(),
        "load": [],
        "sections": {},
    }

    def log(msg: str) -> None:
        print(msg, flush=True)

    def heading(msg: str) -> None:
        la = os.getloadavg()
        results["load"].append({"section": msg, "loadavg_1_5_15": la})
        log(f"== {msg} (load {la[0]:.1f} {la[1]:.1f} {la[2]:.1f})")

    s = results["sections"]
    t_all = time.time()
    if "catchup" in wanted or "queries" in wanted or "page" in wanted:
        n = args.executions
        heading(f"catch-up: {n:,} in-flight executions' output records, empty view")
        dep = h.deployment(base, args.workdir, "concat")
        try:
            t0 = time.perf_counter()
            records = inflight_outputs(n, datetime(2026, 7, 26, 8, 0, tzinfo=UTC))
            wires = encode_outputs(dep, records)
            mix: dict[str, int] = {}
            for r in records:
                mix[r.avro_name] = mix.get(r.avro_name, 0) + 1
            log(f"  {len(wires):,} records {mix} built in {time.perf_counter() - t0:.1f} s")
            h.produce_all(base, wires)
            with console(dep, dep.workdir / "console.sqlite3") as cp:
                c = catchup(cp, len(wires), log)
                c |= {"executions": n, "mix": mix, "method": (
                    "synthetic output records of in-flight executions (ExecutionState, "
                    "OperationState, ApprovalVerdict, ReconciliationWorkItem, Alert; Avro, "
                    "keyed and partitioned like the worker's, 6 partitions) produced onto the "
                    "five output topics first; then `vigil console` started on an empty view "
                    "(VIGIL_CONSOLE_ALERTS_SINCE=all) and /api/lag polled every 0.2 s until "
                    "the applied positions reach the records produced. records_per_s = "
                    "records / (all applied - first record applied; from the process start "
                    "when that is under 1 s)"
                )}  # fmt: skip
                s["console_catchup"] = c
                log(
                    f"  caught up on {len(wires):,} records in {c['from_first_applied_s']:.1f} s "
                    f"({c['records_per_s']:,.0f} records/s; {c['from_start_s']:.1f} s from "
                    f"the process start; 10-90 %: {c['records_per_s_10_to_90pct'] or 0:,.0f}/s)"
                )
                if "page" in wanted:
                    heading(f"page: chromium on the console of {n:,} in-flight executions")
                    pg = page(cp, args.page_rounds, log)
                    pg["method"] = (
                        "the catch-up section's console; Debian's chromium (headless, "
                        "Playwright) on the same machine. first_paint_ms: a fresh tab's "
                        "navigation start to the first rows of the attention list rendered "
                        "(the page's performance mark 'vigil:first-rows'); goto_to_rows_ms the "
                        "same from the benchmark's side. Filters: in one tab, a control set "
                        "and its event dispatched in the page, to the list rendered with the "
                        "answer to the new query (the page's 'vigil:rendered' event): the "
                        "server's filter, sort and count, the fetch and the render; the typed "
                        "search includes the page's 80 ms debounce"
                    )
                    s["console_page"] = pg
                if "queries" in wanted:
                    heading(f"queries: list pages over {n:,} in-flight executions")
                    q = queries(cp, args.repeat, args.walk_pages, log)
                    q["method"] = (
                        "the catch-up section's console (its view filled by its own consumer "
                        f"from the topics: {n:,} executions, none terminal); one httpx client "
                        "on a keep-alive connection, one request at a time, time to the whole "
                        "JSON body; each case repeated after 3 warm-up rounds; the walks follow "
                        "next_cursor from the first page"
                    )
                    s["console_queries"] = q
        finally:
            if not args.keep_topics:
                h.delete_deployment(dep)
    if "latency" in wanted:
        heading(f"latency: output to page at {args.rate:,.0f} events/s offered")
        r = live(base, args.workdir, args.events, args.rate, args.tick, log)
        dep = r.pop("deployment")
        s["console_latency"] = r
        if not args.keep_topics:
            h.delete_deployment(dep)
    results["elapsed_s"] = time.time() - t_all
    results["summary"] = summary(s)
    log("== figures")
    for k, v in results["summary"].items():
        log(f"  {k}: {v:,.1f}" if isinstance(v, float) else f"  {k}: {v}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2, default=str) + "\n")
        log(f"wrote {args.out}")
    return 0


def summary(s: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "console_catchup" in s:
        c = s["console_catchup"]
        out["console_catchup_records"] = c["records"]
        out["console_catchup_records_per_s"] = c["records_per_s"]
        out["console_catchup_s_from_start"] = c["from_start_s"]
    if "console_queries" in s:
        pages = s["console_queries"]["pages"]
        out["console_query_executions_p99_ms"] = max(
            v["p99"] for k, v in pages.items() if k.startswith("executions")
        )
        out["console_query_approvals_p99_ms"] = max(
            v["p99"] for k, v in pages.items() if k.startswith("approvals")
        )
        out["console_query_summary_p99_ms"] = pages["summary"]["p99"]
        out["console_cursor_walk_page_p99_ms"] = max(
            v["p99"] for v in s["console_queries"]["walks"].values()
        )
    if "console_page" in s:
        pg = s["console_page"]
        out["console_page_first_paint_p50_ms"] = pg["first_paint_ms"]["p50"]
        out["console_page_first_paint_max_ms"] = pg["first_paint_ms"]["max"]
        out["console_page_filter_p99_ms"] = pg["filter_p99_ms"]
        out["console_page_dom_elements"] = pg["dom_elements"]
    if "console_latency" in s:
        lat = s["console_latency"]
        out["console_sse_p99_ms"] = lat["sse_ms"]["p99"]
        out["console_shown_p50_ms"] = lat["shown_ms"]["p50"]
        out["console_shown_p99_ms"] = lat["shown_ms"]["p99"]
        out["console_latency_rate"] = lat["rate"]
    return out


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(
            ["git", *args], capture_output=True, text=True, check=True, cwd=h.ROOT
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


if __name__ == "__main__":
    raise SystemExit(main())
