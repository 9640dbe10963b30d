"""``format_duration`` writes what ``parse_duration`` reads: ``vigil config`` and ``vigil topics
list`` show durations in the form the settings take."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.durations import format_duration, parse_duration


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (timedelta(hours=24), "24h"),
        (timedelta(days=7), "7d"),
        (timedelta(days=1, hours=12), "36h"),
        (timedelta(minutes=90), "1h30m"),
        (timedelta(milliseconds=250), "250ms"),
        (timedelta(seconds=15), "15s"),
        (timedelta(0), "0s"),
    ],
)
def test_durations_are_written_in_the_units_they_are_read_in(value: timedelta, text: str) -> None:
    assert format_duration(value) == text


@given(st.integers(min_value=0, max_value=10**12))
def test_every_millisecond_duration_reads_back_as_itself(ms: int) -> None:
    value = timedelta(milliseconds=ms)
    assert parse_duration(format_duration(value)) == value


def test_a_negative_duration_is_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        format_duration(timedelta(seconds=-1))
