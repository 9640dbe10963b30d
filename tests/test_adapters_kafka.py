"""The framework adapters end to end: a real agent of each framework (scripted, offline:
``streams.local.agents``) records through its adapter and the real recorder into the real
broker and registry, one real worker judges, and the verdicts it publishes are the ones the
rules give (docs/rules.md#verdicts). Event time comes from the recorder's injectable clock and
one clock tick, so nothing sleeps; one deployment and one worker serve the whole module."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from streams.contracts.models.enums import (
    AlertKind,
    ApprovalVerdictCode,
    OperationStatus,
    Proof,
    ProofState,
    RetryVerdict,
    WorkItemKind,
)
from streams.contracts.models.outputs import (
    Alert,
    ApprovalVerdict,
    OperationState,
    ReconciliationWorkItem,
)
from streams.local.agents import PLAYS, ScriptClock
from streams.recorder import Recorder, RecorderSettings
from tests.support import deployment, worker

pytestmark = pytest.mark.kafka
T0 = datetime(2026, 7, 26, 9, 0, tzinfo=UTC)
#: one tick past every grace (1 min after the decisions) and inside every heartbeat window
#: (10 min after the waits' last heartbeat)
TICK = T0 + timedelta(minutes=6)


@pytest.fixture(scope="module")
def judged(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Every play recorded, one tick, and what the worker published once the last expected
    verdict is out: the latest verdict per execution, operation states, work items, alerts."""
    tmp = tmp_path_factory.mktemp("adapters")
    dep = deployment(cluster, tmp)
    clock = ScriptClock(T0)
    rs = replace(RecorderSettings(), spool_dir=str(tmp / "spool"))
    recorder = Recorder(
        dep.settings, recorder_settings=rs, codec=dep.codec, clock=clock, exit_hook=False
    )
    cases = {}
    for play in PLAYS.values():
        for case in play(recorder, clock, tmp / "agents", "e2e-"):
            cases[case.execution_id] = case
    assert clock.at < T0 + timedelta(minutes=4)  # the plays fit before the tick
    # the first module on a freshly started broker: its first deliveries can take a while
    assert recorder.flush(120) == 0
    recorder.close()
    dep.tick(TICK)
    outputs = [
        dep.topics.approval_verdicts.name,
        dep.topics.operation_state.name,
        dep.topics.reconciliation_work.name,
        dep.topics.alerts.name,
    ]
    waits = {ex for ex, c in cases.items() if c.expect in ApprovalVerdictCode.__members__}

    def latest(records: list[Any]) -> dict[str, ApprovalVerdict]:
        out: dict[str, ApprovalVerdict] = {}
        for r in records:
            v = r.record
            if isinstance(v, ApprovalVerdict):
                cur = out.get(v.execution_id)
                if cur is None or v.evaluated_at >= cur.evaluated_at:
                    out[v.execution_id] = v
        return out

    def done(records: list[Any]) -> bool:
        got = latest(records)
        retries = [
            r.record
            for r in records
            if isinstance(r.record, Alert) and r.record.kind is AlertKind.FORBIDDEN_RETRY
        ]
        return all(ex in got and got[ex].verdict == cases[ex].expect for ex in waits) and bool(
            retries
        )

    with worker(dep):
        try:
            got = dep.read_until(outputs, done, timeout=90)
        except AssertionError:
            got = dep.read(outputs, idle=1.0)  # the tests say what is missing
    records = [r.record for r in got]
    yield {"cases": cases, "verdicts": latest(got), "records": records}


def verdict_of(judged: dict[str, Any], execution_id: str) -> ApprovalVerdict:
    verdicts = judged["verdicts"]
    assert execution_id in verdicts, f"no verdict for {execution_id}: {sorted(verdicts)}"
    return verdicts[execution_id]


def test_langgraph_waiting_on_a_human_with_a_sqlite_checkpointer_is_waiting(
    judged: dict[str, Any],
) -> None:
    v = verdict_of(judged, "e2e-lg-sqlite-waiting")
    assert v.verdict is ApprovalVerdictCode.WAITING
    assert v.failed_proofs == ()


