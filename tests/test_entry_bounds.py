"""Inputs that would make an entry too large to store, without Kafka.

An execution's table entry is one changelog record, and Kafka refuses a record larger than
its maximum message size for ever. Before, an input that grew an entry past it failed its
batch again and again, each attempt publishing outputs of a state that was never stored, and
its partition stalled. Now the input's text fields are bounded where it enters
(``streams.core.bounds``, a VALUE_TOO_LARGE anomaly), and an input that would take its
execution's entry past ``max_entry_bytes`` is undone and quarantined (a dead letter and a
CRITICAL alert) while everything else goes on. These tests hold the processor to that, and to
the property that makes it safe to run live: the live worker (write-behind, batches of any
size, input positions kept) sets aside exactly the inputs a replay sets aside.
"""

from __future__ import annotations

import random
import string
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streams.contracts.envelope import Envelope
from streams.contracts.models import events as ev
from streams.contracts.models.base import Record
from streams.contracts.models.enums import (
    AlertKind,
    AnomalyKind,
    ExecutionStatus,
    OperationEventKind,
    Severity,
)
from streams.contracts.models.outputs import Alert, Anomaly, DeadLetter, ExecutionState
from streams.core.bounds import MAX_ID_CHARS, MAX_TEXT_CHARS, TEXT_BOUNDS, out_of_domain
from streams.engine.processor import Processor, Stores
from streams.engine.state import Entry, EntryTooLarge, ExecutionStore
from tests.test_core_bounds import BASE
from tests.test_processor import T0, TOPICS, env

LIMIT = 8192
BIG = "ex-big"
OTHER = "ex-other"


def key(n: int, length: int = 400) -> str:
    """An idempotency key that compresses badly (random letters and digits)."""
    rng = random.Random(n)
    return "".join(rng.choices(string.ascii_letters + string.digits, k=length))


def sent(ex: str, n: int, t: float) -> ev.OperationEvent:
    return ev.OperationEvent(
        event_id=f"{ex}-op-{n}-sent",
        execution_id=ex,
        operation_id=f"op-{n}",
        attempt=1,
        idempotency_key=key(n),
        connector="sms",
        kind=OperationEventKind.SENT,
        occurred_at=T0 + timedelta(seconds=t),
    )


def running(
    ex: str, t: float, seq: int = 1, status: ExecutionStatus = ExecutionStatus.RUNNING
) -> ev.ExecutionStatusChanged:
    return ev.ExecutionStatusChanged(
        event_id=f"{ex}-s{seq}",
        execution_id=ex,
        sequence=seq,
        status=status,
        occurred_at=T0 + timedelta(seconds=t),
    )


def ticks_at(t: float) -> list[Envelope]:
    at = T0 + timedelta(seconds=t)
    return [
        env(
            ev.ClockTick(ticker_id="t", partition=p, occurred_at=at), spec.name, key="", partition=p
        )
        for spec in TOPICS.inputs()
        for p in range(3)
    ]


def build_log(operations: int = 30) -> list[Envelope]:
    """An execution that sends ``operations`` operations with 400-character keys, each adding
    about 600 bytes to its entry, well past ``LIMIT``; another execution interleaved; ticks
    past every reply deadline."""
    log: list[Envelope] = [*ticks_at(0), env(running(BIG, 1)), env(running(OTHER, 1))]
    for n in range(operations):
        log.append(env(sent(BIG, n, 2 + n * 0.1)))
        if n % 10 == 0:
            log.append(env(sent(OTHER, n, 2 + n * 0.1)))
    log.append(env(running(OTHER, 9, seq=2, status=ExecutionStatus.WAITING_FOR_TOOL)))
    log += ticks_at(10) + ticks_at(60)
    return log


LOG = build_log()


def replay(log: list[Envelope], limit: int = LIMIT) -> tuple[list[Record], Processor]:
    """Every record through a processor that stores after each one, as a replay does."""
    proc = Processor(TOPICS, Stores(), max_entry_bytes=limit)
    return [em.record for e in log for em in proc.handle(e)], proc


