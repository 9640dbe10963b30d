"""The offset guard's floor follows the committed offsets the broker confirms.

Entries forget the positions of inputs below a confirmed committed offset
(``ExecutionStore.mark_applied``); an input handed over again below it would no longer be
recognised as applied and would be judged a second time. With two workers killed again and
again under a backlog, a worker was handed a partition a second time, within one generation,
from below an offset it had committed: inputs came out as DUPLICATE and AFTER_TERMINAL
anomalies. No Kafka: the guard and the store are the live worker's own.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from streams.engine.state import ExecutionStore
from streams.kafka.offsets import AckOrder, Check, OffsetGuard

TP = ("t", 0)


def test_a_record_below_a_confirmed_commit_is_skipped_even_after_the_guard_started() -> None:
    g = OffsetGuard()
    g.start(TP, 10)
    assert [g.check(TP, o, retry=False) for o in range(10, 20)] == [Check.NEXT] * 10
    g.confirm(TP, 15)  # the broker took a commit of 15
    assert g.check(TP, 12, retry=False) is Check.COMMITTED  # a second pass from below it
    assert g.check(TP, 15, retry=False) is Check.AGAIN  # entries still keep 15 and above
    assert g.check(TP, 20, retry=False) is Check.NEXT
    assert g.committed(TP) == 15 and g.below_committed == 1


def test_a_confirmed_commit_never_goes_back_and_outlives_a_rebalance() -> None:
    g = OffsetGuard()
    g.confirm(TP, 30)
    g.confirm(TP, 20)  # an older read or commit: lower, ignored
    g.confirm(TP, -1001)  # Kafka's "no committed offset"
    assert g.committed(TP) == 30
    g.start(TP, 25)  # a committed offset read from a broker behind what was confirmed
    assert g.check(TP, 29, retry=False) is Check.COMMITTED
    assert g.check(TP, 30, retry=False) is Check.NEXT
    g.reset()
    g.start(TP, 10)
    assert g.committed(TP) == 30 and g.check(TP, 29, retry=False) is Check.COMMITTED


def test_a_commit_past_the_next_expected_offset_moves_it_there() -> None:
    """Everything below a confirmed commit is done: the guard does not seek back for it."""
    g = OffsetGuard()
    g.start(TP, 10)
    g.confirm(TP, 40)
    assert g.expected[TP] == 40
    assert g.check(TP, 40, retry=False) is Check.NEXT and g.seeks == 0


# One partition of ``RECORDS`` inputs, each for one of a few executions. Hypothesis drives the
# consumer: hand over the next few records, go back to any earlier offset (a second pass, a
# stale position), or acknowledge what is done and have the broker confirm the commit.
RECORDS = 60
steps = st.lists(
    st.one_of(
        st.tuples(st.just("read"), st.integers(1, 8)),
        st.tuples(st.just("rewind"), st.integers(0, RECORDS - 1)),
        st.tuples(st.just("commit"), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(steps, st.integers(0, 20))
def test_no_input_is_applied_twice_wherever_the_consumer_goes_back_to(
    plan: list[tuple[str, int]], start: int
) -> None:
    """The worker's rule end to end: an input is applied once, whatever order Kafka hands the
    records over in, given what the pipeline does with each step: the guard decides, the
    entry says whether the input is applied (and forgets positions below the confirmed commit
    as of the batch), acknowledgements go out in offset order, and the broker confirms the
    commit of what was acknowledged."""
    store = ExecutionStore({})
    guard = OffsetGuard()
    acks = AckOrder()
    applied: dict[int, int] = {}
    acked = start  # the group's committed offset
    guard.confirm(TP, acked)
    guard.start(TP, acked)
    position = start  # where the consumer reads next
    for kind, n in plan:
        if kind == "rewind":
            position = min(n, position)
            continue
        if kind == "commit":
            for token in acks.release():
                acked = max(acked, token[0] + 1)
            guard.confirm(TP, acked)
            continue
        committed_now = guard.committed(TP)  # as of the start of the batch
        for offset in range(position, min(position + n, RECORDS)):
            position = offset + 1
            check = guard.check(TP, offset, retry=True)
            token = (offset,)  # one per record handed over, as Faust's messages
            if check is Check.COMMITTED:
                acks.admit(TP, offset, token)
                acks.finish(token)
                continue
            if check is Check.SEEK:
                position = guard.expected[TP]
                break
            assert check in (Check.NEXT, Check.AGAIN)
            acks.admit(TP, offset, token)
            execution = f"e{offset % 3}"
            where = (0, 0, offset)
            if not store.applied(execution, where):
                applied[offset] = applied.get(offset, 0) + 1
                store.mark_applied(execution, where, lambda r, p, c=committed_now: c)
            acks.finish(token)
    assert all(times == 1 for times in applied.values()), applied
    assert all(o not in applied for o in range(start)), "applied below the committed offset"