def test_the_same_graph_on_an_in_memory_saver_is_an_orphaned_wait(
    judged: dict[str, Any],
) -> None:
    """Same graph, same facts, but the interruption lives in the process's memory: no
    durable resume handle, so the live-resume proof fails (NO_RESUME_HANDLE)."""
    v = verdict_of(judged, "e2e-lg-memory-waiting")
    assert v.verdict is ApprovalVerdictCode.ORPHANED_WAIT
    failed = [(p.proof, p.reason) for p in v.failed_proofs if p.state is ProofState.FAILED]
    assert failed == [(Proof.LIVE_RESUME, "NO_RESUME_HANDLE")]


def test_langgraph_resumed_past_its_interrupt_is_resumed(judged: dict[str, Any]) -> None:
    assert verdict_of(judged, "e2e-lg-sqlite-resumed").verdict is ApprovalVerdictCode.RESUMED


def test_openai_agents_approved_but_never_resumed_is_stuck_after_its_grace(
    judged: dict[str, Any],
) -> None:
    v = verdict_of(judged, "e2e-oa-approved-never-resumed")
    assert v.verdict is ApprovalVerdictCode.STUCK_AFTER_DECISION
    assert ("CONSUMED_DECISION", "NO_RESUME_RECEIPT") in [
        (p.proof, p.reason) for p in v.failed_proofs
    ]
    # judged at its decision + the Approval's grace (60 s), not at the tick
    assert v.evaluated_at < TICK


def test_openai_agents_run_resumed_past_the_approved_call_is_resumed(
    judged: dict[str, Any],
) -> None:
    assert verdict_of(judged, "e2e-oa-approved-resumed").verdict is ApprovalVerdictCode.RESUMED


def test_a_tool_call_that_times_out_is_unknown_and_its_retry_is_forbidden(
    judged: dict[str, Any],
) -> None:
    """The SMS tool timed out (the SDK's own timeout): the first call becomes UNKNOWN with a
    REPLY_TIMEOUT work item, never FAILED; the model's second call with the same idempotency
    key raises a FORBIDDEN_RETRY alert naming the first."""
    ex = "e2e-oa-sms-timeout-retry"
    records = judged["records"]
    first = [r for r in records if isinstance(r, OperationState) and r.operation_id == f"{ex}/c-1"]
    assert first and first[-1].status is OperationStatus.UNKNOWN
    assert first[-1].retry is RetryVerdict.FORBIDDEN
    assert first[-1].idempotency_key == "+15550100"
    items = [r for r in records if isinstance(r, ReconciliationWorkItem) and r.execution_id == ex]
    assert (f"{ex}/c-1", WorkItemKind.REPLY_TIMEOUT) in [(i.operation_id, i.kind) for i in items]
    retries = [
        a
        for a in records
        if isinstance(a, Alert) and a.kind is AlertKind.FORBIDDEN_RETRY and a.execution_id == ex
    ]
    assert len(retries) == 1
    assert retries[0].subject_id == f"{ex}/c-2"
    assert any(f"{ex}/c-1" in e for e in retries[0].evidence)


def test_an_mcp_cancel_closes_by_cancel_not_by_decline(judged: dict[str, Any]) -> None:
    assert verdict_of(judged, "e2e-mcp-cancel").verdict is ApprovalVerdictCode.CLOSED_BY_CANCEL
    assert verdict_of(judged, "e2e-mcp-decline").verdict is ApprovalVerdictCode.CLOSED_BY_DECLINE


def test_every_case_of_every_play_was_judged_as_expected(judged: dict[str, Any]) -> None:
    """The cases the demo shows (``vigil demo --agent``) are the verdicts the worker gives."""
    for ex, case in judged["cases"].items():
        if case.expect in ApprovalVerdictCode.__members__:
            assert verdict_of(judged, ex).verdict == case.expect, case
