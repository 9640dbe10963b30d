"""Stale due times are passed over without decoding their execution.

Most due times the scheduler indexed are stale when stream time reaches them: an attempt
answered before its reply deadline leaves that deadline in the index. The aggregate says until
when advancing it has nothing to do (``Execution.quiet_until``), the store keeps that instant
per execution (``ExecutionStore.quiet``), and the processor advances an execution only when a
due time reaches it. The core's side is a property of every operation book; the shell's is
that it publishes exactly what it publishes advancing every due time, decoding less."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.contracts.models.enums import ExecutionStatus
from streams.contracts.models.enums import OperationEventKind as K
from streams.contracts.models.outputs import OperationState
from streams.core import executions as ex
from streams.core.execution import NOTHING_DUE, UNLOADED, Execution, Rules
from streams.engine import state as state_module
from streams.engine.processor import Processor, Stores
from tests.test_core_operations import _play, _steps
from tests.test_event_time_order import LOG, by_time, interleave
from tests.test_event_time_order import TOPICS as LOG_TOPICS
from tests.test_processor import T0, TOPICS, handle, sent, ticks

RULES = Rules(closed_retention=timedelta(minutes=10))


def _aggregate(book: Any, closed_at: int | None) -> Execution:
    closed = (
        None
        if closed_at is None
        else ex.Closed("exe-1", ExecutionStatus.COMPLETED, closed_at, 9, "last")
    )
    return Execution("exe-1", RULES, None, closed, book, None)


@settings(max_examples=300, deadline=None)
@given(_steps, st.none() | st.integers(-600_000, 1_200_000))
def test_advancing_before_the_quiet_instant_does_nothing_and_at_it_something(
    steps: list, closed_after: int | None
) -> None:
    """For every book the operations core makes (with or without a closed slot): the instant
    is the earliest of ``next_due``, advancing to the millisecond before it changes nothing
    and publishes nothing, and advancing to it does something."""
    for _, step, _ in _play(steps):
        book = step.book
        if book is None:
            continue
        closed_at = None if closed_after is None else int(T0.timestamp() * 1000) + closed_after
        until = _aggregate(book, closed_at).quiet_until()
        assert until == min(_aggregate(book, closed_at).next_due(), default=NOTHING_DUE)
        if until == NOTHING_DUE:
            continue
        before = _aggregate(book, closed_at)
        quiet = before.advance(until - 1)
        assert quiet.outputs == [] and quiet.due == [] and not before.changed
        at = _aggregate(book, closed_at)
        moved = at.advance(until)
        assert moved.outputs or at.changed


def test_the_instant_is_not_told_when_a_book_is_not_in_hand() -> None:
    """Not decoded yet, or an approval book (its change points depend on thresholds and on
    facts judged late): the shell then advances the execution at every due time."""
    assert Execution("e", RULES, None, None, UNLOADED, None).quiet_until() is None
    assert Execution("e", RULES, None, None, None, UNLOADED).quiet_until() is None
    assert Execution("e", RULES, None, None, None, None).quiet_until() == NOTHING_DUE


class Spy:
    """Counts the processor's advances and the entries decoded from the table."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.counts: Counter[str] = Counter()
        advance, decode = Processor._advance_key, state_module.Entry.decode

        def counted_advance(proc: Processor, *args: Any) -> None:
            self.counts["advanced"] += 1
            advance(proc, *args)

        def counted_decode(raw: Any) -> state_module.Entry:
            self.counts["decoded"] += 1
            return decode(raw)

        monkeypatch.setattr(Processor, "_advance_key", counted_advance)
        monkeypatch.setattr(state_module.Entry, "decode", staticmethod(counted_decode))