def ids(records: list[Record]) -> list[str]:
    return [r.model_dump_json() for r in records]


# -- the text bounds ---------------------------------------------------------------------------
TEXT_CASES = [(cls, name, bound) for cls, fields in TEXT_BOUNDS.items() for name, bound in fields]


@pytest.mark.parametrize(("cls", "name", "bound"), TEXT_CASES)
def test_every_text_field_is_bounded_and_the_anomaly_names_it(
    cls: type[Record], name: str, bound: int
) -> None:
    """At its bound a field is accepted; one character more is a VALUE_TOO_LARGE anomaly that
    names the record type, the field and its length."""
    at_bound = cls(**{**BASE[cls], name: "x" * bound})
    assert out_of_domain(at_bound) is None
    finding = out_of_domain(cls(**{**BASE[cls], name: "x" * (bound + 1)}))
    assert finding is not None
    assert finding.kind is AnomalyKind.VALUE_TOO_LARGE
    assert f"{cls.avro_name}.{name} has {bound + 1:,} characters" in finding.reason
    assert f"bound of {bound:,}" in finding.reason


def test_ids_and_free_text_have_their_own_bounds_and_traceparent_none() -> None:
    fields = dict(TEXT_BOUNDS[ev.OperationEvent])
    assert fields["idempotency_key"] == fields["operation_id"] == MAX_ID_CHARS
    assert fields["detail"] == MAX_TEXT_CHARS
    assert dict(TEXT_BOUNDS[ev.ExecutionStatusChanged])["reason"] == MAX_TEXT_CHARS
    assert all("traceparent" not in dict(f) for f in TEXT_BOUNDS.values())


def test_the_issues_idempotency_keys_are_anomalies_and_nothing_is_stored() -> None:
    """Issue 26's case: ten SENT operations with 149,336-character idempotency keys. Each is
    reported, naming the field and its length; the execution stays RUNNING with nothing
    open, and its entry stays small."""
    huge = [
        sent(BIG, n, 2 + n).model_copy(update={"idempotency_key": key(n, 149_336)})
        for n in range(10)
    ]
    log = [*ticks_at(0), env(running(BIG, 1)), *(env(e) for e in huge), *ticks_at(60)]
    out, proc = replay(log, limit=512 * 1024)
    anomalies = [r for r in out if isinstance(r, Anomaly)]
    assert [a.kind for a in anomalies] == [AnomalyKind.VALUE_TOO_LARGE] * 10
    assert all(
        "OperationEvent.idempotency_key has 149,336 characters" in a.reason for a in anomalies
    )
    assert [a.event_id for a in anomalies] == [e.event_id for e in huge]
    states = [r for r in out if isinstance(r, ExecutionState)]
    assert [(s.status, s.open_operation_ids) for s in states] == [(ExecutionStatus.RUNNING, ())]
    assert len(proc.stores.executions[BIG]) < 1000


# -- the entry bound ---------------------------------------------------------------------------
def test_an_input_that_would_make_the_entry_too_large_is_quarantined_and_the_rest_applied() -> None:
    out, _ = replay(LOG)
    letters = [r for r in out if isinstance(r, DeadLetter)]
    assert letters, "the stream must cross the bound"
    assert all(
        d.reason.startswith("quarantined: applied, it would make the entry") for d in letters
    )
    assert all("VIGIL_MAX_ENTRY_BYTES" in d.reason for d in letters)
    alerts = [r for r in out if isinstance(r, Alert) and r.verdict == "QUARANTINED"]
    assert [(a.kind, a.severity, a.subject_id) for a in alerts] == [
        (AlertKind.ANOMALY, Severity.CRITICAL, d.dead_letter_id) for d in letters
    ]
    # the quarantined inputs are the big execution's last operations, nothing of the other's
    quarantined = {d.source_offset for d in letters}
    by_offset = {e.offset: e.record for e in LOG}
    assert {by_offset[o].execution_id for o in quarantined} == {BIG}  # type: ignore[union-attr]
    # no input took the stored entry past the bound (the deadlines that fire after the last
    # input may: ``max_entry_bytes`` leaves them room below what a changelog record takes)
    _, before_deadlines = replay(LOG[: -len(ticks_at(60))])
    assert Entry.decode(before_deadlines.stores.executions[BIG]).content_size() <= LIMIT
    # and the stored entry holds what the published state says
    last = [r for r in out if isinstance(r, ExecutionState) and r.execution_id == BIG][-1]
    applied = {
        r.operation_id
        for e in LOG
        if e.offset not in quarantined
        and isinstance(r := e.record, ev.OperationEvent)
        and r.execution_id == BIG
    }
    assert set(last.open_operation_ids) == applied
    # the other execution went on: its later status is applied
    other = [r for r in out if isinstance(r, ExecutionState) and r.execution_id == OTHER]
    assert other[-1].last_sequence == 2


