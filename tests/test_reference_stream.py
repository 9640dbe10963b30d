"""The reference audit played as events through the processor gives the audit's verdicts."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from streams.contracts.models.outputs import ApprovalVerdict
from streams.engine.processor import Processor, Stores
from streams.local.scenario import REFERENCE_AT, REFERENCE_AUDIT, Tick, demo_scenario
from tests.test_processor import TOPICS, env, ticks

EXPECTED = {
    "req-export": "WAITING",
    "req-deletion": "STALE_REQUEST",
    "req-rotation": "UNROUTABLE_WAIT",
    "req-invoice": "ORPHANED_WAIT",
    "req-deploy": "STUCK_AFTER_DECISION",
    "req-message": "CLOSED_BY_DECLINE",
}


def play(steps) -> list:
    proc = Processor(TOPICS, Stores())
    out = []
    for s in steps:
        if isinstance(s, Tick):
            out += ticks(proc, s.at)
        else:
            out += [e.record for e in proc.handle(env(s))]
    return out


def final_verdicts(records) -> dict[str, str]:
    last: dict[str, str] = {}
    for r in records:
        if isinstance(r, ApprovalVerdict) and r.evaluated_at <= REFERENCE_AT:
            last[r.request_id] = str(r.verdict)
    return last


def test_offline_audit_gives_the_reference_verdicts() -> None:
    import typer

    from streams.audit import audit

    app = typer.Typer()
    app.command()(audit)
    res = CliRunner().invoke(
        app, [str(REFERENCE_AUDIT), "--at", REFERENCE_AT.isoformat(), "--json"]
    )
    got = {json.loads(x)["request_id"]: json.loads(x)["verdict"] for x in res.stdout.splitlines()}
    assert got == EXPECTED


def test_stream_gives_the_same_verdicts_as_the_audit() -> None:
    assert final_verdicts(play(demo_scenario())) == EXPECTED


def test_interleaving_and_tick_phase_do_not_change_outputs() -> None:
    steps = demo_scenario()
    a = play(steps)
    # another interleaving: events of different topics swapped within the same minute, and
    # ticks at another phase (every 20 s instead of every minute)
    events = [s for s in steps if not isinstance(s, Tick)]
    reordered = sorted(
        events, key=lambda e: (e.occurred_at.replace(second=0), type(e).__name__, e.occurred_at)
    )
    other_ticks = [Tick(t.at.replace(second=20)) for t in steps if isinstance(t, Tick)][:-1]
    merged = sorted(
        reordered + other_ticks + [steps[-1]],
        key=lambda s: (s.at if isinstance(s, Tick) else s.occurred_at, isinstance(s, Tick)),
    )
    b = play(merged)
    key = lambda r: (type(r).__name__, r.model_dump_json())  # noqa: E731
    kinds = ("ApprovalVerdict", "ReconciliationWorkItem", "Alert", "WorkItemResolution")
    pick = lambda rs: sorted(key(r) for r in rs if type(r).__name__ in kinds)  # noqa: E731
    assert pick(a) == pick(b)