def test_an_answered_deadline_is_passed_over_and_an_unanswered_one_fires(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spy = Spy(monkeypatch)
    proc = Processor(TOPICS, Stores(), write_behind=True, state_cache_bytes=0)
    due = T0 + timedelta(seconds=30)
    handle(proc, sent("op-1", reply_due_at=due))
    handle(proc, sent("op-2", ex="ex-2", reply_due_at=due))
    answered = handle(proc, sent("op-1", minutes=0.1, kind=K.VERIFIED, evidence_source="CONNECTOR"))
    assert [r.status for r in answered if isinstance(r, OperationState)] == ["VERIFIED"]
    proc.flush()  # the entries written to the table, none kept decoded
    spy.counts.clear()
    fired = [r for r in ticks(proc, due + timedelta(seconds=1)) if isinstance(r, OperationState)]
    assert [(r.execution_id, r.status) for r in fired] == [("ex-2", "UNKNOWN")]
    # ex-1's reply deadline was stale: neither advanced nor decoded; ex-2 was both
    assert spy.counts == {"advanced": 1, "decoded": 1}


def test_a_change_the_processor_did_not_judge_forgets_the_instant() -> None:
    """Any write to an entry forgets its instant (here a table view's, as a tool or a test
    may write): the next due time then advances the execution, as without the index."""
    proc = Processor(TOPICS, Stores())
    handle(proc, sent("op-1", reply_due_at=T0 + timedelta(seconds=30)))
    assert proc.state.quiet["ex-1"] == int((T0 + timedelta(seconds=30)).timestamp() * 1000)
    proc.inflight["ex-1"] = proc.inflight.get("ex-1") or "[]"
    assert "ex-1" not in proc.state.quiet
    proc.forget_partitions()
    assert proc.state.quiet == {}


class Forgetful(dict):
    """A store's ``quiet`` that never keeps an instant: every due time advances."""

    def __setitem__(self, key: str, value: int) -> None:
        pass


def _published(order: list, quiet: bool) -> tuple[list[tuple[str, str]], int]:
    calls: Counter[str] = Counter()
    proc = Processor(LOG_TOPICS, Stores(), write_behind=True)
    if not quiet:
        proc.state.quiet = Forgetful()
    advance = proc._advance_key

    def counted(*args: Any) -> None:
        calls["advanced"] += 1
        advance(*args)

    proc._advance_key = counted  # type: ignore[method-assign]
    out = []
    for n, e in enumerate(order, 1):
        out += [(em.topic, em.record.model_dump_json()) for em in proc.handle(e)]
        if n % 97 == 0:
            proc.flush()
            proc.flush_clocks()
    return out, calls["advanced"]


def test_the_reference_log_publishes_the_same_records_advancing_less() -> None:
    with_index, advanced = _published(by_time(), quiet=True)
    every_due_time, advanced_all = _published(by_time(), quiet=False)
    assert with_index == every_due_time
    assert sum(len(records) for records in LOG.values()) > 1000
    assert advanced < advanced_all


@settings(max_examples=20, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 7), st.integers(1, 400)), max_size=40))
def test_any_interleaving_publishes_the_same_records_as_advancing_every_due_time(
    choices: list[tuple[int, int]],
) -> None:
    order = interleave(choices)
    assert _published(order, quiet=True)[0] == _published(order, quiet=False)[0]


def test_after_a_restart_the_rebuilt_index_passes_over_stale_due_times(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The due-time index rebuilt from the table after a restart tells each execution's
    quiet instant too: an answered deadline is not advanced, an unanswered one fires."""
    stores = Stores()
    first = Processor(TOPICS, stores, state_cache_bytes=0)
    due = T0 + timedelta(seconds=30)
    handle(first, sent("op-1", reply_due_at=due))
    handle(first, sent("op-2", ex="ex-2", reply_due_at=due))
    handle(first, sent("op-1", minutes=0.1, kind=K.VERIFIED, evidence_source="CONNECTOR"))
    spy = Spy(monkeypatch)
    restarted = Processor(TOPICS, stores, state_cache_bytes=0)
    fired = [
        r for r in ticks(restarted, due + timedelta(seconds=1)) if isinstance(r, OperationState)
    ]
    assert [(r.execution_id, r.status) for r in fired] == [("ex-2", "UNKNOWN")]
    assert spy.counts["advanced"] == 1


def test_rebuilding_a_partitions_index_decodes_only_that_partitions_entries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stores = Stores()
    first = Processor(TOPICS, stores, state_cache_bytes=0)
    for i in range(30):
        handle(first, sent(f"op-{i}", ex=f"ex-{i}", reply_due_at=T0 + timedelta(seconds=30)))
    owners = Counter(first.partition_of(key) for key in stores.executions)
    assert len(owners) == 3 and sum(owners.values()) == 30
    spy = Spy(monkeypatch)
    restarted = Processor(TOPICS, stores, state_cache_bytes=0)
    for partition, count in sorted(owners.items()):
        spy.counts.clear()
        timers = restarted._timers(partition)
        assert spy.counts["decoded"] == count
        assert {d.execution_id for d in timers.due} == {
            key for key in stores.executions if first.partition_of(key) == partition
        }
