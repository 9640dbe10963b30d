"""Stream time per partition: the watermark is the minimum over input topics of their maxima."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from streams.core.clock import PartitionClock

T0 = datetime(2026, 7, 26, 16, 0, tzinfo=UTC)
TOPICS = ("executions", "operations", "approvals")


def t(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_no_watermark_until_every_input_topic_is_seen() -> None:
    clock = PartitionClock.start(TOPICS)
    assert clock.watermark is None and clock.stream_time is None
    clock = clock.observe("executions", t(10)).observe("operations", t(20))
    assert clock.watermark is None
    assert clock.stream_time == t(20)
    assert not clock.has_passed(t(0)) and not clock.is_late(t(0))
    clock = clock.observe("approvals", t(5))
    assert clock.watermark == t(5)


def test_watermark_is_the_slowest_topic_and_follows_it() -> None:
    clock = PartitionClock.start(TOPICS)
    for topic, s in [("executions", 30), ("operations", 10), ("approvals", 20)]:
        clock = clock.observe(topic, t(s))
    assert clock.watermark == t(10)
    clock = clock.observe("operations", t(40))
    assert clock.watermark == t(20)
    assert clock.stream_time == t(40)
    assert clock.max_for("operations") == t(40)


def test_never_goes_backwards() -> None:
    clock = PartitionClock.start(["a"]).observe("a", t(10))
    assert clock.observe("a", t(5)) is clock
    assert clock.observe("a", t(10)) is clock
    assert clock.watermark == t(10)


def test_ticks_alone_advance_a_quiet_partition() -> None:
    """A tick is just a record with a time on each input topic: no event needed."""
    clock = PartitionClock.start(TOPICS)
    for second in range(1, 4):
        for topic in TOPICS:
            clock = clock.observe(topic, t(second))
    assert clock.watermark == t(3)
    assert clock.has_passed(t(2)) and not clock.has_passed(t(3))


def test_has_passed_is_strict_and_is_late_is_below_the_watermark() -> None:
    clock = PartitionClock.start(["a", "b"]).observe("a", t(10)).observe("b", t(10))
    assert clock.has_passed(t(9.999))
    assert not clock.has_passed(t(10))  # evidence stamped exactly 10 may still be on its way
    assert clock.is_late(t(9.999))
    assert not clock.is_late(t(10))
    assert not clock.is_late(t(11))


def test_unknown_topic_and_naive_time_are_wiring_errors() -> None:
    clock = PartitionClock.start(["a"])
    with pytest.raises(ValueError):
        clock.observe("b", t(1))
    with pytest.raises(ValueError):
        clock.observe("a", datetime(2026, 1, 1))
    with pytest.raises(ValidationError):
        PartitionClock.start([])
    with pytest.raises(ValidationError):
        PartitionClock(inputs=("a",), maxima=(("b", t(1)),))


def test_inputs_are_a_set_and_the_clock_round_trips_through_json() -> None:
    a = PartitionClock.start(["b", "a", "b"]).observe("b", t(3)).observe("a", t(1))
    b = PartitionClock.start(["a", "b"]).observe("a", t(1)).observe("b", t(3))
    assert a == b and a.inputs == ("a", "b")
    assert PartitionClock.model_validate_json(a.model_dump_json()) == a


# --- properties ---------------------------------------------------------------------------------

observations = st.lists(st.tuples(st.sampled_from(TOPICS), st.integers(0, 1000)), max_size=60)


@settings(max_examples=300, deadline=None)
@given(observations)
def test_property_watermark_is_min_of_maxima_monotone_and_none_until_all_seen(
    seen: list[tuple[str, int]],
) -> None:
    clock = PartitionClock.start(TOPICS)
    maxima: dict[str, int] = {}
    previous = None
    for topic, s in seen:
        clock = clock.observe(topic, t(s))
        maxima[topic] = max(maxima.get(topic, s), s)
        expected = t(min(maxima.values())) if len(maxima) == len(TOPICS) else None
        assert clock.watermark == expected
        assert clock.stream_time == t(max(maxima.values()))
        if previous is not None:
            assert clock.watermark is not None and clock.watermark >= previous
        previous = clock.watermark
        for name in TOPICS:
            got = clock.max_for(name)
            assert got == (t(maxima[name]) if name in maxima else None)


@settings(max_examples=200, deadline=None)
@given(observations, st.randoms(use_true_random=False))
def test_property_final_clock_does_not_depend_on_arrival_order(
    seen: list[tuple[str, int]], rnd: object
) -> None:
    shuffled = list(seen)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    a, b = PartitionClock.start(TOPICS), PartitionClock.start(TOPICS)
    for topic, s in seen:
        a = a.observe(topic, t(s))
    for topic, s in shuffled:
        b = b.observe(topic, t(s))
    assert a == b


@st.composite
def in_order_topics(draw: st.DrawFn) -> tuple[dict[str, list[int]], list[str]]:
    """Per topic, records in time order (events and ticks alike); plus one arbitrary interleaving
    of the topics (a list of topic names to pop from)."""
    streams = {
        topic: sorted(draw(st.lists(st.integers(0, 100), min_size=1, max_size=12)))
        for topic in TOPICS
    }
    order = draw(st.permutations([topic for topic, times in streams.items() for _ in times]))
    return streams, order


@settings(max_examples=300, deadline=None)
@given(in_order_topics(), st.integers(0, 100))
def test_property_a_decision_at_d_sees_the_same_evidence_whatever_the_interleaving(
    drawn: tuple[dict[str, list[int]], list[str]], deadline: int
) -> None:
    """The claim in the module docstring, checked: when each topic is in time order, the first
    moment ``has_passed(d)`` holds, every record at or before ``d`` on every topic has been seen,
    so the decision is the same for any interleaving of the same topics (here: the drawn one and
    a round-robin one)."""
    streams, order = drawn

    def evidence_at_decision(interleaving: list[str]) -> tuple[tuple[str, int], ...] | None:
        queues = {topic: list(times) for topic, times in streams.items()}
        clock, seen = PartitionClock.start(TOPICS), []
        for topic in interleaving:
            s = queues[topic].pop(0)
            clock = clock.observe(topic, t(s))
            seen.append((topic, s))
            if clock.has_passed(t(deadline)):
                return tuple(sorted(x for x in seen if x[1] <= deadline))
        return None

    round_robin: list[str] = []
    counts = {topic: len(times) for topic, times in streams.items()}
    while any(counts.values()):
        for topic in TOPICS:
            if counts[topic]:
                round_robin.append(topic)
                counts[topic] -= 1

    everything = tuple(
        sorted((tp, s) for tp, times in streams.items() for s in times if s <= deadline)
    )
    a, b = evidence_at_decision(order), evidence_at_decision(round_robin)
    assert a == b
    assert a is None or a == everything
    # The decision is reached in both or in neither: it depends on the data, not the order.
    reachable = all(max(times) > deadline for times in streams.values())
    assert (a is not None) == reachable


@settings(max_examples=200, deadline=None)
@given(in_order_topics())
def test_property_in_order_topics_never_produce_a_late_record(
    drawn: tuple[dict[str, list[int]], list[str]],
) -> None:
    """Lateness comes from the data (a topic out of time order), never from the interleaving."""
    streams, order = drawn
    queues = {topic: list(times) for topic, times in streams.items()}
    clock = PartitionClock.start(TOPICS)
    for topic in order:
        s = queues[topic].pop(0)
        assert not clock.is_late(t(s))
        clock = clock.observe(topic, t(s))
