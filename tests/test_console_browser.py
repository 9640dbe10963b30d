"""The operator page in a real headless browser (Debian's chromium driven by Playwright) against
the real stack: the bundled demo scenario played through a ``vigil worker`` subprocess, and a
``vigil console`` subprocess reading the worker's output topics.

Set ``VIGIL_UPDATE_SCREENSHOT=1`` to rewrite ``docs/console.png`` from the run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from streams.contracts.models.enums import (
    AlertStatus,
    EvidenceSource,
    ExecutionStatus,
    OperationEventKind,
    OperationStatus,
)
from streams.contracts.models.events import ExecutionStatusChanged, OperationEvent
from streams.contracts.models.outputs import (
    Alert,
    ApprovalVerdict,
    OperationState,
    WorkItemResolution,
)
from streams.local.scenario import REFERENCE_AT, Tick, demo_scenario
from tests.support import ROOT, Deployment, deployment, free_port, play, worker

pytestmark = pytest.mark.kafka

CHROMIUM = "/usr/bin/chromium"
READ_TOKEN = "read-secret-for-the-browser-test"
WRITE_TOKEN = "write-secret-for-the-browser-test"
#: how long the page may take to show what the pipeline published ("a few seconds")
SHOWN_WITHIN_MS = 15_000


@contextmanager
def console(dep: Deployment, timeout: float = 30.0) -> Iterator[str]:
    """``vigil console`` as a subprocess on a free port, with a read and a write token; yields
    its base URL once ``/healthz`` answers 200."""
    port = free_port()
    log_path = dep.workdir / f"console-{port}.log"
    env = dep.env() | {
        "VIGIL_CONSOLE_HOST": "127.0.0.1",
        "VIGIL_CONSOLE_PORT": str(port),
        "VIGIL_CONSOLE_DB": str(dep.workdir / f"console-{port}.sqlite3"),
        "VIGIL_CONSOLE_TOKEN": READ_TOKEN,
        "VIGIL_CONSOLE_WRITE_TOKEN": WRITE_TOKEN,
        "VIGIL_DATA_DIR": str(dep.workdir / "data"),
    }
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streams.cli", "console"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=dep.workdir,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"console exited {proc.returncode}:\n{log_path.read_text()}")
            try:
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"console not up:\n{log_path.read_text()[-4000:]}")
            time.sleep(0.3)
        yield base
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        assert READ_TOKEN not in log_path.read_text(errors="replace"), "the console logged a token"


@pytest.fixture(scope="module")
def stack(cluster, tmp_path_factory) -> Iterator[tuple[Deployment, str]]:
    """The demo scenario through a real worker, and a console reading its outputs."""
    dep = deployment(cluster, tmp_path_factory.mktemp("console-browser"))
    play(dep, demo_scenario())
    with worker(dep), console(dep) as base:
        dep.read_until(
            [dep.topics.approval_verdicts.name],
            lambda rs: any(
                isinstance(r.record, ApprovalVerdict)
                and r.record.evaluated_at > REFERENCE_AT - timedelta(minutes=5)
                for r in rs
            ),
            timeout=60,
        )
        yield dep, base


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), f"{CHROMIUM} missing: scripts/test.sh installs it"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(stack, browser) -> Iterator[Any]:
    """A fresh tab on the console with the operator's tokens pasted, as a person would."""
    _, base = stack
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda e: errors.append(str(e)))
    tab.goto(f"{base}/")
    tab.locator("#tokens > summary").click()
    tab.fill("#read-token", READ_TOKEN)
    tab.fill("#write-token", WRITE_TOKEN)
    tab.fill("#reviewer-default", "ana.ops")
    tab.click("#save-tokens")
    tab.wait_for_selector("#live.on", timeout=SHOWN_WITHIN_MS)
    try:
        yield tab
    finally:
        context.close()
    assert not errors, errors


def _item(tab: Any, kind: str, ident: str) -> Any:
    """The row of the attention list about one thing (the first, for an operation with two
    open attempts)."""
    return tab.locator(f"#list-table tr.row[data-kind='{kind}'][data-id='{ident}']").first


