"""The recovery watch: which changelog partitions Faust's recovery has waited on too long."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from vigil_worker.recovery_watch import RecoveryWatch


def test_a_partition_standing_still_is_reported_after_the_wait_and_then_once_per_wait() -> None:
    watch = RecoveryWatch(stall_after=15.0)
    assert watch.stalled({"c0": 341}, 0.0) == []
    assert watch.stalled({"c0": 341}, 14.9) == []
    assert watch.stalled({"c0": 341}, 15.0) == ["c0"]
    assert watch.stalled({"c0": 341}, 20.0) == []  # its clock started again
    assert watch.stalled({"c0": 341}, 30.0) == ["c0"]


def test_progress_restarts_the_clock_and_a_finished_partition_is_forgotten() -> None:
    watch = RecoveryWatch(stall_after=10.0)
    watch.stalled({"c0": 50, "c1": 7}, 0.0)
    assert watch.stalled({"c0": 49, "c1": 7}, 9.0) == []
    assert watch.stalled({"c0": 49, "c1": 7}, 10.0) == ["c1"]
    assert watch.stalled({"c0": 49, "c1": 0}, 18.9) == []
    assert watch.stalled({"c0": 49, "c1": 0}, 19.0) == ["c0"]
    watch.stalled({"c0": 0}, 20.0)
    assert watch._seen == {}


def test_reset_forgets_what_was_waited_for() -> None:
    watch = RecoveryWatch(stall_after=5.0)
    watch.stalled({"c0": 3}, 0.0)
    watch.reset()
    assert watch.stalled({"c0": 3}, 6.0) == []  # a new recovery: its clock starts now
    assert watch.stalled({"c0": 3}, 11.0) == ["c0"]


@given(
    st.lists(
        st.tuples(
            st.floats(min_value=0.0, max_value=6.0),
            st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(0, 2), max_size=3),
        ),
        max_size=60,
    )
)
def test_a_report_means_records_left_and_the_same_count_for_the_whole_wait(
    rounds: list[tuple[float, dict[str, int]]],
) -> None:
    """Whatever the rounds: a reported partition has records left, every round of the last
    ``stall_after`` seconds and one at least that long ago saw the same count, and it is not
    reported again within ``stall_after``; a partition whose count stands still is reported
    within ``stall_after`` plus one round."""
    wait = 10.0
    watch = RecoveryWatch(stall_after=wait)
    now = 0.0
    history: list[tuple[float, dict[str, int]]] = []
    last_report: dict[str, float] = {}
    for step, remaining in rounds:
        now += step
        reported = watch.stalled(remaining, now)
        history.append((now, remaining))
        for tp in reported:
            left = remaining[tp]
            assert left > 0
            run = []  # the rounds since the count last differed, newest first
            for t, r in reversed(history):
                if r.get(tp, 0) != left:
                    break
                run.append(t)
            assert now - run[-1] >= wait
            assert now - last_report.get(tp, -wait) >= wait
            last_report[tp] = now
        for tp in "abc":
            run = []
            for t, r in reversed(history):
                if r.get(tp, 0) != remaining.get(tp, 0):
                    break
                run.append(t)
            since = max(run[-1], last_report.get(tp, run[-1]))
            if remaining.get(tp, 0) > 0 and now - since >= wait + 6.0:
                raise AssertionError(f"{tp} stood still from {since} to {now} unreported")