def test_a_quarantined_input_leaves_the_state_as_if_it_never_came() -> None:
    """The entry is put back as it was: a stream without the quarantined inputs gives the
    same tables and, but for the dead letters and their alerts (and the ends of those), the
    same outputs."""
    out, proc = replay(LOG)
    quarantined = {r.source_offset for r in out if isinstance(r, DeadLetter)}
    without, proc_without = replay([e for e in LOG if e.offset not in quarantined])
    assert proc.stores.executions == proc_without.stores.executions
    alerts = {r.alert_id for r in out if isinstance(r, Alert) and r.verdict == "QUARANTINED"}
    kept = [
        r
        for r in out
        if not isinstance(r, DeadLetter)
        and not (isinstance(r, Alert) and alerts & {r.alert_id, r.resolves_alert_id})
    ]
    assert ids(kept) == ids(without)


def live(log: list[Envelope], batches: list[int]) -> list[Record]:
    """The live worker's way: write-behind, input positions kept, the state flushed after
    each batch (sizes taken in turn from ``batches``), each partition's offsets committed up
    to its first input not yet done (``AckOrder``)."""
    committed: dict[tuple[str, int], int] = {}
    waiting: dict[tuple[str, int], list[int]] = {}
    done: set[tuple[str, int, int]] = set()
    proc = Processor(
        TOPICS,
        Stores(),
        max_entry_bytes=LIMIT,
        write_behind=True,
        committed=lambda topic, p: committed.get((topic, p)),
    )
    out: list[Record] = []
    i = n = 0
    while i < len(log):
        size = batches[n % len(batches)]
        n += 1
        for e in log[i : i + size]:
            waiting.setdefault((e.topic, e.partition), []).append(e.offset)
            out += [em.record for em in proc.handle(e, token=e)]
        for p in proc.state.dirty_partitions():
            proc.flush(p)
        proc.flush_clocks()
        done.update((d.topic, d.partition, d.offset) for d in proc.drain_done())
        for tp, offsets in waiting.items():
            while offsets and (*tp, offsets[0]) in done:
                committed[tp] = offsets.pop(0) + 1
        i += size
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=st.lists(st.integers(min_value=1, max_value=80), min_size=1, max_size=6))
def test_the_live_worker_sets_aside_what_a_replay_does_whatever_the_batches(
    batches: list[int],
) -> None:
    """The decision depends on the entry's content alone: batches of any size, with the
    positions the live worker keeps in its entries, give the replay's outputs."""
    expected, _ = replay(LOG)
    assert ids(live(LOG, batches)) == ids(expected)


def test_an_entry_too_large_for_its_table_is_refused_before_it_is_written() -> None:
    """The checkpoint's last line (``Checkpoint.prepare_state``): ``flush`` with a limit
    refuses an entry the changelog could not take, naming the last input it applied, and
    writes nothing of it."""
    table: dict[str, Any] = {}
    store = ExecutionStore(table)
    store.save(BIG, "operations", key(1, 5000))
    store.mark_applied(BIG, (1, 0, 41), lambda r, p: None)
    store.mark_applied(BIG, (1, 0, 42), lambda r, p: None)
    with pytest.raises(EntryTooLarge) as refused:
        store.flush(0, limit=100)
    assert refused.value.last == (1, 0, 42)
    assert refused.value.key == BIG and refused.value.size > 100
    assert table == {}
