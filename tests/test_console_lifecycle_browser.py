"""The operator page in real headless Chromium, on the lifecycle of what it shows: ages that
run to now on a quiet fleet (issue 29, item 2), FORBIDDEN_RETRY and ANOMALY alerts that ended
shown as ended and not counted as firing (item 4), and an execution known only by its open
approval shown in flight with its verdict (item 6).

The records are the pure Processor's (the worker's core) on the demo scenario played on: a
forbidden retry whose attempts are then settled with one effect (its alert ends), and a status
event after a terminal one (an anomaly, whose alert ends an hour of stream time later).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from streams.console.view import ConsoleView
from streams.contracts.models.enums import EvidenceSource, ExecutionStatus, OperationEventKind
from streams.contracts.models.events import ExecutionStatusChanged, OperationEvent
from streams.local.scenario import Tick, demo_scenario
from tests.page_support import Pipeline, Served, browser, open_tab, serve

pytestmark = pytest.mark.browser

READ = "read-secret-for-the-lifecycle"
WRITE = "write-secret-for-the-lifecycle"
SHOWN_MS = 10_000
BASE = datetime(2026, 7, 26, 16, 0, tzinfo=UTC)
AFTER_DEMO = max(s.at for s in demo_scenario(BASE) if isinstance(s, Tick))
DUP, BAD = "exec-dup", "exec-after-end"


def _op(op: str, attempt: int, kind: OperationEventKind, at: datetime, **kw: Any) -> OperationEvent:
    fields: dict[str, Any] = {"event_id": f"{op}-{attempt}-{kind}",
                              "evidence_source": EvidenceSource.RUNTIME}  # fmt: skip
    return OperationEvent(execution_id=DUP, operation_id=op, attempt=attempt, connector="payments",
                          kind=kind, occurred_at=at, **(fields | kw))  # fmt: skip


def _status(seq: int, status: ExecutionStatus, at: datetime) -> ExecutionStatusChanged:
    return ExecutionStatusChanged(event_id=f"{BAD}-s{seq}", execution_id=BAD, sequence=seq,
                                  status=status, occurred_at=at)  # fmt: skip


def scenario() -> list[Any]:
    """After the demo: ``exec-dup`` sends attempt 1 (no reply: UNKNOWN), sends attempt 2 under
    another key anyway (FORBIDDEN_RETRY), then the connector says attempt 1 FAILED and attempt
    2 VERIFIED: settled with one effect, the alert ends. ``exec-after-end`` completes and then
    reports RUNNING (refused: an ANOMALY alert), and stream time moves on past the anomaly
    alert's hour."""
    K, S = OperationEventKind, ExecutionStatus
    t = lambda minutes: AFTER_DEMO + timedelta(minutes=minutes)  # noqa: E731
    op = "op-dup-1"
    return [
        *demo_scenario(BASE),
        _status(1, S.RUNNING, t(1)),
        _status(2, S.COMPLETED, t(1.5)),
        _op(op, 1, K.SENT, t(2), idempotency_key="idem-dup-a", reply_due_at=t(3)),
        _status(3, S.RUNNING, t(2.5)),
        Tick(t(4)),
        _op(op, 2, K.SENT, t(5), idempotency_key="idem-dup-b", reply_due_at=t(8)),
        Tick(t(5.5)),
        _op(op, 1, K.FAILED, t(6), idempotency_key="idem-dup-a",
            evidence_source=EvidenceSource.CONNECTOR),
        _op(op, 2, K.VERIFIED, t(7), idempotency_key="idem-dup-b",
            evidence_source=EvidenceSource.CONNECTOR, effect_ref="pay-dup-2"),
        Tick(t(7.5)),
        Tick(t(70)),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    view = ConsoleView(Path(tmp_path_factory.mktemp("lifecycle")) / "console.sqlite3")
    records = Pipeline().run(scenario())
    with serve(view, READ, WRITE) as served:
        served.apply(records)
        yield served
    view.close()


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    with browser() as b:
        yield b


@pytest.fixture
def tab(console: Served, chromium: Any) -> Iterator[Any]:
    t = open_tab(chromium, console.base, tokens={"read": READ, "write": WRITE})
    try:
        yield t
    finally:
        t.context.close()
    assert not t.errors, t.errors


def api(console: Served, path: str, **params: str) -> Any:
    r = httpx.get(console.base + path, params=params,
                  headers={"Authorization": f"Bearer {READ}"}, timeout=10)  # fmt: skip
    r.raise_for_status()
    return r.json()


def rows(tab: Any) -> Any:
    return tab.locator("#list-table tbody tr.row")


def wait_rows(tab: Any, query_part: str = "") -> None:
    tab.wait_for_selector(f"#list-rows[data-query*='{query_part}']", timeout=SHOWN_MS)


def _seconds(text: str) -> int:
    """A shown age ("3d 4h ago", "2m 5s ago") in seconds."""
    unit = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    found = re.findall(r"(\d+)([dhms])", text)
    assert found and text.endswith(" ago"), text
    return sum(int(n) * unit[u] for n, u in found)


# ------------------------------------------------------------------------------- item 2


def test_ages_and_as_of_are_measured_from_now_on_a_quiet_fleet(console: Served, tab: Any) -> None:
    tab.goto(f"{console.base}/#/")
    wait_rows(tab, "sort=severity")
    # "as of" is the view's freshness on the wall clock, not the newest record's time; until
    # the view has read every topic to its end the footer says it is catching up
    tab.wait_for_function(
        "() => /as of \\d/.test(document.getElementById('freshness').innerText)",
        timeout=SHOWN_MS,
    )
    footer = tab.locator("#freshness").inner_text()
    as_of = datetime.fromisoformat(re.search(r"as of (\S+ \S+)", footer).group(1).replace(" ", "T"))
    assert timedelta(0) <= datetime.now(UTC) - as_of < timedelta(seconds=60), footer
    newest = datetime.fromisoformat(api(console, "/api/summary")["as_of"]["event_time"])
    assert as_of - newest > timedelta(days=1)  # the records are months old: not what it says
    # every age on the attention list runs from its record's time to now
    shown = rows(tab)
    assert shown.count() > 0
    ages = shown.locator(".age[data-since]")
    assert ages.count() > 0
    for i in range(ages.count()):
        span = ages.nth(i)
        since = datetime.fromisoformat(span.get_attribute("data-since").replace("Z", "+00:00"))
        want = (datetime.now(UTC) - since).total_seconds()
        got = _seconds(span.inner_text())
        # two units are shown ("127d 5h"): the age is right to the smaller unit's size
        assert want - 86400 <= got <= want + 60, (span.inner_text(), want)
        assert got > (newest - since).total_seconds() + 86400  # not measured from the newest
    # and they go on while nothing arrives: an age from a minute ago counts on in seconds
    recent = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
    tab.evaluate(
        "since => { const s = document.createElement('span'); s.className = 'age';"
        " s.id = 'probe'; s.dataset.since = since; document.body.append(s); }",
        recent,
    )
    tab.wait_for_function(
        "() => /^1m \\d+s ago$/.test(document.getElementById('probe').textContent)",
        timeout=SHOWN_MS,
    )
    first = _seconds(tab.locator("#probe").inner_text())
    tab.wait_for_function(
        f"() => {{ const t = document.getElementById('probe').textContent;"
        f" const m = /^1m (\\d+)s ago$/.exec(t); return !m || 60 + +m[1] > {first}; }}",
        timeout=SHOWN_MS,
    )
    assert _seconds(tab.locator("#probe").inner_text()) > first


# ------------------------------------------------------------------------------- item 4


def _alert(console: Served, ex: str, kind: str) -> list[dict[str, Any]]:
    both = api(console, "/api/alerts", execution_id=ex, status="RESOLVED", limit="500")["items"]
    both += api(console, "/api/alerts", execution_id=ex, status="FIRING", limit="500")["items"]
    return [a for a in both if a["kind"] == kind]


@pytest.mark.parametrize(("ex", "kind"), [(DUP, "FORBIDDEN_RETRY"), (BAD, "ANOMALY")])
def test_an_ended_forbidden_retry_or_anomaly_alert_is_shown_ended_and_not_counted(
    console: Served, tab: Any, ex: str, kind: str
) -> None:
    alerts = _alert(console, ex, kind)
    assert alerts, f"no {kind} alert of {ex}"
    assert all(not a["firing"] for a in alerts), alerts  # vigil published their end
    ids = {a["alert_id"] for a in alerts}
    firing = api(console, "/api/alerts", status="FIRING", limit="500")
    assert not ids & {a["alert_id"] for a in firing["items"]}

    # the alerts view: not among the firing ones, found among the ended ones, as RESOLVED
    tab.goto(f"{console.base}/#/alerts?kind={kind}")
    wait_rows(tab, f"kind={kind}")
    shown = {rows(tab).nth(i).get_attribute("data-id") for i in range(rows(tab).count())}
    assert not shown & ids
    tab.select_option("#filter-status", "RESOLVED")
    wait_rows(tab, "status=RESOLVED")
    ended = {
        rows(tab).nth(i).get_attribute("data-id"): rows(tab).nth(i).locator(".badge").first
        for i in range(rows(tab).count())
    }
    assert ids <= set(ended), (ids, set(ended))
    assert {ended[i].inner_text() for i in ids} == {"RESOLVED"}

    # the severity chips count firing alerts only: each chip equals its firing list
    counts = api(console, "/api/summary")["alerts_firing_by_severity"]
    tab.goto(f"{console.base}/#/")
    wait_rows(tab, "sort=severity")
    for sev, n in counts.items():
        chip = tab.locator(f"[data-summary='alerts_firing_by_severity'] a.count[data-key='{sev}']")
        assert int(chip.locator("b").inner_text().replace(",", "")) == n
        listed = api(console, "/api/alerts", status="FIRING", severity=sev, limit="500")
        assert listed["total"] == n
        assert not ids & {a["alert_id"] for a in listed["items"]}

    # the execution page: the alert as ended
    tab.goto(f"{console.base}/#/executions/{ex}")
    tab.wait_for_selector("#execution-alerts tbody tr", timeout=SHOWN_MS)
    for alert_id in ids:
        row = tab.locator(f"#execution-alerts tr[data-id='{alert_id}']")
        assert row.get_attribute("data-status") == "RESOLVED"
        assert row.locator(".badge").first.inner_text() == "RESOLVED"


# ------------------------------------------------------------------------------- item 6


def test_an_execution_known_only_by_its_open_approval_is_shown_in_flight(
    console: Served, tab: Any
) -> None:
    detail = api(console, "/api/executions/exec-deploy")
    assert detail["execution"] is None  # no status event was ever seen
    (approval,) = detail["approvals"]
    assert approval["open"] and approval["verdict"] == "STUCK_AFTER_DECISION"

    tab.goto(f"{console.base}/#/executions/exec-deploy")
    tab.wait_for_selector("#execution-approvals tbody tr", timeout=SHOWN_MS)
    status = tab.locator("#execution-status")
    assert status.get_attribute("data-in-flight") == "true"
    text = status.inner_text()
    assert "in flight" in text and "closed" not in text and "terminal" not in text, text
    row = tab.locator("#execution-approvals tbody tr", has_text="req-deploy")
    assert "STUCK_AFTER_DECISION" in row.inner_text() and "open" in row.inner_text()

    # and the fleet view lists it among what needs attention, with its verdict
    tab.goto(f"{console.base}/#/?execution_id=exec-deploy")
    wait_rows(tab, "execution_id=exec-deploy")
    item = tab.locator("tr.row[data-kind='approval'][data-id='req-deploy']")
    assert "STUCK_AFTER_DECISION" in item.inner_text()

    # an execution that completed is shown terminal, not in flight
    tab.goto(f"{console.base}/#/executions/exec-invoice-run")
    tab.wait_for_selector("#execution-status", timeout=SHOWN_MS)
    tab.wait_for_selector("#execution-operations tbody tr", timeout=SHOWN_MS)
    done = tab.locator("#execution-status")
    assert done.get_attribute("data-in-flight") == "false"
    assert "terminal" in done.inner_text() and "in flight" not in done.inner_text()
