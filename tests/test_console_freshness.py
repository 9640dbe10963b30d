"""The console's "as of": when the view last held every record the topics held, on the wall
clock (``fresh_as_of``), not the newest record's event time."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streams.console.service import ConsumerStatus, EndsCheck, fresh_as_of

A, B = ("vigil.alerts", 0), ("vigil.alerts", 1)


def test_the_newest_read_of_the_ends_the_view_has_reached() -> None:
    checks = [
        EndsCheck(10.0, {A: 5, B: 0}),
        EndsCheck(12.0, {A: 7, B: 1}),
        EndsCheck(14.0, {A: 9, B: 1}),
    ]
    assert fresh_as_of(checks, {A: 9, B: 1}) == 14.0  # caught up: as of the last read
    assert fresh_as_of(checks, {A: 8, B: 1}) == 12.0  # behind: as of when it last was not
    assert fresh_as_of(checks, {A: 4}) is None  # behind every read kept: not known
    assert fresh_as_of([], {A: 9}) is None


def test_a_quiet_fleet_stays_fresh() -> None:
    """No new record for an hour: the view stays complete, so "as of" goes on with the
    wall clock (the newest record's time would stand still)."""
    status = ConsumerStatus(log_end={A: 3, B: 2})
    for minute in range(60):
        status.note_ends(1000.0 + 60 * minute)
    assert status.fresh_at({A: 3, B: 2}) == 1000.0 + 60 * 59


def test_ends_not_read_yet_are_no_check() -> None:
    status = ConsumerStatus(log_end={A: -1, B: 2})
    status.note_ends(5.0)
    assert status.fresh_at({A: 0, B: 2}) is None


@given(
    st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20)), min_size=1, max_size=12),
    st.integers(0, 20),
    st.integers(0, 20),
)
def test_fresh_as_of_is_a_read_the_positions_have_reached(
    ends: list[tuple[int, int]], a: int, b: int
) -> None:
    checks = [EndsCheck(float(i), {A: x, B: y}) for i, (x, y) in enumerate(ends)]
    got = fresh_as_of(checks, {A: a, B: b})
    reached = [c.at for c in checks if c.ends[A] <= a and c.ends[B] <= b]
    assert got == (max(reached) if reached else None)
