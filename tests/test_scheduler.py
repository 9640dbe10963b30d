"""The event-time scheduler alone (``streams/engine/scheduler.py``), against small reference models:
what it releases for a watermark and in which order, what it stores as a partition's clock,
and where the worker's table writes go (``DirectTable.writing_to``)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple

import faust
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.contracts.envelope import Envelope
from streams.core.clock import PartitionClock
from streams.engine.scheduler import EPOCH, Due, DueTime, HeldEvent, Scheduler, Timers, epoch_ms
from vigil_worker.changelog import DirectTable

INPUTS = ("a", "b", "c")
T0 = datetime(2026, 3, 1, tzinfo=UTC)


def env(topic: str, offset: int, partition: int = 0) -> Envelope:
    return Envelope(topic, partition, offset, None, None, None, None, None)


def scheduler(store: dict[str, Any] | None = None, due: list[DueTime] | None = None) -> Scheduler:
    return Scheduler(
        INPUTS, {} if store is None else store, lambda p: Timers(list(due or []), set())
    )


events_st = st.lists(
    st.tuples(st.sampled_from(INPUTS), st.integers(0, 50)), max_size=30
)  # (topic, time in ms after T0), offsets in read order per topic
dues_st = st.lists(st.tuples(st.integers(0, 50), st.sampled_from("xyz")), max_size=15)


@settings(max_examples=200, deadline=None)
@given(events_st, dues_st, st.integers(0, 60))
def test_release_is_every_event_and_due_time_before_the_watermark_in_time_order(
    events: list[tuple[str, int]], dues: list[tuple[int, str]], mark: int
) -> None:
    s = scheduler(due=[DueTime(epoch_ms(T0) + ms, key) for ms, key in dues])
    offsets: dict[str, int] = {}
    held: list[tuple[int, int, int, int]] = []
    for seq, (topic, ms) in enumerate(events, 1):
        offset = offsets[topic] = offsets.get(topic, -1) + 1
        s.hold(env(topic, offset), epoch_ms(T0) + ms, token=(topic, offset))
        held.append((ms, INPUTS.index(topic), offset, seq))
    watermark = T0 + timedelta(milliseconds=mark)

    got: list[tuple[Any, ...]] = []
    for item in s.release(0, epoch_ms(watermark)):
        if isinstance(item, Due):
            got.append(("due", item.at_ms - epoch_ms(T0), item.execution_ids))
        else:
            assert isinstance(item, HeldEvent)
            got.append(("event", item.time_ms - epoch_ms(T0), item.env.topic, item.env.offset))

    # the reference: everything strictly before the watermark; at equal times events first,
    # events by (time, input rank, offset, arrival), due times by time with their ids sorted
    expected: list[tuple[Any, ...]] = []
    released = sorted(h for h in held if h[0] < mark)
    due_at: dict[int, set[str]] = {}
    for ms, key in dues:
        if ms < mark:
            due_at.setdefault(ms, set()).add(key)
    for ms in sorted({h[0] for h in released} | set(due_at)):
        expected += [("event", h[0], INPUTS[h[1]], h[2]) for h in released if h[0] == ms]
        if ms in due_at:
            expected.append(("due", ms, tuple(sorted(due_at[ms]))))
    assert got == expected
    assert s.held() == sum(1 for h in held if h[0] >= mark)
    assert sum(s.held_by.values()) == s.held()


def test_what_is_scheduled_while_releasing_is_released_in_the_same_pass() -> None:
    s = scheduler()
    s.hold(env("a", 0), epoch_ms(T0) + 10, token="e")
    order: list[Any] = []
    for item in s.release(0, epoch_ms(T0) + 100):
        if isinstance(item, HeldEvent):
            order.append(item.token)
            s.schedule(0, epoch_ms(T0) + 5, "before")  # already past: next in line
            s.schedule(0, epoch_ms(T0) + 50, "later")
            s.schedule(0, epoch_ms(T0) + 100, "at the watermark")  # not strictly before
        else:
            order.append(item)
    assert order == [
        "e",
        Due(epoch_ms(T0) + 5, ("before",)),
        Due(epoch_ms(T0) + 50, ("later",)),
    ]


def test_executions_to_judge_first_come_before_everything_at_the_instant_before_the_watermark() -> (
    None
):
    s = Scheduler(INPUTS, {}, lambda p: Timers([DueTime(epoch_ms(T0), "due")], {"b", "a"}))
    mark = epoch_ms(T0) + 1000
    assert list(s.release(0, mark)) == [
        Due(mark - 1, ("a", "b")),
        Due(epoch_ms(T0), ("due",)),
    ]
    assert list(s.release(0, mark + 1000)) == []  # judged once


class Read(NamedTuple):
    topic: str
    ms: int
    held: bool


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(INPUTS), st.integers(0, 50), st.booleans()), max_size=25))
def test_the_stored_clock_covers_each_input_up_to_its_first_record_still_held(
    reads: list[tuple[str, int, bool]],
) -> None:
    """A held record and everything read after it on its topic partition come again after a
    restart: the stored clock must not have passed them."""
    store: dict[str, Any] = {}
    s = scheduler(store)
    offsets: dict[str, int] = {}
    for topic, ms, hold in reads:
        offset = offsets[topic] = offsets.get(topic, -1) + 1
        t = T0 + timedelta(milliseconds=ms)
        if hold:
            s.hold(env(topic, offset), epoch_ms(t), token=None)
        s.observe(env(topic, offset), epoch_ms(t))
    s.flush_clocks(0)
    expected = PartitionClock.start(INPUTS)
    for topic in INPUTS:
        mine = [Read(*r) for r in reads if r[0] == topic]
        first_held = next((i for i, r in enumerate(mine) if r.held), len(mine))
        acked = mine[:first_held]
        if acked:
            expected = expected.observe(
                topic, T0 + timedelta(milliseconds=max(r.ms for r in acked))
            )
    if expected.maxima:
        assert PartitionClock.model_validate_json(store["0"]) == expected
    else:
        assert store == {}


def test_acknowledged_offsets_are_stored_with_the_clock_and_read_back() -> None:
    store: dict[str, Any] = {}
    s = scheduler(store)
    for topic in INPUTS:
        s.observe(env(topic, 0), epoch_ms(T0))
    s.acknowledged("b", 0, 1)
    s.acknowledged("b", 0, 0)  # lower: ignored
    s.acknowledged("not an input", 0, 9)
    s.flush_clocks()
    restarted = scheduler(store)
    assert restarted.processed_through("b", 0) == 1
    assert restarted.processed_through("a", 0) is None
    assert restarted.watermark(0) == epoch_ms(T0)


def test_forget_drops_held_events_and_tokens() -> None:
    s = scheduler()
    s.hold(env("a", 0), 0, token="held")
    s.done("done")
    s.forget()
    assert s.held() == 0 and not s.held_by and s.drain_done() == []


def test_epoch_ms_is_exact() -> None:
    t = datetime(2026, 3, 1, 12, 0, 0, 999000, tzinfo=UTC)
    assert epoch_ms(t) == 1772366400999
    assert EPOCH + epoch_ms(t) * timedelta(milliseconds=1) == t


class Broker:
    """A producer that takes every changelog record and says where it went."""

    def __init__(self) -> None:
        self.log: list[tuple[int, bytes | None]] = []

    async def deliver(self, topic: str, records: list[tuple[int, Any, Any]]) -> dict[int, int]:
        last: dict[int, int] = {}
        for partition, key, _ in records:
            self.log.append((partition, key))
            last[partition] = len(self.log)
        return last


def test_a_table_written_for_a_partition_writes_there_without_a_faust_event(tmp_path: Path) -> None:
    app = faust.App(f"scheduler-{tmp_path.name}", store="memory://", datadir=str(tmp_path))
    table = DirectTable(
        app.Table(
            "executions",
            default=None,
            partitions=3,
            value_type=bytes,
            schema=faust.Schema(
                key_type=str, value_type=bytes, key_serializer="json", value_serializer="raw"
            ),
        )
    )
    with table.writing_to(2):
        table["x"] = b"1"
        with table.writing_to(1):
            table["y"] = b"2"
        del table["x"]
    broker = Broker()
    assert asyncio.run(table.send(broker)) == 3
    assert [p for p, _ in broker.log] == [2, 1, 2]
    assert table.get("y") == b"2" and "x" not in table
    try:
        table["z"] = b"3"
    except RuntimeError as exc:  # outside: only Faust's current event could say where
        assert "outside of a record's partition" in str(exc)
    else:
        raise AssertionError("a write with no partition went somewhere")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(INPUTS), st.integers(0, 50)), max_size=30))
def test_the_watermark_kept_in_place_is_the_clocks_and_is_announced_when_it_rises(
    reads: list[tuple[str, int]],
) -> None:
    """The scheduler keeps each partition's maxima in epoch ms and updates its watermark in
    place; the reference is the immutable ``PartitionClock`` over the same reads."""
    s = scheduler()
    clock = PartitionClock.start(INPUTS)
    for offset, (topic, ms) in enumerate(reads):
        before = clock.watermark
        clock = clock.observe(topic, T0 + timedelta(milliseconds=ms))
        moved = s.observe(env(topic, offset), epoch_ms(T0) + ms)
        after = clock.watermark
        expected = epoch_ms(after) if after is not None else None
        assert s.watermark(0) == expected
        assert moved == (expected if after is not None and after != before else None)
    assert s.clocks.get(0, PartitionClock.start(INPUTS)).maxima == clock.maxima
