"""The console shows, for a work item, each check vigil reconcile made, its outcome and when
the next one is due (the reconciler's records on <p>.reconciliation-checks), whichever of the
item and the progress record it reads first, and never an older progress over a newer one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from streams.console.view import ConsoleView, Incoming
from streams.contracts.models.enums import CheckFinding, ReconciliationState, WorkItemKind
from streams.contracts.models.outputs import ReconciliationWorkItem
from streams.core import reconcile as rc

T0 = datetime(2026, 7, 26, 16, 0, tzinfo=UTC)

ITEM = ReconciliationWorkItem(
    work_item_id="wi-1",
    operation_id="op-1",
    execution_id="ex-1",
    attempt=1,
    connector="payments",
    kind=WorkItemKind.REPLY_TIMEOUT,
    deadline=T0,
    created_at=T0,
    idempotency_key="key-1",
)


def progress() -> list[rc.ReconciliationCheck]:
    """Taken, one failed check (next due), then verified."""
    taken = rc.taken(
        work_item_id="wi-1",
        operation_id="op-1",
        execution_id="ex-1",
        attempt=1,
        connector="payments",
        idempotency_key="key-1",
        effect_ref=None,
        kind=WorkItemKind.REPLY_TIMEOUT,
        deadline=T0,
        created_at=T0,
        traceparent=None,
        now=T0 + timedelta(seconds=1),
    )
    policy = rc.Policy(backoff_initial=timedelta(seconds=2), jitter=0.0)
    at = T0 + timedelta(seconds=2)
    retry = rc.decide(taken, rc.CheckResult(CheckFinding.ERROR, detail="http_503"), policy, at, at)
    assert isinstance(retry, rc.Retry)
    at2 = T0 + timedelta(seconds=5)
    done = rc.decide(
        retry.progress, rc.CheckResult(CheckFinding.VERIFIED, "pi_1"), policy, at2, at2
    )
    return [taken, retry.progress, done.progress]


def test_a_work_item_shows_the_checks_made_and_the_next_one_due(tmp_path: Path) -> None:
    view = ConsoleView(tmp_path / "c.sqlite3")
    taken, waiting, verified = progress()
    view.apply(
        [Incoming("w", 0, 0, ITEM), Incoming("c", 0, 0, taken), Incoming("c", 0, 1, waiting)]
    )
    (row,) = view.query("work-items", {}).items
    r = row["reconciler"]
    assert r["state"] == ReconciliationState.CHECKING
    assert [(c["finding"], c["detail"]) for c in r["checks"]] == [("ERROR", "http_503")]
    assert r["next_check_at"] == "2026-07-26T16:00:04Z"
    # the execution's page has it too
    (item,) = view.execution("ex-1")["work_items"]
    assert item["reconciler"]["checks"][0]["detail"] == "http_503"
    view.apply([Incoming("c", 0, 2, verified), Incoming("c", 0, 3, waiting)])  # then an old copy
    (row,) = view.query("work-items", {}).items
    r = row["reconciler"]
    assert r["state"] == ReconciliationState.VERIFIED and r["effect_ref"] == "pi_1"
    assert [c["finding"] for c in r["checks"]] == ["ERROR", "VERIFIED"]
    assert r["next_check_at"] is None


def test_progress_read_before_its_work_item(tmp_path: Path) -> None:
    view = ConsoleView(tmp_path / "c.sqlite3")
    _, waiting, _ = progress()
    view.apply([Incoming("c", 1, 0, waiting), Incoming("w", 0, 0, ITEM)])
    (row,) = view.query("work-items", {}).items
    assert row["reconciler"]["checks"][0]["finding"] == "ERROR"


def test_a_work_item_without_a_reconciler_shows_none(tmp_path: Path) -> None:
    view = ConsoleView(tmp_path / "c.sqlite3")
    view.apply([Incoming("w", 0, 0, ITEM)])
    (row,) = view.query("work-items", {}).items
    assert row["reconciler"] is None
