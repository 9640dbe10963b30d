"""The in-flight execution state machine: examples, then properties over arbitrary event streams."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.contracts.models.enums import AnomalyKind, ExecutionStatus
from streams.contracts.models.events import ExecutionStatusChanged
from streams.contracts.models.outputs import ExecutionState
from streams.core.executions import (
    LEGAL_TRANSITIONS,
    NON_TERMINAL,
    TERMINAL,
    Closed,
    ExecutionStep,
    InFlight,
    Slot,
    StatusEvent,
    apply_status,
    dump_slot,
    from_ms,
    is_legal,
    load_slot,
    rebuild,
    set_open_items,
    state_id,
    status_event,
    to_ms,
    to_state,
)
from streams.core.ids import deterministic_id

S = ExecutionStatus
T0 = datetime(2026, 7, 26, 16, 0, tzinfo=UTC)
ABORTS = {S.FAILED, S.CANCELLED, S.EXPIRED}
HAPPY = [
    S.CREATED,
    S.VALIDATING,
    S.RESOLVING_CONTEXT,
    S.PLANNING,
    S.RUNNING,
    S.WAITING_FOR_TOOL,
    S.WAITING_FOR_APPROVAL,
    S.VALIDATING_OUTPUT,
    S.COMPLETED,
]


def ms(t: datetime) -> int:
    return to_ms(t)


def ev(
    seq: int, status: S, *, at: int | None = None, eid: str | None = None, ex: str = "x1"
) -> StatusEvent:
    """A status event as the core reads it, made from the contract record; ``at`` is seconds
    after T0 (default: the sequence number)."""
    return status_event(
        ExecutionStatusChanged(
            event_id=eid or f"{ex}-e{seq}",
            execution_id=ex,
            sequence=seq,
            status=status,
            occurred_at=T0 + timedelta(seconds=seq if at is None else at),
        )
    )


def feed(events: list[StatusEvent], slot: Slot = None) -> tuple[Slot, list[ExecutionStep]]:
    steps = []
    for e in events:
        step = apply_status(slot, e)
        steps.append(step)
        slot = step.slot
    return slot, steps


# --- is_legal ---------------------------------------------------------------------------------


def test_happy_path_is_legal_step_by_step() -> None:
    for a, b in pairwise(HAPPY):
        assert is_legal(a, b), (a, b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (S.RUNNING, S.WAITING_FOR_TOOL),
        (S.WAITING_FOR_TOOL, S.RUNNING),
        (S.RUNNING, S.WAITING_FOR_APPROVAL),
        (S.WAITING_FOR_APPROVAL, S.RUNNING),
        (S.RUNNING, S.PLANNING),
        (S.VALIDATING_OUTPUT, S.RUNNING),
        (S.RUNNING, S.VALIDATING_OUTPUT),
    ],
)
def test_loops_are_legal(a: S, b: S) -> None:
    assert is_legal(a, b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (S.CREATED, S.RUNNING),  # skips validation
        (S.CREATED, S.COMPLETED),  # completion only after output validation
        (S.RUNNING, S.COMPLETED),
        (S.PLANNING, S.WAITING_FOR_TOOL),
        (S.WAITING_FOR_APPROVAL, S.WAITING_FOR_TOOL),
        (S.VALIDATING_OUTPUT, S.PLANNING),
        (S.RUNNING, S.CREATED),
        (S.UNRECOGNIZED, S.RUNNING),
        (S.RUNNING, S.UNRECOGNIZED),
    ],
)
def test_illegal_pairs(a: S, b: S) -> None:
    assert not is_legal(a, b)


def test_any_non_terminal_may_abort_and_nothing_leaves_a_terminal_state() -> None:
    for a in NON_TERMINAL:
        for b in (S.FAILED, S.CANCELLED, S.EXPIRED):
            assert is_legal(a, b)
    for a in TERMINAL:
        for b in S:
            assert not is_legal(a, b)


def test_same_status_is_not_a_transition() -> None:
    assert not any(is_legal(s, s) for s in S)


def test_the_whole_transition_table() -> None:
    """Spelled out once, so a change to the rules is a visible change to this test."""
    progress = {(a, b) for a, b in LEGAL_TRANSITIONS if b not in ABORTS}
    assert progress == {
        (S.CREATED, S.VALIDATING),
        (S.VALIDATING, S.RESOLVING_CONTEXT),
        (S.RESOLVING_CONTEXT, S.PLANNING),
        (S.PLANNING, S.RUNNING),
        (S.RUNNING, S.WAITING_FOR_TOOL),
        (S.WAITING_FOR_TOOL, S.RUNNING),
        (S.WAITING_FOR_TOOL, S.WAITING_FOR_APPROVAL),
        (S.RUNNING, S.WAITING_FOR_APPROVAL),
        (S.WAITING_FOR_APPROVAL, S.RUNNING),
        (S.WAITING_FOR_APPROVAL, S.VALIDATING_OUTPUT),
        (S.RUNNING, S.PLANNING),
        (S.RUNNING, S.VALIDATING_OUTPUT),
        (S.VALIDATING_OUTPUT, S.RUNNING),
        (S.VALIDATING_OUTPUT, S.COMPLETED),
    }
    assert LEGAL_TRANSITIONS - progress == {(a, b) for a in NON_TERMINAL for b in ABORTS}


# --- apply_status: examples -------------------------------------------------------------------


def test_happy_path_publishes_every_change_and_closes() -> None:
    events = [ev(i + 1, s) for i, s in enumerate(HAPPY)]
    slot, steps = feed(events)
    assert [s.anomaly for s in steps] == [None] * len(HAPPY)
    assert [s.published.status for s in steps if s.published] == HAPPY
    assert [s.closed for s in steps] == [False] * 8 + [True]
    final = steps[-1].published
    assert final is not None and final.terminal
    assert not any(s.published.terminal for s in steps[:-1] if s.published)
    assert final.first_seen_at == T0 + timedelta(seconds=1)
    assert final.since == final.last_event_at == T0 + timedelta(seconds=9)
    assert final.last_sequence == 9
    assert slot == Closed(
        execution_id="x1",
        status=S.COMPLETED,
        closed_at=ms(T0 + timedelta(seconds=9)),
        last_sequence=9,
        last_event_id="x1-e9",
    )


def test_loops_are_applied() -> None:
    path = [S.RUNNING, S.WAITING_FOR_TOOL, S.RUNNING, S.PLANNING, S.RUNNING, S.VALIDATING_OUTPUT]
    path += [S.RUNNING, S.WAITING_FOR_APPROVAL, S.RUNNING, S.VALIDATING_OUTPUT, S.COMPLETED]
    _, steps = feed([ev(i, s) for i, s in enumerate(path)])
    assert all(s.anomaly is None for s in steps)


def test_first_event_may_be_mid_run() -> None:
    step = apply_status(None, ev(42, S.WAITING_FOR_APPROVAL, at=5))
    assert step.anomaly is None and not step.closed
    assert isinstance(step.slot, InFlight)
    assert step.published == to_state(step.slot)
    assert step.published.status == S.WAITING_FOR_APPROVAL
    assert step.published.since == step.published.first_seen_at == T0 + timedelta(seconds=5)


def test_first_event_terminal_publishes_final_state_and_closes() -> None:
    step = apply_status(None, ev(7, S.FAILED))
    assert step.closed and isinstance(step.slot, Closed)
    assert step.published is not None and step.published.terminal
    assert step.published.status == S.FAILED
    assert step.anomaly is None


def test_unrecognized_status_is_an_anomaly_whatever_the_slot() -> None:
    running, _ = feed([ev(1, S.RUNNING)])
    closed, _ = feed([ev(1, S.CANCELLED)])
    for slot in (None, running, closed):
        step = apply_status(slot, ev(5, S.UNRECOGNIZED))
        assert step.anomaly is not None
        assert step.anomaly.kind == AnomalyKind.UNRECOGNIZED_SYMBOL
        assert step.slot == slot and step.published is None and not step.closed


def test_duplicate_by_sequence_and_by_event_id() -> None:
    slot, _ = feed([ev(1, S.CREATED), ev(2, S.VALIDATING)])
    same_seq = apply_status(slot, ev(2, S.RESOLVING_CONTEXT, eid="other"))
    same_id = apply_status(slot, ev(3, S.RESOLVING_CONTEXT, eid="x1-e2"))
    for step in (same_seq, same_id):
        assert step.anomaly is not None and step.anomaly.kind == AnomalyKind.DUPLICATE
        assert step.slot == slot and step.published is None


def test_same_status_with_a_higher_sequence_is_a_duplicate() -> None:
    slot, _ = feed([ev(1, S.RUNNING)])
    step = apply_status(slot, ev(2, S.RUNNING))
    assert step.anomaly is not None and step.anomaly.kind == AnomalyKind.DUPLICATE
    assert "does not change the status" in step.anomaly.reason
    assert step.slot == slot


def test_older_event_is_out_of_order() -> None:
    slot, _ = feed([ev(1, S.CREATED), ev(5, S.VALIDATING)])
    step = apply_status(slot, ev(3, S.FAILED))
    assert step.anomaly is not None and step.anomaly.kind == AnomalyKind.OUT_OF_ORDER
    assert step.slot == slot and not step.closed


def test_sequence_gaps_are_accepted_and_a_late_filler_is_out_of_order() -> None:
    slot, steps = feed([ev(1, S.CREATED), ev(4, S.VALIDATING), ev(2, S.VALIDATING)])
    assert [s.anomaly is None for s in steps] == [True, True, False]
    assert steps[-1].anomaly is not None
    assert steps[-1].anomaly.kind == AnomalyKind.OUT_OF_ORDER
    assert isinstance(slot, InFlight) and slot.last_sequence == 4


def test_illegal_transition_names_from_and_to() -> None:
    slot, _ = feed([ev(1, S.CREATED)])
    step = apply_status(slot, ev(2, S.COMPLETED))
    assert step.anomaly is not None and step.anomaly.kind == AnomalyKind.ILLEGAL_TRANSITION
    assert "CREATED → COMPLETED" in step.anomaly.reason
    assert step.slot == slot and step.published is None


def test_event_after_terminal_is_an_anomaly_not_a_resurrection() -> None:
    slot, _ = feed([ev(1, S.RUNNING), ev(2, S.CANCELLED)])
    for late in (ev(3, S.RUNNING), ev(1, S.CREATED, eid="new"), ev(9, S.FAILED)):
        step = apply_status(slot, late)
        assert step.anomaly is not None and step.anomaly.kind == AnomalyKind.AFTER_TERMINAL
        assert step.slot == slot and step.published is None and not step.closed


def test_redelivered_terminal_event_is_a_duplicate() -> None:
    terminal = ev(2, S.CANCELLED)
    slot, _ = feed([ev(1, S.RUNNING), terminal])
    step = apply_status(slot, terminal)
    assert step.anomaly is not None and step.anomaly.kind == AnomalyKind.DUPLICATE
    assert step.slot == slot


def test_last_event_at_never_goes_back_but_since_is_the_status_change() -> None:
    slot, _ = feed([ev(1, S.RUNNING, at=100), ev(2, S.WAITING_FOR_TOOL, at=90)])
    assert isinstance(slot, InFlight)
    assert slot.last_event_at == ms(T0 + timedelta(seconds=100))
    assert slot.since == ms(T0 + timedelta(seconds=90))


def test_a_stored_slot_cannot_be_in_flight_and_terminal_nor_closed_and_not_terminal() -> None:
    """What the table holds is checked when read, in both stored formats."""
    t = ms(T0)
    bad = [
        dump_slot(InFlight("x", S.COMPLETED, t, t, t, 1, "e")),
        dump_slot(Closed("x", S.RUNNING, t, 1, "e")),
        dump_slot(InFlight("x", S.RUNNING, t, t, t, 1, "e", ("b", "a"))),
        '{"kind":"in_flight","execution_id":"x","status":"COMPLETED","since":'
        '"2026-01-01T00:00:00Z","first_seen_at":"2026-01-01T00:00:00Z","last_event_at":'
        '"2026-01-01T00:00:00Z","last_sequence":1,"last_event_id":"e"}',
        '{"kind":"closed","execution_id":"x","status":"RUNNING","closed_at":'
        '"2026-01-01T00:00:00Z","last_sequence":1,"last_event_id":"e"}',
    ]
    for text in bad:
        with pytest.raises(ValueError):
            load_slot(text)


def test_format_1_slots_are_read_with_their_open_ids_made_canonical() -> None:
    """The JSON objects entries held before format 2 (what 6733ee4 wrote)."""
    text = (
        '{"kind":"in_flight","execution_id":"x","status":"RUNNING","since":'
        '"2026-01-01T00:00:01.500000Z","first_seen_at":"2026-01-01T00:00:00Z","last_event_at":'
        '"2026-01-01T00:00:02.250000Z","last_sequence":3,"last_event_id":"e3",'
        '"open_operation_ids":["b","a"],"open_approval_ids":[]}'
    )
    t = ms(datetime(2026, 1, 1, tzinfo=UTC))
    assert load_slot(text) == InFlight("x", S.RUNNING, t + 1500, t, t + 2250, 3, "e3", ("a", "b"))
    closed = (
        '{"kind":"closed","execution_id":"x","status":"FAILED","closed_at":'
        '"2026-01-01T00:00:00.001000Z","last_sequence":4,"last_event_id":"e4"}'
    )
    assert load_slot(closed) == Closed("x", S.FAILED, t + 1, 4, "e4")


@settings(max_examples=300)
@given(
    st.datetimes(
        min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
    )
)
def test_epoch_milliseconds_are_exact(at: datetime) -> None:
    """The core's times are whole milliseconds, as the contract truncates them; converting
    back gives the contract's time, and the status event's time is the record's."""
    truncated = at.replace(microsecond=at.microsecond // 1000 * 1000)
    assert from_ms(to_ms(truncated)) == truncated
    assert to_ms(at) == to_ms(truncated)
    record = ExecutionStatusChanged(
        event_id="e", execution_id="x", sequence=1, status=S.RUNNING, occurred_at=at
    )
    assert status_event(record).at == to_ms(record.occurred_at) == to_ms(truncated)


# --- set_open_items -----------------------------------------------------------------------------


def test_open_items_publish_only_on_change_sorted() -> None:
    slot, _ = feed([ev(1, S.RUNNING)])
    step = set_open_items(slot, ["op-b", "op-a", "op-b"], ["ap-1"], ms(T0 + timedelta(seconds=30)))
    assert step.published is not None and step.anomaly is None
    assert step.published.open_operation_ids == ("op-a", "op-b")
    assert step.published.open_approval_ids == ("ap-1",)
    assert step.published.last_event_at == T0 + timedelta(seconds=30)
    assert step.published.status == S.RUNNING and step.published.since == T0 + timedelta(seconds=1)
    assert isinstance(step.slot, InFlight) and to_state(step.slot) == step.published

    same = set_open_items(step.slot, ("op-a", "op-b"), ["ap-1"], ms(T0 + timedelta(seconds=60)))
    assert same.published is None and same.slot is step.slot


def test_open_items_survive_status_changes_and_appear_in_the_final_state() -> None:
    slot, _ = feed([ev(1, S.RUNNING)])
    slot = set_open_items(slot, ["op-1"], [], ms(T0 + timedelta(seconds=2))).slot
    slot, steps = feed([ev(3, S.WAITING_FOR_TOOL), ev(4, S.FAILED)], slot)
    assert [s.published.open_operation_ids for s in steps if s.published] == [("op-1",)] * 2


def test_open_items_are_a_no_op_for_unknown_and_closed_executions() -> None:
    closed, _ = feed([ev(1, S.EXPIRED)])
    for slot in (None, closed):
        step = set_open_items(slot, ["op"], ["ap"], ms(T0))
        assert step == ExecutionStep(slot=slot)


def test_open_items_given_unsorted_equal_the_stored_ones() -> None:
    slot = set_open_items(feed([ev(1, S.RUNNING)])[0], ("a", "b"), ("c",), ms(T0)).slot
    for ops in (("b", "a"), ["a", "b"], ("a", "b", "a")):
        step = set_open_items(slot, ops, ("c",), ms(T0 + timedelta(seconds=1)))
        assert step.published is None and step.slot is slot


def test_state_id_is_deterministic_and_follows_open_ids() -> None:
    a = feed([ev(1, S.RUNNING)])[1][0].published
    b = feed([ev(1, S.RUNNING)])[1][0].published
    assert a is not None and b is not None and a.state_id == b.state_id
    assert a.state_id.startswith("exec-")
    slot = feed([ev(1, S.RUNNING)])[0]
    changed = set_open_items(slot, ["op"], [], ms(T0 + timedelta(seconds=1))).published
    assert changed is not None and changed.state_id != a.state_id
    # Back to the old set later: a new record, so a new id.
    back = set_open_items(
        set_open_items(slot, ["op"], [], ms(T0 + timedelta(seconds=1))).slot,
        [],
        [],
        ms(T0 + timedelta(seconds=2)),
    ).published
    assert back is not None and back.state_id not in {a.state_id, changed.state_id}


@settings(max_examples=300)
@given(
    execution_id=st.text(min_size=1, max_size=40),
    sequence=st.integers(min_value=-(2**63), max_value=2**63 - 1),
    digest=st.text(alphabet="0123456789abcdef", min_size=16, max_size=16),
    at=st.datetimes(
        min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
    ),
)
def test_state_id_is_the_generic_deterministic_id(
    execution_id: str, sequence: int, digest: str, at: datetime
) -> None:
    """The spelled-out id of a published state hashes the very text the generic one does
    for the state's time (whole milliseconds): ids already published (and stored downstream
    for deduplication) stay the same."""
    at = at.replace(microsecond=at.microsecond // 1000 * 1000)
    assert state_id(execution_id, sequence, digest, to_ms(at)) == deterministic_id(
        "exec", execution_id, sequence, digest, at
    )


# --- storage and rebuild --------------------------------------------------------------------------


def test_slots_round_trip_through_json() -> None:
    running = set_open_items(feed([ev(1, S.RUNNING)])[0], ["b", "a"], ["c"], ms(T0)).slot
    closed = feed([ev(1, S.COMPLETED)])[0]
    for slot in (running, closed):
        assert slot is not None
        assert load_slot(dump_slot(slot)) == slot
    assert load_slot(None) is None


def test_rebuild_of_nothing_is_nothing() -> None:
    assert rebuild([]) is None


def test_rebuild_matches_the_happy_path() -> None:
    events = [ev(i + 1, s) for i, s in enumerate(HAPPY)]
    assert rebuild(events[:5]) == feed(events[:5])[0]
    assert rebuild(events) == feed(events)[0]


# --- properties ---------------------------------------------------------------------------------

STATUSES = list(S)
EXECUTIONS = ["a", "b", "c"]


@st.composite
def random_events(draw: st.DrawFn) -> list[StatusEvent]:
    """Anything at all: random statuses, colliding sequences and event ids, random times."""
    n = draw(st.integers(0, 40))
    return [
        ev(
            draw(st.integers(0, 12)),
            draw(st.sampled_from(STATUSES)),
            at=draw(st.integers(0, 200)),
            eid=f"e{draw(st.integers(0, 20))}",
            ex=draw(st.sampled_from(EXECUTIONS)),
        )
        for _ in range(n)
    ]


def _successors(status: S) -> list[S]:
    return sorted(b for a, b in LEGAL_TRANSITIONS if a == status)


@st.composite
def plausible_events(draw: st.DrawFn) -> list[StatusEvent]:
    """Legal walks (so that much is accepted), then damaged: duplicates, swaps, noise; and the
    executions interleaved arbitrarily."""
    per_execution: list[list[StatusEvent]] = []
    for ex in draw(st.lists(st.sampled_from(EXECUTIONS), min_size=1, max_size=3, unique=True)):
        status = draw(st.sampled_from(STATUSES[:-1]))
        seq, at = draw(st.integers(0, 3)), draw(st.integers(0, 50))
        walk = [ev(seq, status, at=at, ex=ex)]
        for _ in range(draw(st.integers(0, 12))):
            if status in TERMINAL:
                break
            # Mostly progress, sometimes an abort: long enough walks to exercise the loops.
            onward = [b for b in _successors(status) if b not in ABORTS] or _successors(status)
            abort = draw(st.integers(0, 9)) == 0
            status = draw(st.sampled_from(sorted(ABORTS) if abort else onward))
            seq += draw(st.integers(1, 3))
            at += draw(st.integers(-5, 30))
            walk.append(ev(seq, status, at=at, ex=ex))
        for _ in range(draw(st.integers(0, 4))):
            i = draw(st.integers(0, len(walk) - 1))
            base = walk[i]
            damage = draw(st.sampled_from(["redeliver", "reuse_seq", "reuse_id", "swap", "noise"]))
            if damage == "redeliver":
                walk.insert(draw(st.integers(i, len(walk))), base)
            elif damage == "reuse_seq":
                walk.insert(i + 1, base._replace(event_id=f"{ex}-other{i}"))
            elif damage == "reuse_id":
                walk.insert(i + 1, base._replace(sequence=base.sequence + 1))
            elif damage == "swap" and i + 1 < len(walk):
                walk[i], walk[i + 1] = walk[i + 1], walk[i]
            else:
                noise = ev(
                    base.sequence + draw(st.integers(-1, 2)),
                    draw(st.sampled_from(STATUSES)),
                    at=draw(st.integers(0, 200)),
                    eid=f"{ex}-noise{draw(st.integers(0, 99))}",
                    ex=ex,
                )
                walk.insert(i + 1, noise)
        per_execution.append(walk)
    order = draw(st.permutations([k for k, walk in enumerate(per_execution) for _ in walk]))
    queues = [list(walk) for walk in per_execution]
    return [queues[k].pop(0) for k in order]


@dataclass
class Spec:
    """The rules restated independently, per execution, to predict what must be accepted."""

    status: S | None = None
    seq: int | None = None
    eid: str | None = None
    closed: bool = False

    def verdict(self, e: StatusEvent) -> AnomalyKind | None:
        if e.status == S.UNRECOGNIZED:
            return AnomalyKind.UNRECOGNIZED_SYMBOL
        if self.status is None:
            return None
        dup = e.sequence == self.seq or e.event_id == self.eid
        if self.closed:
            return AnomalyKind.DUPLICATE if dup else AnomalyKind.AFTER_TERMINAL
        if dup:
            return AnomalyKind.DUPLICATE
        assert self.seq is not None
        if e.sequence < self.seq:
            return AnomalyKind.OUT_OF_ORDER
        if e.status == self.status:
            return AnomalyKind.DUPLICATE
        ok = (self.status, e.status) in LEGAL_TRANSITIONS
        return None if ok else AnomalyKind.ILLEGAL_TRANSITION

    def accept(self, e: StatusEvent) -> None:
        self.status, self.seq, self.eid, self.closed = (
            e.status,
            e.sequence,
            e.event_id,
            (e.status in TERMINAL),
        )


@dataclass
class Run:
    table: dict[str, InFlight | Closed] = field(default_factory=dict)
    accepted: dict[str, list[StatusEvent]] = field(default_factory=dict)
    published: dict[str, list[ExecutionState]] = field(default_factory=dict)
    refused: dict[str, list[StatusEvent]] = field(default_factory=dict)


def drive(events: list[StatusEvent], *, via_json: bool = False) -> Run:
    """The shell, reduced to a dict: look up, call the core, check invariants, store."""
    run, spec = Run(), {ex: Spec() for ex in EXECUTIONS}
    for e in events:
        ex = e.execution_id
        before = run.table.get(ex)
        if via_json and before is not None:
            before = load_slot(dump_slot(before))
        step = apply_status(before, e)
        expected = spec[ex].verdict(e)

        # Exactly one of: applied and published, or refused with an anomaly.
        assert (step.published is None) == (step.anomaly is not None)
        assert (step.anomaly.kind if step.anomaly else None) == expected, (e, before)
        if step.anomaly is not None:
            assert step.slot == before and not step.closed
            run.refused.setdefault(ex, []).append(e)
        else:
            assert step.published is not None
            spec[ex].accept(e)
            run.accepted.setdefault(ex, []).append(e)
            run.published.setdefault(ex, []).append(step.published)
            assert step.published.status == e.status
            assert step.published.last_sequence == e.sequence
            assert step.closed == (e.status in TERMINAL) == step.published.terminal
            # Never an older event over a newer one; nothing after Closed.
            assert not isinstance(before, Closed)
            if isinstance(before, InFlight):
                assert e.sequence > before.last_sequence

        if step.slot is None:
            assert before is None
        else:
            run.table[ex] = step.slot
        # The table never holds a terminal execution as in flight.
        for slot in run.table.values():
            assert (slot.status in TERMINAL) == isinstance(slot, Closed)
    return run


def check_run(run: Run) -> None:
    for ex, accepted in run.accepted.items():
        slot, last = run.table[ex], run.published[ex][-1]
        assert rebuild(accepted) == slot
        if isinstance(slot, InFlight):
            assert to_state(slot) == last and not last.terminal
        else:
            assert last.terminal and last.status == slot.status
            assert last.last_sequence == slot.last_sequence
            assert sum(p.terminal for p in run.published[ex]) == 1
            assert run.published[ex][-1].terminal
        seqs = [e.sequence for e in accepted]
        assert seqs == sorted(set(seqs))
        ids = [p.state_id for p in run.published[ex]]
        assert len(ids) == len(set(ids))
    for ex in run.refused:
        assert ex in run.accepted or all(e.status == S.UNRECOGNIZED for e in run.refused[ex])


@settings(max_examples=300, deadline=None)
@given(random_events())
def test_property_random_streams(events: list[StatusEvent]) -> None:
    check_run(drive(events))


@settings(max_examples=300, deadline=None)
@given(plausible_events())
def test_property_damaged_legal_walks(events: list[StatusEvent]) -> None:
    run = drive(events)
    check_run(run)
    assert sum(map(len, run.accepted.values())) + sum(map(len, run.refused.values())) == len(events)


@settings(max_examples=100, deadline=None)
@given(plausible_events())
def test_property_storing_slots_as_json_changes_nothing(
    events: list[StatusEvent],
) -> None:
    plain, stored = drive(events), drive(events, via_json=True)
    assert plain.published == stored.published and plain.table == stored.table


@settings(max_examples=200, deadline=None)
@given(
    plausible_events(),
    st.lists(
        st.tuples(
            st.integers(0, 60),
            st.sampled_from(EXECUTIONS),
            st.frozensets(st.sampled_from(["op1", "op2", "op3"])),
            st.frozensets(st.sampled_from(["ap1", "ap2"])),
            st.integers(0, 300),
        ),
        max_size=15,
    ),
)
def test_property_open_items_keep_table_equal_to_last_published(
    events: list[StatusEvent],
    updates: list[tuple[int, str, frozenset[str], frozenset[str], int]],
) -> None:
    """Interleave open-item updates anywhere: the table always equals the last published state,
    a state is published only on a change, and one state_id never names two different records."""
    table: dict[str, Slot] = {}
    last: dict[str, ExecutionState] = {}
    by_id: dict[str, ExecutionState] = {}
    inputs: list[object] = list(events)
    for pos, *update in sorted(updates, key=lambda u: u[0], reverse=True):
        inputs.insert(min(pos, len(inputs)), tuple(update))
    for item in inputs:
        if isinstance(item, StatusEvent):
            ex = item.execution_id
            step = apply_status(table.get(ex), item)
        else:
            ex, ops, aps, at = item  # type: ignore[misc]
            before = table.get(ex)
            step = set_open_items(before, ops, aps, ms(T0 + timedelta(seconds=at)))
            changed = isinstance(before, InFlight) and (
                set(before.open_operation_ids) != ops or set(before.open_approval_ids) != aps
            )
            assert (step.published is not None) == changed
            if step.published is None:
                assert step.slot is before
        table[ex] = step.slot
        if step.published is not None:
            p = step.published
            last[ex] = p
            assert list(p.open_operation_ids) == sorted(p.open_operation_ids)
            assert by_id.setdefault(p.state_id, p) == p
        slot = table[ex]
        if isinstance(slot, InFlight):
            assert to_state(slot) == last[ex]
        elif isinstance(slot, Closed):
            assert last[ex].terminal
