"""The execution aggregate: one input or one instant, one step; the parts it replaces are
named, the instants it must be advanced at are given, and the published state follows what
its books hold open."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from streams.contracts.models.enums import ApprovalVerdictCode, ExecutionStatus
from streams.contracts.models.events import ApprovalRequested, ExecutionStatusChanged
from streams.contracts.models.outputs import ExecutionState
from streams.core import executions as ex
from streams.core.execution import Execution, Rules, Snapshot, Verdict

T0 = datetime(2026, 1, 1, tzinfo=UTC)
RULES = Rules(closed_retention=timedelta(hours=2))


def ms(at: timedelta) -> int:
    """Epoch milliseconds of ``T0 + at``: the aggregate's time."""
    return ex.to_ms(T0 + at)


def status(seq: int, s: ExecutionStatus, at: timedelta) -> ExecutionStatusChanged:
    return ExecutionStatusChanged(
        event_id=f"s{seq}", execution_id="x1", sequence=seq, status=s, occurred_at=T0 + at
    )


def requested(at: timedelta) -> ApprovalRequested:
    return ApprovalRequested(
        event_id="r",
        execution_id="x1",
        occurred_at=T0 + at,
        request_id="r1",
        action="deploy",
        action_digest="A",
        approver_ref="role:owner",
        resume_handle="h",
    )


def test_a_status_replaces_the_slot_and_publishes_it() -> None:
    e = Execution("x1", RULES)
    step = e.apply(status(1, ExecutionStatus.CREATED, timedelta(0)))
    assert e.changed == {"inflight"} and isinstance(e.inflight, ex.InFlight)
    assert [type(o) for o in step.outputs] == [ExecutionState] and step.due == []
    assert step.trace_key is not None


def test_an_approval_fact_waits_in_the_book_until_its_time_is_advanced_past() -> None:
    e = Execution("x1", RULES)
    e.apply(status(1, ExecutionStatus.RUNNING, timedelta(0)))
    e.changed.clear()
    step = e.apply(requested(timedelta(seconds=5)))
    assert e.changed == {"approvals"} and step.outputs == []
    assert step.due == [ms(timedelta(seconds=5))]
    assert ms(timedelta(seconds=5)) in e.next_due()
    advanced = e.advance(ms(timedelta(seconds=5)))
    verdicts = [o for o in advanced.outputs if isinstance(o, Verdict)]
    assert [v.record.verdict for v in verdicts] == [ApprovalVerdictCode.UNCERTAIN]
    assert verdicts[0].previous_id is None
    # the request is open now: the state published after the verdict lists it
    states = [o for o in advanced.outputs if isinstance(o, ExecutionState)]
    assert [s.open_approval_ids for s in states] == [("r1",)]
    assert advanced.due and min(advanced.due) > ms(timedelta(seconds=5))


def test_a_terminal_status_leaves_a_tombstone_forgotten_after_the_retention() -> None:
    e = Execution("x1", RULES)
    e.apply(status(1, ExecutionStatus.RUNNING, timedelta(0)))
    e.changed.clear()
    step = e.apply(status(2, ExecutionStatus.FAILED, timedelta(minutes=1)))
    assert e.changed == {"inflight", "closed"} and e.inflight is None
    end = ms(timedelta(minutes=1) + RULES.closed_retention)
    assert step.due == [end] and e.next_due() == [end]
    e.changed.clear()
    e.advance(end - 1)
    assert e.closed is not None and not e.changed
    e.advance(end)
    assert e.closed is None and e.changed == {"closed"}
    assert e.snapshot() == Snapshot(None, None, None, None)


def test_a_refused_input_changes_nothing() -> None:
    e = Execution("x1", RULES)
    e.apply(status(1, ExecutionStatus.RUNNING, timedelta(0)))
    e.changed.clear()
    before = e.snapshot()
    step = e.apply(status(1, ExecutionStatus.RUNNING, timedelta(0)))
    assert e.snapshot() == before and not e.changed
    assert len(step.outputs) == 1 and step.trace_key is None
