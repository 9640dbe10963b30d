"""Flow control in event time (``streams/engine/flow.py``), without Kafka."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streams.engine.flow import hold_back

keys = st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 3))


def test_pauses_only_what_is_ahead_and_over_the_limit() -> None:
    held = {("a", 0): 11, ("b", 0): 11, ("c", 0): 10}
    ahead = {("a", 0): True, ("b", 0): False, ("c", 0): True}
    pause, resume = hold_back(held, [], lambda t, p: ahead[(t, p)], limit=10)
    assert pause == [("a", 0)] and resume == []


def test_resumes_at_half_or_when_no_longer_ahead() -> None:
    held = {("a", 0): 6, ("b", 0): 5, ("c", 0): 9}
    ahead = {("a", 0): True, ("b", 0): True, ("c", 0): False}
    pause, resume = hold_back(held, held.keys(), lambda t, p: ahead[(t, p)], limit=10)
    assert pause == [] and resume == [("b", 0), ("c", 0)]


@given(
    st.dictionaries(keys, st.integers(0, 100)),
    st.sets(keys),
    st.sets(keys),
    st.integers(1, 50),
)
def test_rules_hold_for_any_state(held, paused, ahead_set, limit) -> None:
    pause, resume = hold_back(held, paused, lambda t, p: (t, p) in ahead_set, limit)
    for key in pause:
        assert key not in paused and held[key] > limit and key in ahead_set
    for key in resume:
        assert key in paused
        assert held.get(key, 0) <= limit // 2 or key not in ahead_set
    # a paused key neither resumed nor re-paused is still over half the limit and ahead
    for key in paused - set(resume):
        assert held.get(key, 0) > limit // 2 and key in ahead_set
    # the input setting the watermark (never ahead) is never paused
    assert not any(key not in ahead_set for key in pause)