def _as_of(tab: Any) -> datetime:
    """The freshness the page's indicator shows ("as of <time> · lag N · stream time <t>"):
    when the view last held every record on the topics."""
    text = tab.locator("#freshness").inner_text()
    when = text.removeprefix("as of ").split(" · ")[0]
    return datetime.fromisoformat(when.replace(" ", "T"))


def _stream_time(tab: Any) -> datetime:
    """The newest record's event time, the indicator's last part."""
    text = tab.locator("#freshness").inner_text()
    when = text.split(" · stream time ")[1]
    return datetime.fromisoformat(when.replace(" ", "T"))


def test_page_shows_the_stuck_approval_and_the_unknown_operation(stack, page) -> None:
    dep, _ = stack
    verdicts = {
        r.record.request_id: r.record
        for r in dep.read([dep.topics.approval_verdicts.name], idle=1.0)
        if isinstance(r.record, ApprovalVerdict)
    }
    deploy = verdicts["req-deploy"]
    assert deploy.verdict == "STUCK_AFTER_DECISION" and deploy.owner == "RUNTIME_OWNER"

    stuck = _item(page, "approval", "req-deploy")
    stuck.wait_for(timeout=SHOWN_WITHIN_MS)
    assert stuck.locator(".badge").inner_text() == "STUCK_AFTER_DECISION"
    assert stuck.locator(".sev").inner_text() == "CRITICAL"
    assert stuck.locator(".next-step").inner_text() == deploy.next_step
    assert stuck.locator("td[data-label='owner']").inner_text() == "RUNTIME_OWNER"

    unknown = _item(page, "operation", "op-refund-1")
    unknown.wait_for(timeout=SHOWN_WITHIN_MS)
    assert unknown.locator(".badge").inner_text() == "UNKNOWN"
    assert unknown.locator("button.open-review").is_visible()

    # the details drawer: the failed proofs of the stuck wait
    stuck.click()
    page.wait_for_selector("#drawer-proofs li", timeout=SHOWN_WITHIN_MS)
    proofs = page.locator("#drawer-proofs").inner_text()
    for finding in deploy.failed_proofs:
        assert finding.proof in proofs
    page.click("#drawer-close")

    # the indicator: caught up (lag 0), as of at least the verdict shown
    page.wait_for_selector("#freshness:has-text('lag 0')", timeout=SHOWN_WITHIN_MS)
    assert _stream_time(page) >= deploy.evaluated_at
    # "as of" is the view's freshness on the wall clock, and ages run to now: the stuck wait
    # began at the scenario's time, long before the newest record's time was reached
    assert timedelta(0) <= datetime.now(UTC) - _as_of(page) < timedelta(seconds=60)
    ago = stuck.locator(".age").inner_text()
    assert ago.endswith(" ago") and "d" in ago, ago
    summary = page.locator("#summary").inner_text()
    assert "STUCK_AFTER_DECISION" in summary and "UNKNOWN" in summary

    page.evaluate("document.getElementById('tokens').open = false")
    page.screenshot(path=str(dep.workdir / "console.png"), full_page=True)
    if os.environ.get("VIGIL_UPDATE_SCREENSHOT"):
        page.screenshot(path=str(ROOT / "docs" / "console.png"), full_page=True)

    # the execution page, by its hash route, with the timeline the view holds
    page.goto(page.url.split("#")[0] + "#/executions/exec-deploy")
    page.wait_for_selector("#execution-status", timeout=SHOWN_WITHIN_MS)
    page.wait_for_selector("text=req-deploy", timeout=SHOWN_WITHIN_MS)
    assert page.locator("h3", has_text="Timeline").is_visible()


