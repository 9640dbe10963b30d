"""The published retry verdict of an operation is the most restrictive over the attempts that
bear on a new send: its own attempts still in flight or verified, and those of operations of
the same execution sharing one of its idempotency keys (docs/rules.md#the-operations-verdict)."""

from __future__ import annotations

from hypothesis import given, settings

from streams.contracts.models.enums import AlertKind, RetryVerdict, WorkItemKind
from streams.contracts.models.events import OperationEvent
from streams.contracts.models.outputs import Alert, OperationState, WorkItemResolution
from streams.core.operations import (
    OperationBook,
    OperationStep,
    advance,
    apply_event,
    current_states,
    work_item_id,
)
from tests.test_core_operations import CFG, EXE, TABLE, E, K, S, Tick, _steps, at, ev, ms, of, run

V = RetryVerdict

#: How far a verdict holds an agent back, written out here independently of the core: an
#: outcome still open (unknown, with a human, in flight) outranks an effect that is done, and
#: every one of those outranks a verdict that lets the agent send.
RANK = {
    V.SAFE: 0,
    V.NOTHING_SENT: 1,
    V.NOT_NEEDED: 2,
    V.WAIT: 3,
    V.OWNER_DECIDES: 4,
    V.FORBIDDEN: 5,
}
#: A send while an attempt is in one of these is a forbidden retry (VERIFIED too: the effect is
#: certain, a second send is a second effect).
HOLDS = {S.SENT, S.ACKNOWLEDGED, S.UNKNOWN, S.RECONCILING, S.MANUAL_REVIEW, S.VERIFIED}
SENDS_ALLOWED = {V.SAFE, V.NOTHING_SENT}


def _unknown_then_forbidden_retry_rejected() -> tuple[OperationStep, list[OperationState]]:
    """The issue's sequence: attempt 1 SENT, its reply times out; attempt 2 is sent anyway and
    the connector rejects it."""
    states: list[OperationState] = []
    step = run(ev(K.SENT, 0, attempt=1))
    states += of(step, OperationState)
    step = advance(step.book, ms(31))
    states += of(step, OperationState)
    step = run(ev(K.SENT, 40, attempt=2), book=step.book)
    assert [a.kind for a in of(step, Alert)] == [AlertKind.FORBIDDEN_RETRY]
    states += of(step, OperationState)
    step = run(ev(K.FAILED, 41, attempt=2, source=E.CONNECTOR), book=step.book)
    states += of(step, OperationState)
    return step, states


def test_a_rejected_forbidden_retry_leaves_the_verdict_forbidden_while_attempt_1_is_unknown() -> (
    None
):
    step, states = _unknown_then_forbidden_retry_rejected()
    wi1 = work_item_id(EXE, "op-1", 1, WorkItemKind.REPLY_TIMEOUT)
    last = states[-1]
    # the latest attempt's own facts are shown as they are ...
    assert (last.attempt, last.status) == (2, S.FAILED)
    # ... and the verdict is the one a consumer can act on
    assert last.retry is V.FORBIDDEN
    assert last.open_work_item_id == wi1
    assert (last.held_by_operation_id, last.held_by_attempt, last.held_by_status) == (
        "op-1",
        1,
        S.UNKNOWN,
    )
    # the send of attempt 2 already said so, while attempt 2 was only SENT
    assert (states[-2].attempt, states[-2].status, states[-2].retry) == (2, S.SENT, V.FORBIDDEN)
    assert states[-2].held_by_attempt == 1 and states[-2].open_work_item_id == wi1
    # the read side shows the same
    (shown,) = current_states(step.book)
    assert shown.model_dump(exclude={"state_id"}) == last.model_dump(exclude={"state_id"})


def test_settling_attempt_1_republishes_the_operation_with_the_verdict_released() -> None:
    step, states = _unknown_then_forbidden_retry_rejected()
    settled = run(ev(K.FAILED, 90, attempt=1, source=E.RECONCILER), book=step.book)
    state, resolution, resolved, retry_ended = settled.outputs
    assert isinstance(resolution, WorkItemResolution) and resolution.attempt == 1
    assert isinstance(resolved, Alert)
    # both attempts settled, neither took effect: the forbidden retry's alert ends too
    assert isinstance(retry_ended, Alert) and retry_ended.kind == "FORBIDDEN_RETRY"
    assert retry_ended.status == "RESOLVED"
    assert isinstance(state, OperationState)
    assert (state.attempt, state.status, state.retry) == (2, S.FAILED, V.SAFE)
    assert state.open_work_item_id is None and state.held_by_attempt is None
    assert state.held_by_operation_id is None and state.held_by_status is None
    # a new record for the compacted topic, not a repeat of an earlier one
    assert state.state_id not in {s.state_id for s in states}
    # the verdict is now trustworthy: attempt 3 is no forbidden retry
    assert not of(run(ev(K.SENT, 100, attempt=3), book=settled.book), Alert)


