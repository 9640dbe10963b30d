"""The operator page in a real headless browser (Debian's chromium through Playwright), over a
view of the demo scenario's real outputs (the pure Processor's, applied by the view as the
console's consumer would), without Kafka: one console and one browser for the module.

The demo is played on past an operator's review: attempt 2 of ``op-refund-1`` (the duplicate
send) verified, which leaves attempt 1 UNKNOWN and holding the retry verdict, with its overdue
work item open. An anomaly alert with a long token in its evidence is added.

Each test is one item of issue 29: resolved things shown as resolved (3), the alerts and
anomalies view with severity everywhere (5), 400 px wide and evidence that does not repeat the
failed proofs (8), and a review action on every open attempt and work item (1).
test_console_lifecycle_browser.py covers ages from now (2), ended FORBIDDEN_RETRY and ANOMALY
alerts (4) and an execution known only by its approval (6);
test_console_fleet_browser.py is the same page at 100,000 executions (7);
test_console_browser.py the page against the real broker and worker.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from streams.console.attention import SEVERITY_RANK
from streams.console.view import ConsoleView
from streams.contracts.models.enums import (
    AnomalyKind,
    EvidenceSource,
    ExecutionStatus,
    OperationEventKind,
    OperationStatus,
)
from streams.contracts.models.events import ExecutionStatusChanged, OperationEvent
from streams.contracts.models.outputs import Anomaly, OperationState
from streams.core.alerts import anomaly_alert
from streams.local.scenario import Tick, demo_scenario
from tests.page_support import Pipeline, Served, browser, open_tab, serve

pytestmark = pytest.mark.browser

READ = "read-secret-for-the-page"
WRITE = "write-secret-for-the-page"
SHOWN_MS = 10_000
#: a token with no place to break (an opaque payload, a signed URL)
LONG = "payload=" + "9f8e7d6c5b4a3f2e1d0c" * 18
#: an execution id as long as the console accepts ids to be, give or take
LONG_EXECUTION = "exec-" + "7c2f0e19" * 12
AFTER_DEMO = max(s.at for s in demo_scenario() if isinstance(s, Tick))


BASE = datetime(2026, 7, 26, 16, 0, tzinfo=UTC)


def op_event(
    ex: str, op: str, attempt: int, kind: OperationEventKind, at: datetime, **kw: Any
) -> OperationEvent:
    fields: dict[str, Any] = {
        "event_id": f"{op}-{attempt}-{kind}",
        "evidence_source": EvidenceSource.RUNTIME,
        "idempotency_key": f"idem-{op}",
    }
    return OperationEvent(
        execution_id=ex,
        operation_id=op,
        attempt=attempt,
        connector="payments",
        kind=kind,
        occurred_at=at,
        **(fields | kw),
    )


def scenario() -> list[Any]:
    """The demo, and a resend under a new idempotency key (``exec-resend``): attempt 1 of
    ``op-resend-1`` times out (UNKNOWN, an overdue work item), attempt 2 is sent anyway (a
    FORBIDDEN_RETRY) and verified by the connector, which does not settle attempt 1: it
    stays UNKNOWN and holds the operation's retry verdict. Then the demo's duplicate send is
    reviewed: attempt 2 of ``op-refund-1`` verified by a person, which settles attempt 1 too
    (the same idempotency key)."""
    K, ex, op = OperationEventKind, "exec-resend", "op-resend-1"
    at = lambda minutes: BASE + timedelta(minutes=minutes)  # noqa: E731
    resend = [
        ExecutionStatusChanged(
            event_id=f"{ex}-s1", execution_id=ex, sequence=1,
            status=ExecutionStatus.RUNNING, occurred_at=at(3),
        ),
        op_event(ex, op, 1, K.SENT, at(3.2), idempotency_key="idem-a", reply_due_at=at(4)),
        op_event(ex, op, 2, K.SENT, at(6), idempotency_key="idem-b", reply_due_at=at(9)),
        op_event(ex, op, 2, K.VERIFIED, at(7), idempotency_key="idem-b",
                 evidence_source=EvidenceSource.CONNECTOR, effect_ref="pay-2"),
    ]  # fmt: skip
    steps = sorted(
        [*demo_scenario(BASE), *resend],
        key=lambda s: (s.at if isinstance(s, Tick) else s.occurred_at, isinstance(s, Tick)),
    )
    t = AFTER_DEMO + timedelta(minutes=1)
    review = op_event(
        "exec-refund", "op-refund-1", 2, K.VERIFIED, t,
        event_id="review-op-refund-1-2", evidence_source=EvidenceSource.HUMAN,
        detail="verified by ana.ops: refund R-77 in the ledger",
    )  # fmt: skip
    return [*steps, review, Tick(t + timedelta(seconds=1))]


@pytest.fixture(scope="module")
def pipeline() -> Pipeline:
    return Pipeline()


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory, pipeline: Pipeline) -> Iterator[Served]:
    view = ConsoleView(Path(tmp_path_factory.mktemp("page")) / "console.sqlite3")
    records = pipeline.run(scenario())
    t = AFTER_DEMO + timedelta(minutes=1)
    anomaly = Anomaly(
        anomaly_id="an-long-1",
        kind=AnomalyKind.OUT_OF_ORDER,
        reason=LONG,
        execution_id=LONG_EXECUTION,
        event_id="evt-" + LONG[8:120],
        event_type="OperationEvent",
        source_topic="vigil.operation-events",
        source_partition=0,
        source_offset=7,
        detected_at=t,
    )
    with serve(view, READ, WRITE) as served:
        served.apply([*records, anomaly_alert(anomaly)])
        yield served
    view.close()


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    with browser() as b:
        yield b


def _tab(console: Served, chromium: Any, width: int = 1280) -> Any:
    return open_tab(
        chromium,
        console.base,
        width=width,
        tokens={"read": READ, "write": WRITE, "reviewer": "ana.ops"},
    )


@pytest.fixture
def tab(console: Served, chromium: Any) -> Iterator[Any]:
    t = _tab(console, chromium)
    try:
        yield t
    finally:
        t.context.close()
    assert not t.errors, t.errors


def api(console: Served, path: str, **params: str) -> Any:
    r = httpx.get(
        console.base + path, params=params, headers={"Authorization": f"Bearer {READ}"}, timeout=10
    )
    r.raise_for_status()
    return r.json()


def goto(tab: Any, console: Served, hash_: str) -> None:
    tab.goto(f"{console.base}/{hash_}")


def rows(tab: Any) -> Any:
    return tab.locator("#list-table tbody tr.row")


def wait_rows(tab: Any, query_part: str = "") -> None:
    """Until the list shows the answer to a query containing ``query_part``."""
    tab.wait_for_selector(f"#list-rows[data-query*='{query_part}']", timeout=SHOWN_MS)


# ------------------------------------------------------------------------------- item 3


def test_the_execution_page_shows_resolved_alerts_and_closed_work_items_as_such(
    console: Served, tab: Any
) -> None:
    detail = api(console, "/api/executions/exec-sms-reminder")
    (alert,) = detail["alerts"]
    assert alert["firing"] is False and alert["status"] == "FIRING"  # the record; the view ended it
    (item,) = detail["work_items"]
    assert item["open"] is False and item["resolution"]["outcome"] == "VERIFIED"

    goto(tab, console, "#/executions/exec-sms-reminder")
    tab.wait_for_selector("#execution-alerts tbody tr", timeout=SHOWN_MS)
    row = tab.locator(f"#execution-alerts tr[data-id='{alert['alert_id']}']")
    assert row.get_attribute("data-status") == "RESOLVED"
    assert "RESOLVED" in row.inner_text() and "FIRING" not in row.inner_text()
    wi = tab.locator(f"#execution-work-items tr[data-id='{item['work_item_id']}']")
    assert wi.get_attribute("data-state") == "closed"
    assert wi.locator(".badge").first.inner_text() == "CLOSED · VERIFIED"
    assert wi.locator("button.open-review").count() == 0  # nothing left to review

    # exec-refund: the review closed both work items and ended their alerts; the
    # FORBIDDEN_RETRY has no end yet. exec-resend: attempt 1's work item is open (overdue).
    # Each shown as the API says, and open and closed look different.
    looks = {}
    for ex in ("exec-refund", "exec-resend"):
        detail = api(console, f"/api/executions/{ex}")
        goto(tab, console, f"#/executions/{ex}")
        tab.wait_for_selector("#execution-work-items tbody tr", timeout=SHOWN_MS)
        for w in detail["work_items"]:
            r = tab.locator(f"#execution-work-items tr[data-id='{w['work_item_id']}']")
            text = r.locator(".badge").first.inner_text()
            assert text.startswith("OPEN") if w["open"] else text.startswith("CLOSED"), text
            assert r.get_attribute("data-state") == ("open" if w["open"] else "closed")
            looks[w["open"]] = r.locator("td").nth(1).evaluate("n => getComputedStyle(n).color")
        for a in detail["alerts"]:
            r = tab.locator(f"#execution-alerts tr[data-id='{a['alert_id']}']")
            assert r.get_attribute("data-status") == ("FIRING" if a["firing"] else "RESOLVED")
            assert r.locator(".badge").first.inner_text() == (
                "FIRING" if a["firing"] else "RESOLVED"
            )
    assert set(looks) == {True, False} and looks[True] != looks[False], looks


# ------------------------------------------------------------------------------- item 5


def test_alerts_and_anomalies_have_a_view_sorted_by_severity_then_age(
    console: Served, tab: Any
) -> None:
    firing = api(console, "/api/alerts", status="FIRING", limit="500")
    assert firing["total"] == len(firing["items"])
    assert any(a["kind"] == "ANOMALY" for a in firing["items"])
    goto(tab, console, "#/alerts")
    wait_rows(tab, "sort=severity")
    shown = rows(tab)
    assert shown.count() == firing["total"]
    assert _overflow(tab) <= 0  # the long execution id of the anomaly stays in its table
    ids = [shown.nth(i).get_attribute("data-id") for i in range(shown.count())]
    by_id = {a["alert_id"]: a for a in firing["items"]}
    keys = [(SEVERITY_RANK[by_id[i]["severity"]], by_id[i]["occurred_at"], i) for i in ids]
    assert keys == sorted(keys), "not by severity, then age (the oldest first)"
    for i in range(shown.count()):  # a severity on every row
        sev = shown.nth(i).locator(".sev")
        assert sev.inner_text() == by_id[ids[i]]["severity"]
    # the anomaly is findable: by its kind, in the view's own filter, and in the URL
    tab.select_option("#filter-kind", "ANOMALY")
    wait_rows(tab, "kind=ANOMALY")
    assert "kind=ANOMALY" in tab.url
    assert rows(tab).count() == 1
    assert "ANOMALY" in rows(tab).first.inner_text()
    assert tab.locator("#list-count").get_attribute("data-total") == "1"
    # a severity chip of the summary opens the list it counts, with the same number
    chip = tab.locator("[data-summary='alerts_firing_by_severity'] a.count[data-key='WARNING']")
    n = int(chip.locator("b").inner_text().replace(",", ""))
    chip.click()
    wait_rows(tab, "severity=WARNING")
    assert tab.locator("#list-count").get_attribute("data-total") == str(n)
    assert {rows(tab).nth(i).locator(".sev").inner_text() for i in range(rows(tab).count())} == {
        "WARNING"
    }
    # the ended ones, as such
    tab.select_option("#filter-status", "RESOLVED")
    wait_rows(tab, "status=RESOLVED")
    assert rows(tab).count() and all(
        rows(tab).nth(i).locator(".badge").first.inner_text() == "RESOLVED"
        for i in range(rows(tab).count())
    )
    # and every row of the attention list carries its severity too
    goto(tab, console, "#/")
    wait_rows(tab, "sort=severity")
    attention = api(console, "/api/attention", limit="500")
    assert rows(tab).count() == attention["total"] > 0
    for i, item in enumerate(attention["items"]):
        assert rows(tab).nth(i).locator(".sev").inner_text() == item["severity"]


# ------------------------------------------------------------------------------- item 8


def _overflow(tab: Any) -> int:
    return int(tab.evaluate("document.documentElement.scrollWidth - window.innerWidth"))


def test_400_px_wide_nothing_overflows_and_evidence_does_not_repeat_the_proofs(
    console: Served, chromium: Any
) -> None:
    tab = _tab(console, chromium, width=400)
    try:
        for hash_, ready in (
            ("#/", "#list-table"),
            ("#/alerts", "#list-table"),
            ("#/list/work-items?open=false", "#list-table"),
            ("#/list/operations", "#list-table"),
            ("#/executions/exec-refund", "#execution-alerts"),
            (f"#/executions/{LONG_EXECUTION}", "#execution-alerts"),
        ):
            goto(tab, console, hash_)
            tab.wait_for_selector(ready, timeout=SHOWN_MS)
            assert _overflow(tab) <= 0, f"{hash_}: the page is wider than 400 px"
        # the anomaly's long token wraps inside its row and inside the drawer
        goto(tab, console, "#/alerts?kind=ANOMALY")
        wait_rows(tab, "kind=ANOMALY")
        row = rows(tab).first
        assert row.bounding_box()["x"] + row.bounding_box()["width"] <= 400
        row.click()
        tab.wait_for_selector("#drawer-evidence .evidence-line", timeout=SHOWN_MS)
        line = tab.locator("#drawer-evidence .evidence-line", has_text=LONG[:40])
        box = line.bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= 400 and box["height"] > 40
        assert tab.evaluate("(() => { const d = document.getElementById('drawer');"
                            " return d.scrollWidth <= d.clientWidth; })()")  # fmt: skip
        assert _overflow(tab) <= 0

        # an approval's drawer: its failed proofs once, then the alerts' evidence without them
        approval = api(console, "/api/approvals", verdict="STUCK_AFTER_DECISION")["items"][0]
        proofs = [f"{p['proof']}:{p['state']}:{p['reason']}" for p in approval["failed_proofs"]]
        assert proofs
        detail = api(console, f"/api/executions/{approval['execution_id']}")
        carried = [
            e
            for a in detail["alerts"]
            if a["subject_id"] == approval["request_id"]
            for e in a["evidence"]
        ]
        assert set(proofs) <= set(carried)  # the alert repeats them: the page must not
        goto(tab, console, f"#/?execution_id={approval['execution_id']}")
        wait_rows(tab, "execution_id=")
        tab.locator(f"tr.row[data-kind='approval'][data-id='{approval['request_id']}']").click()
        tab.wait_for_selector("#drawer-proofs li", timeout=SHOWN_MS)
        tab.wait_for_selector("#drawer-evidence", timeout=SHOWN_MS)
        assert tab.locator("#drawer-proofs li").count() == len(proofs)
        lines = tab.locator("#drawer-evidence .evidence-line").all_inner_texts()
        assert not set(lines) & set(proofs), lines
        assert _overflow(tab) <= 0
        assert not tab.errors, tab.errors
    finally:
        tab.context.close()


# ------------------------------------------------------------------------------- item 1


def test_every_open_attempt_and_work_item_has_a_review_action(
    console: Served, tab: Any, pipeline: Pipeline
) -> None:
    state = api(console, "/api/executions/exec-resend")
    (op,) = state["operations"]
    # attempt 2 verified; attempt 1 still holds the retry verdict, UNKNOWN
    assert (op["attempt"], op["status"]) == (2, "VERIFIED")
    assert (op["held_by_attempt"], op["held_by_status"]) == (1, "UNKNOWN")
    open_items = [w for w in state["work_items"] if w["open"]]
    assert [w["attempt"] for w in open_items] == [1]

    # needs attention: the open attempt and its work item, each with its review action
    goto(tab, console, "#/?execution_id=exec-resend")
    wait_rows(tab, "execution_id=exec-resend")
    shown = rows(tab)
    kinds = sorted(
        (shown.nth(i).get_attribute("data-kind"), shown.nth(i).get_attribute("data-attempt"))
        for i in range(shown.count())
    )
    assert kinds == [("operation", "1"), ("work_item", "1")]
    for i in range(shown.count()):
        assert shown.nth(i).locator("button.open-review").count() == 1

    # the execution page: a review action on every open attempt and open work item, none
    # on what is settled
    goto(tab, console, "#/executions/exec-resend")
    tab.wait_for_selector("#execution-operations tbody tr", timeout=SHOWN_MS)
    attempts = tab.locator("#execution-operations tbody tr")
    seen = {}
    for i in range(attempts.count()):
        r = attempts.nth(i)
        seen[r.get_attribute("data-attempt")] = r.locator("button.open-review").count()
    assert seen == {"2": 0, "1": 1}, seen
    for w in state["work_items"]:
        r = tab.locator(f"#execution-work-items tr[data-id='{w['work_item_id']}']")
        assert r.locator("button.open-review").count() == (1 if w["open"] else 0)

    # the review of attempt 1, from its work item: the event names attempt 1
    r = tab.locator(f"#execution-work-items tr[data-id='{open_items[0]['work_item_id']}']")
    r.locator("button.open-review").click()
    form = tab.locator("#drawer-review .review[data-attempt='1']")
    form.wait_for(timeout=SHOWN_MS)
    form.locator("input.note").fill("refund R-76 found: attempt 1 took effect")
    before = len(console.producer.sent)
    form.locator("button.verified").click()
    form.locator(".review-result.sent").wait_for(timeout=SHOWN_MS)
    (_topic, event, key), *_ = console.producer.sent[before:]
    assert isinstance(event, OperationEvent) and key == "exec-resend"
    assert (event.operation_id, event.attempt, event.kind) == ("op-resend-1", 1, "VERIFIED")
    assert event.evidence_source == EvidenceSource.HUMAN
    assert "ana.ops" in (event.detail or "") and "R-76" in (event.detail or "")

    # the pipeline applies it; the page follows without a reload: nothing left to attend to
    tab.evaluate("window.__sameDocument = true")
    goto(tab, console, "#/?execution_id=exec-resend")
    wait_rows(tab, "execution_id=exec-resend")
    outputs = pipeline.run([event, Tick(event.occurred_at + timedelta(seconds=1))])
    settled = [
        o for o in outputs if isinstance(o, OperationState) and o.operation_id == "op-resend-1"
    ]
    assert settled and settled[-1].held_by_status in (None, OperationStatus.VERIFIED)
    console.apply(outputs)
    tab.wait_for_selector("#list-rows .empty", timeout=SHOWN_MS)
    assert tab.evaluate("window.__sameDocument === true")
    assert api(console, "/api/attention", execution_id="exec-resend")["total"] == 0


def test_api_lists_describes_what_the_page_builds_its_controls_from(console: Served) -> None:
    lists = api(console, "/api/lists")
    assert set(lists) == {"attention", "approvals", "operations", "work-items", "executions",
                          "alerts"}  # fmt: skip
    a = lists["attention"]
    assert a["path"] == "/api/attention" and a["default_sort"] == "severity"
    assert a["allowed"]["kind"] == ["approval", "operation", "work_item"]
    assert lists["alerts"]["defaults"] == {"status": "FIRING"}
    assert "severity" in lists["alerts"]["sorts"]
    r = httpx.get(console.base + "/api/lists?x=1", headers={"Authorization": f"Bearer {READ}"})
    assert r.status_code == 400
    assert httpx.get(console.base + "/api/lists").status_code == 401  # the read token
    # a bad filter on the attention list: 400 with the allowed values, as every list
    r = httpx.get(
        console.base + "/api/attention",
        params={"severity": "LOUD"},
        headers={"Authorization": f"Bearer {READ}"},
    )
    assert r.status_code == 400 and "CRITICAL" in r.json()["allowed"]["severity"]
