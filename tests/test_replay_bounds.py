"""A replay to T and an audit at T agree on the same facts.

The boundary at exactly T: an event stamped T counts, a deadline due at T is reached, and when
both fall at T the event goes first (as the live processor orders them). Driven here on the
pure processor with the replay's own end-of-range rules (``in_range``, ``end_ticks``); the same
scenario through ``vigil replay`` on the broker is in ``tests/test_replay_kafka.py``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from streams.audit import run_audit
from streams.contracts.models.base import Record
from streams.contracts.models.enums import DecisionCode, DeliveryOutcome, Risk
from streams.contracts.models.events import (
    ApprovalDecision,
    ApprovalDelivery,
    ApprovalRequested,
    RequesterHeartbeat,
    ResumeReceipt,
)
from streams.contracts.models.outputs import ApprovalVerdict
from streams.engine.processor import Processor, Stores
from streams.local.scenario import Tick
from streams.replay import end_ticks, in_range
from tests.test_processor import TOPICS, env, ticks

T = datetime(2026, 7, 26, 16, 30, tzinfo=UTC)
START = T - timedelta(minutes=30)


def _min(minutes: float) -> datetime:
    return T + timedelta(minutes=minutes)


#: request id -> (expires_at, decision and its time, receipt time), minutes relative to T.
#: Every request: made at T-30 min, delivered at T-29, its run's heartbeat at T-5 (fresh).
CASES: dict[str, tuple[float | None, tuple[DecisionCode, float] | None, float | None]] = {
    "req-expires-at-t": (0, None, None),  # a deadline at exactly T
    "req-answered-at-t": (60, (DecisionCode.ACCEPT, 0), None),  # an answer stamped T
    "req-declined-as-it-expires": (0, (DecisionCode.DECLINE, 0), None),  # both at once
    "req-accepted-as-it-expires": (0, (DecisionCode.ACCEPT, 0), None),  # both at once
    "req-grace-ends-at-t": (60, (DecisionCode.ACCEPT, -5), None),  # decision + grace = T
    "req-receipt-after-t": (60, (DecisionCode.ACCEPT, -10), 1),  # a fact after the range
}


def boundary_scenario() -> tuple[list[Any], list[str]]:
    """The log (events and ticks, each topic in time order, running past T) and the audit
    snapshot of the same requests as of T (facts stamped up to T, none after)."""
    steps: list[Any] = []
    lines: list[str] = []
    for rid, (expires, decision, receipt) in CASES.items():
        ex = f"ex-{rid}"
        common = {"execution_id": ex, "request_id": rid}
        steps += [
            ApprovalRequested(
                **common,
                event_id=f"{rid}-req",
                action="deploy",
                action_digest="A",
                occurred_at=START,
                expires_at=_min(expires) if expires is not None else None,
                approver_ref="role:release-owner",
                resume_handle=f"interrupt://{ex}/1",
                risk=Risk.LOW,
            ),
            ApprovalDelivery(
                **common,
                event_id=f"{rid}-del",
                occurred_at=START + timedelta(minutes=1),
                outcome=DeliveryOutcome.DELIVERED,
            ),
            RequesterHeartbeat(event_id=f"{rid}-hb", execution_id=ex, occurred_at=_min(-5)),
        ]
        line: dict[str, Any] = {
            "request_id": rid,
            "execution_id": ex,
            "action": "deploy",
            "action_digest": "A",
            "requested_at": START.isoformat(),
            "expires_at": _min(expires).isoformat() if expires is not None else None,
            "approver_ref": "role:release-owner",
            "delivery": "delivered",
            "risk": "low",
            "resume_handle": f"interrupt://{ex}/1",
            "requester_heartbeat_at": _min(-5).isoformat(),
        }
        if decision is not None:
            code, at = decision
            steps.append(
                ApprovalDecision(
                    **common, event_id=f"{rid}-dec", occurred_at=_min(at), decision=code
                )
            )
            line |= {"decision": code.value.lower(), "decided_at": _min(at).isoformat()}
        if receipt is not None:
            steps.append(ResumeReceipt(**common, event_id=f"{rid}-rcpt", occurred_at=_min(receipt)))
            if _min(receipt) <= T:
                line["resume_receipt_at"] = _min(receipt).isoformat()
        lines.append(json.dumps(line))
    steps += [Tick(_min(m)) for m in (-30, -20, -10, 0, 10)]  # a tick at T, one past it
    steps.sort(key=lambda s: (s.at if isinstance(s, Tick) else s.occurred_at, isinstance(s, Tick)))
    return steps, lines


def audit_at(lines: list[str], at: datetime) -> dict[str, tuple[str, list[Any]]]:
    results, errors = run_audit(lines, at)
    assert errors == ()
    return {
        r.evaluation.request_id: (
            r.evaluation.verdict.value,
            [f.model_dump(mode="json") for f in r.evaluation.failed_proofs],
        )
        for r in results
    }


def last_verdicts(records: list[Record]) -> dict[str, tuple[str, list[Any]]]:
    """The last verdict published per request (a request's verdicts come in time order)."""
    last: dict[str, tuple[str, list[Any]]] = {}
    for r in records:
        if isinstance(r, ApprovalVerdict):
            last[r.request_id] = (
                r.verdict.value,
                [f.model_dump(mode="json") for f in r.failed_proofs],
            )
    return last


def _ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


def replay_to(steps: list[Any], end: datetime) -> list[Record]:
    """What ``vigil replay --to end`` does with the log, on the pure processor: the records
    in range, then the ticks that close the range."""
    proc = Processor(TOPICS, Stores())
    out: list[Record] = []
    for s in steps:
        at = s.at if isinstance(s, Tick) else s.occurred_at
        if not in_range(_ms(at), _ms(end)):
            continue
        out += ticks(proc, s.at) if isinstance(s, Tick) else [e.record for e in proc.handle(env(s))]
    for e in end_ticks(TOPICS, None, end):
        out += [em.record for em in proc.handle(e)]
    assert proc.held() == 0
    return out


def test_the_scenario_sits_on_the_boundary() -> None:
    """At T the audit reaches the deadlines due at T and counts the answers stamped T; a
    millisecond earlier it does neither."""
    _, lines = boundary_scenario()
    at_t = {rid: v for rid, (v, _) in audit_at(lines, T).items()}
    assert at_t == {
        "req-expires-at-t": "STALE_REQUEST",
        "req-answered-at-t": "RESUMING",
        "req-declined-as-it-expires": "CLOSED_BY_DECLINE",
        "req-accepted-as-it-expires": "STALE_REQUEST",
        "req-grace-ends-at-t": "STUCK_AFTER_DECISION",
        "req-receipt-after-t": "STUCK_AFTER_DECISION",
    }
    before = [json.loads(x) for x in lines]
    for line in before:  # the facts stamped T are not there yet a millisecond before it
        if line.get("decided_at") == T.isoformat():
            line.pop("decision"), line.pop("decided_at")
    just_before = audit_at([json.dumps(x) for x in before], T - timedelta(milliseconds=1))
    assert all(just_before[rid][0] == "WAITING" for rid in CASES if CASES[rid][0] == 0)
    assert just_before["req-grace-ends-at-t"][0] == "RESUMING"


def test_a_replay_to_t_ends_with_the_audits_verdicts_at_t() -> None:
    steps, lines = boundary_scenario()
    out = replay_to(steps, T)
    assert last_verdicts(out) == audit_at(lines, T)
    # nothing stamped after the end, nothing from after it
    assert all(v.evaluated_at <= T for v in out if isinstance(v, ApprovalVerdict))


def test_replays_to_consecutive_ends_agree_with_the_audit_at_each() -> None:
    """The boundary moves with the end: one millisecond before T the facts and deadlines at
    T are not reached yet, by the replay as by the audit."""
    steps, lines = boundary_scenario()
    before = T - timedelta(milliseconds=1)
    snapshot = [json.loads(x) for x in lines]
    for line in snapshot:
        if line.get("decided_at") == T.isoformat():
            line.pop("decision"), line.pop("decided_at")
    assert last_verdicts(replay_to(steps, before)) == audit_at(
        [json.dumps(x) for x in snapshot], before
    )


def test_both_helps_state_the_boundary() -> None:
    from typer.testing import CliRunner

    from streams.cli.main import _mount_optional, app

    _mount_optional()
    runner = CliRunner(env={"COLUMNS": "200"})
    replay = " ".join(runner.invoke(app, ["replay", "--help"]).output.split())
    audit = " ".join(runner.invoke(app, ["audit", "--help"]).output.split())
    assert "up to and including" in replay and "vigil audit --at" in replay
    assert "deadline due at T is reached" in audit and "vigil replay --to T" in audit
