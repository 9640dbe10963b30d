"""The operator page at fleet scale in a real headless browser (Debian's chromium through
Playwright): 100,000 executions in flight in a view built directly (``fill_fleet``: the
execution rows written in bulk, the records of those needing attention applied by the view),
one console and one browser for the module, no Kafka.

What issue 29 saw at this size was a wall of 15,042 cards, lists cut at 5,000 with no way on,
and a text filter that took seconds. Here the page shows one page of rows the server
filtered, sorted and counted, says how many there are, reaches every one of them page by
page, keeps its filters in the URL, and its summary counts open the lists they count. How fast
(first paint, a filter's answer) is measured by ``python -m bench.console --sections page``
and recorded in BENCHMARKS.md, not asserted here.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from streams.console.view import ConsoleView
from tests.page_support import Fleet, Served, browser, fill_fleet, open_tab, serve

pytestmark = pytest.mark.browser

EXECUTIONS = 100_000
SHOWN_MS = 15_000
DASH = "\N{EN DASH}"  # between the first and the last row's number in the count


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, Fleet]]:
    view = ConsoleView(Path(tmp_path_factory.mktemp("fleet")) / "console.sqlite3")
    made = fill_fleet(view, EXECUTIONS)
    with serve(view) as served:
        yield served, made
    view.close()


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    with browser() as b:
        yield b


@pytest.fixture
def tab(fleet: tuple[Served, Fleet], chromium: Any) -> Iterator[Any]:
    t = open_tab(chromium, fleet[0].base)
    try:
        yield t
    finally:
        t.context.close()
    assert not t.errors, t.errors


def api(served: Served, path: str, **params: str) -> Any:
    r = httpx.get(served.base + path, params=params, timeout=30)
    r.raise_for_status()
    return r.json()


def shown(tab: Any, query_part: str) -> Any:
    """The rows once the list shows the answer to a query containing ``query_part``."""
    tab.wait_for_selector(f"#list-rows[data-query*='{query_part}']", timeout=SHOWN_MS)
    return tab.locator("#list-table tbody tr.row")


def keys_of(tab: Any) -> list[str]:
    return tab.eval_on_selector_all("#list-table tbody tr.row", "rs => rs.map(r => r.dataset.key)")


def total(tab: Any) -> int:
    return int(tab.locator("#list-count").get_attribute("data-total"))


def test_the_first_view_is_one_page_of_a_counted_list(fleet, tab) -> None:
    served, made = fleet
    tab.goto(f"{served.base}/")
    rows = shown(tab, "sort=severity")
    assert rows.count() == 50
    assert total(tab) == made.attention == api(served, "/api/attention")["total"]
    assert tab.locator("#list-count").inner_text() == f"1{DASH}50 of {made.attention:,}"
    assert tab.locator("#page-next").is_enabled()
    # a page, not a wall: the whole document stays small
    assert tab.evaluate("document.getElementsByTagName('*').length") < 3_000
    # severity, then age: the CRITICAL stuck approvals first, the oldest first
    sev = [rows.nth(i).locator(".sev").inner_text() for i in range(rows.count())]
    assert set(sev) == {"CRITICAL"}
    first = api(served, "/api/attention", limit="1")["items"][0]
    assert rows.first.get_attribute("data-id") == first["subject_id"] == "ex-000001-req1"
    # the summary counts every execution, not a page of them
    chip = tab.locator("[data-summary='executions_in_flight'] .count b")
    assert chip.inner_text() == f"{EXECUTIONS:,}"


def test_every_row_is_reached_page_by_page(fleet, tab) -> None:
    served, made = fleet
    # the overdue work items of the mail connector: every 40th execution has one, a third
    # of those are mail's
    expected = sum(1 for i in range(0, made.executions, 40) if i % 3 == 1)
    tab.goto(f"{served.base}/#/?kind=work_item&connector=mail&limit=200")
    shown(tab, "kind=work_item")
    seen: list[str] = []
    pages = 0
    while True:
        pages += 1
        keys = keys_of(tab)
        seen += keys
        count = tab.locator("#list-count").inner_text()
        assert count == f"{len(seen) - len(keys) + 1:,}{DASH}{len(seen):,} of {expected:,}"
        nxt = tab.locator("#page-next")
        if not nxt.is_enabled():
            break
        before = tab.locator("#list-rows").get_attribute("data-query")
        nxt.click()
        tab.wait_for_function(
            "q => document.getElementById('list-rows').dataset.query !== q", arg=before
        )
        assert "cursor=" in tab.url and "connector=mail" in tab.url
    assert pages == -(-expected // 200) > 2
    assert len(seen) == len(set(seen)) == expected  # every one once: nothing cut off
    # back one page: the same rows as on the way there
    tab.locator("#page-prev").click()
    start = 200 * (pages - 2)
    tab.wait_for_function(
        "s => document.getElementById('list-count').dataset.start === s", arg=str(start)
    )
    assert keys_of(tab) == seen[start : start + 200]
    tab.locator("#page-first").click()
    tab.wait_for_function("() => document.getElementById('list-count').dataset.start === '0'")
    assert "cursor=" not in tab.url and keys_of(tab) == seen[:200]


def test_filters_are_answered_by_the_server_and_kept_in_the_link(fleet, tab) -> None:
    served, made = fleet
    tab.goto(f"{served.base}/")
    shown(tab, "sort=severity")
    tab.select_option("#filter-owner", "POLICY_OWNER")
    rows = shown(tab, "owner=POLICY_OWNER")
    assert total(tab) == made.stale
    assert {rows.nth(i).locator("td").nth(4).inner_text() for i in range(rows.count())} == {
        "POLICY_OWNER"
    }
    assert "owner=POLICY_OWNER" in tab.url
    first = rows.first.get_attribute("data-key")
    # the link is the query: opened again, the same filter and the same rows
    link = tab.url
    tab.goto("about:blank")
    tab.goto(link)
    rows = shown(tab, "owner=POLICY_OWNER")
    assert tab.locator("#filter-owner").input_value() == "POLICY_OWNER"
    assert rows.first.get_attribute("data-key") == first
    # the text filter, typed: four rows of ex-012320..ex-012329 need attention
    tab.locator("#filter-owner").select_option("")
    shown(tab, "sort=severity&limit")
    tab.locator("#filter-q").press_sequentially("ex-01232", delay=20)
    rows = shown(tab, "q=ex-01232")
    assert total(tab) == 4 == rows.count()
    assert {rows.nth(i).get_attribute("data-execution") for i in range(4)} == {
        "ex-012320",
        "ex-012321",
        "ex-012322",
    }
    assert tab.locator("#filter-q").evaluate("n => n === document.activeElement")


def test_summary_chips_open_the_lists_they_count(fleet, tab) -> None:
    served, _ = fleet
    tab.goto(f"{served.base}/")
    shown(tab, "sort=severity")
    for group, key, path_part in (
        ("operations_by_status", "UNKNOWN", "#/list/operations?status=UNKNOWN"),
        ("approvals_open_by_verdict", "STUCK_AFTER_DECISION", "#/list/approvals?"),
        ("alerts_firing_by_severity", "CRITICAL", "#/alerts?severity=CRITICAL"),
        ("executions_by_status", "WAITING_FOR_TOOL", "#/list/executions?status=WAITING_FOR_TOOL"),
    ):
        chip = tab.locator(f"[data-summary='{group}'] a.count[data-key='{key}']")
        n = int(chip.locator("b").inner_text().replace(",", ""))
        chip.click()
        rows = shown(tab, f"={key}")
        assert path_part in tab.url
        assert total(tab) == n and rows.count() == min(n, 50)
    assert n == EXECUTIONS // 4
    chip = tab.locator("[data-summary='executions_in_flight'] a.count")
    chip.click()
    shown(tab, "terminal=false")
    assert total(tab) == EXECUTIONS


def test_the_newest_of_100000_executions_first(fleet, tab) -> None:
    served, _ = fleet
    tab.goto(f"{served.base}/#/list/executions")
    shown(tab, "limit=50")
    tab.select_option("#filter-sort", "-since")
    rows = shown(tab, "sort=-since")
    assert total(tab) == EXECUTIONS and rows.count() == 50
    assert rows.first.get_attribute("data-id") == f"ex-{EXECUTIONS - 1:06d}"
    rows.first.click()
    tab.wait_for_selector("#drawer:not([hidden]) #drawer-title", timeout=SHOWN_MS)
    assert f"ex-{EXECUTIONS - 1:06d}" in tab.locator("#drawer-title").inner_text()