def test_attempt_1_verified_after_the_rejected_retry_says_not_needed() -> None:
    step, _ = _unknown_then_forbidden_retry_rejected()
    settled = run(ev(K.VERIFIED, 90, attempt=1, source=E.RECONCILER), book=step.book)
    (state,) = of(settled, OperationState)
    assert (state.attempt, state.status, state.retry) == (2, S.FAILED, V.NOT_NEEDED)
    assert (state.held_by_attempt, state.held_by_status) == (1, S.VERIFIED)
    assert state.open_work_item_id is None


def test_a_timeout_of_an_older_attempt_republishes_the_operation() -> None:
    book = run(ev(K.SENT, 0, attempt=1), ev(K.SENT, 5, attempt=2)).book
    fired = advance(book, ms(31))
    (state,) = of(fired, OperationState)
    assert (state.attempt, state.status, state.retry) == (2, S.SENT, V.FORBIDDEN)
    assert (state.held_by_attempt, state.held_by_status) == (1, S.UNKNOWN)
    assert state.open_work_item_id == work_item_id(EXE, "op-1", 1, WorkItemKind.REPLY_TIMEOUT)
    assert state.since == at(5)  # the latest attempt's own time, unchanged


def test_an_operation_sharing_the_idempotency_key_holds_the_verdict_back() -> None:
    book = run(ev(K.SENT, 0, op="op-1", key="pay-7")).book
    book = advance(book, ms(31)).book  # op-1 UNKNOWN
    step = run(
        ev(K.SENT, 40, op="op-2", key="pay-7"),
        ev(K.FAILED, 41, op="op-2", key="pay-7", source=E.CONNECTOR),
        book=book,
    )
    state = of(step, OperationState)[-1]
    assert (state.operation_id, state.status, state.retry) == ("op-2", S.FAILED, V.FORBIDDEN)
    assert (state.held_by_operation_id, state.held_by_attempt) == ("op-1", 1)
    assert state.open_work_item_id == work_item_id(EXE, "op-1", 1, WorkItemKind.REPLY_TIMEOUT)
    # op-1's settlement re-publishes op-2 too; another key's operation is not touched
    book = run(ev(K.SENT, 42, op="op-3", key="pay-8"), book=step.book).book
    settled = run(ev(K.FAILED, 90, op="op-1", key="pay-7", source=E.CONNECTOR), book=book)
    assert [(s.operation_id, s.retry) for s in of(settled, OperationState)] == [
        ("op-1", V.SAFE),
        ("op-2", V.SAFE),
    ]


def test_a_later_attempt_back_in_the_same_state_gets_a_new_state_id() -> None:
    """attempt 2 SENT (WAIT), attempt 1 times out (FORBIDDEN), attempt 1 fails (WAIT again):
    the third record has the first one's content, so it must not have its id, or a consumer
    that drops seen ids would stay at FORBIDDEN."""
    prepared = run(ev(K.PREPARED, 0, attempt=1)).book
    second = run(ev(K.SENT, 1, attempt=2, reply_due_at=at(500)), book=prepared)
    states = of(second, OperationState)
    first = run(ev(K.SENT, 2, attempt=1), book=second.book)  # a forbidden retry ...
    assert of(first, Alert) and not of(first, OperationState)  # ... the verdict stays WAIT
    fired = advance(first.book, ms(32))
    states += of(fired, OperationState)
    again = run(ev(K.FAILED, 50, attempt=1, source=E.CONNECTOR), book=fired.book)
    states += of(again, OperationState)
    assert [s.retry for s in states] == [V.WAIT, V.FORBIDDEN, V.WAIT]
    assert states[0].model_dump(exclude={"state_id"}) == states[2].model_dump(exclude={"state_id"})
    assert len({s.state_id for s in states}) == 3


def test_alternating_review_at_one_instant_gives_distinct_state_ids() -> None:
    book = advance(run(ev(K.SENT)).book, ms(31)).book
    step = run(
        ev(K.RECONCILING, 40, source=E.RECONCILER),
        ev(K.MANUAL_REVIEW, 40, source=E.RECONCILER),
        ev(K.RECONCILING, 40, source=E.HUMAN),
        book=book,
    )
    ids = [s.state_id for s in of(step, OperationState)]
    assert len(ids) == 3 and len(set(ids)) == 3


# --- properties -----------------------------------------------------------------------------