def test_a_new_fact_appears_without_a_reload(stack, page) -> None:
    dep, _ = stack
    _item(page, "approval", "req-deploy").wait_for(timeout=SHOWN_WITHIN_MS)
    page.evaluate("window.__sameDocument = true")
    as_of_before = _as_of(page)
    ex, op, t0 = "exec-live-sms", "op-live-sms-1", REFERENCE_AT + timedelta(minutes=1)
    started = time.monotonic()
    play(
        dep,
        [
            ExecutionStatusChanged(
                event_id=f"{ex}-s1",
                execution_id=ex,
                sequence=1,
                status=ExecutionStatus.RUNNING,
                occurred_at=t0,
            ),
            OperationEvent(
                event_id=f"{op}-1-sent",
                execution_id=ex,
                operation_id=op,
                attempt=1,
                idempotency_key=f"idem-{op}",
                connector="sms",
                kind=OperationEventKind.SENT,
                occurred_at=t0 + timedelta(seconds=5),
                reply_due_at=t0 + timedelta(seconds=35),
            ),
            Tick(t0 + timedelta(minutes=1)),
        ],
    )
    fresh = _item(page, "operation", op)
    fresh.wait_for(timeout=SHOWN_WITHIN_MS * 2)
    shown_after = time.monotonic() - started
    assert fresh.locator(".badge").inner_text() == "UNKNOWN"
    assert page.evaluate("window.__sameDocument === true"), "the page was reloaded"
    # the indicator moved on: its stream time to the new facts, its freshness with the clock
    assert _stream_time(page) >= t0 + timedelta(seconds=35)
    # (the next read of the log ends, every 2 s, that the view has reached moves it on)
    deadline = time.monotonic() + 20
    while _as_of(page) <= as_of_before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _as_of(page) > as_of_before
    print(f"new UNKNOWN operation on the open page {shown_after:.1f} s after its facts")


def test_review_settles_the_unknown_operation_as_verified(stack, page) -> None:
    dep, _ = stack
    row = _item(page, "operation", "op-refund-1")
    row.wait_for(timeout=SHOWN_WITHIN_MS)
    page.evaluate("window.__sameDocument = true")
    attempt = row.get_attribute("data-attempt")
    row.locator("button.open-review").click()
    form = page.locator(f"#drawer-review .review[data-attempt='{attempt}']")
    form.wait_for(timeout=SHOWN_WITHIN_MS)
    # a refusal shows the server's message (here: a wrong write token) and publishes nothing
    page.evaluate("sessionStorage.setItem('vigil.writeToken', 'not-the-write-token')")
    form.locator("button.failed").click()
    refused = form.locator(".review-result.refused")
    refused.wait_for(timeout=SHOWN_WITHIN_MS)
    assert "write token" in refused.inner_text()
    page.evaluate(f"sessionStorage.setItem('vigil.writeToken', {WRITE_TOKEN!r})")
    form.locator("input.note").fill("refund ref R-77 found in the payments ledger")
    started = time.monotonic()
    form.locator("button.verified").click()
    page.wait_for_selector(".review-result.sent", timeout=SHOWN_WITHIN_MS)
    # the review happened now (wall clock); the ticker's part: move the inputs past it
    dep.tick(datetime.now(UTC) + timedelta(seconds=1))
    # settled: it leaves "needs attention" without a reload
    row.wait_for(state="detached", timeout=SHOWN_WITHIN_MS)
    settled_after = time.monotonic() - started
    assert page.evaluate("window.__sameDocument === true")
    # the pipeline published it: the state, the work items' resolutions, the RESOLVED alert
    op = "op-refund-1"

    def settled(rs: list[Any]) -> bool:
        recs = [r.record for r in rs]
        return (
            any(
                isinstance(x, OperationState)
                and x.operation_id == op
                and x.status == OperationStatus.VERIFIED
                for x in recs
            )
            and any(
                isinstance(x, WorkItemResolution)
                and x.operation_id == op
                and x.outcome == OperationStatus.VERIFIED
                and x.evidence_source == EvidenceSource.HUMAN
                for x in recs
            )
            and any(
                isinstance(x, Alert) and x.subject_id == op and x.status == AlertStatus.RESOLVED
                for x in recs
            )
        )

    t = dep.topics
    dep.read_until(
        [t.operation_state.name, t.reconciliation_work.name, t.alerts.name], settled, timeout=30
    )
    # and the execution page shows it VERIFIED
    page.goto(page.url.split("#")[0] + "#/executions/exec-refund")
    page.wait_for_selector("td >> text=VERIFIED", timeout=SHOWN_WITHIN_MS)
    print(f"review to settled on the page: {settled_after:.1f} s")