def _reference(book: OperationBook, op_id: str) -> tuple[RetryVerdict, bool]:
    """The most restrictive verdict over the latest attempt and every attempt that holds a new
    send back, and whether any of them has an open work item, computed from the attempts
    alone (scanning every operation, not the book's key index)."""
    op = book.operations[op_id]
    latest = op.attempts[max(op.attempts)]
    keys = {a.idempotency_key for a in op.attempts.values()} - {None}
    holding = [a for n, a in op.attempts.items() if n != latest.attempt and a.status in HOLDS]
    holding += [
        a
        for other_id, other in book.operations.items()
        if other_id != op_id
        for a in other.attempts.values()
        if a.idempotency_key in keys and a.status in HOLDS
    ]
    verdict = max([TABLE[latest.status], *(TABLE[a.status] for a in holding)], key=RANK.__getitem__)
    has_item = latest.work_item_id is not None or any(a.work_item_id for a in holding)
    return verdict, has_item


def _play_fine(steps: list) -> list[tuple[object, OperationStep]]:
    """Fold the steps; a tick advances deadline by deadline, so every published state is
    checked against the book it was computed from (only deadlines at one instant share a
    step)."""
    book: OperationBook | None = None
    log: list[tuple[object, OperationStep]] = []
    for s in steps:
        if isinstance(s, Tick):
            while book is not None:
                due = min(
                    (
                        d
                        for op in book.operations.values()
                        for a in op.attempts.values()
                        if (d := a.armed_deadline()) is not None
                    ),
                    default=None,
                )
                if due is None or due > ms(s.seconds):
                    break
                step = advance(book, due)
                log.append((s, step))
                book = step.book
        else:
            assert isinstance(s, OperationEvent)
            step = apply_event(book, s, CFG)
            log.append((s, step))
            book = step.book
    return log


def _send(book: OperationBook, op_id: str, key: str | None) -> OperationEvent:
    """The next send an agent would make for the operation: the latest attempt if it was
    only prepared, else a new one."""
    latest = book.operations[op_id].current
    attempt = latest.attempt if latest.status is S.PREPARED else latest.attempt + 1
    return ev(K.SENT, 2000, op=op_id, attempt=attempt, key=key, event_id="agent-send")


@settings(max_examples=400, deadline=None)
@given(_steps)
def test_every_published_verdict_is_the_most_restrictive_and_the_topic_stays_current(
    steps: list,
) -> None:
    compacted: dict[str, OperationState] = {}
    seen_ids: dict[str, set[str]] = {}
    for _, step in _play_fine(steps):
        book = step.book
        states = of(step, OperationState)
        last_of: dict[str, OperationState] = {}
        for s in states:
            ids = seen_ids.setdefault(s.operation_id, set())
            assert s.state_id not in ids, "a state id published twice for one operation"
            ids.add(s.state_id)
            last_of[s.operation_id] = s
        for op_id, s in last_of.items():
            verdict, has_item = _reference(book, op_id)
            assert s.retry is verdict
            if has_item:
                assert s.open_work_item_id is not None
            held = (s.held_by_operation_id, s.held_by_attempt, s.held_by_status)
            if s.held_by_attempt is None:
                assert held == (None, None, None) and s.retry is TABLE[s.status]
            else:
                holder = book.operations[s.held_by_operation_id].attempts[s.held_by_attempt]
                assert holder.status is s.held_by_status and TABLE[holder.status] is s.retry
                assert (s.held_by_operation_id, s.held_by_attempt) != (op_id, s.attempt)
        compacted |= last_of
        # the compacted topic shows every operation's current state after every step
        current = {c.operation_id: c for c in current_states(book)}
        assert compacted.keys() == current.keys()
        for op_id, c in current.items():
            shown = compacted[op_id].model_dump(exclude={"state_id"})
            assert shown == c.model_dump(exclude={"state_id"})


@settings(max_examples=300, deadline=None)
@given(_steps)
def test_an_agent_that_trusts_the_verdict_never_makes_a_forbidden_retry(steps: list) -> None:
    log = _play_fine(steps)
    if not log:
        return
    book = log[-1][1].book
    for state in current_states(book):
        op_id = state.operation_id
        keys = {a.idempotency_key for a in book.operations[op_id].attempts.values()}
        if state.retry in SENDS_ALLOWED:
            for key in keys | {None}:
                sent = apply_event(book, _send(book, op_id, key), CFG)
                assert not of(sent, Alert), (state, key)
        else:
            held_key = (
                book.operations[state.held_by_operation_id]
                .attempts[state.held_by_attempt]
                .idempotency_key
                if state.held_by_attempt is not None
                else state.idempotency_key
            )
            sent = apply_event(book, _send(book, op_id, held_key), CFG)
            assert [a.kind for a in of(sent, Alert)] == [AlertKind.FORBIDDEN_RETRY]
