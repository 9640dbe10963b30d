"""``vigil topics rekey``'s plan: an operation-state topic keyed by operation id carried over
to scoped keys (streams/kafka/rekey.py), checked on logs as a compacted topic holds them."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from streams.contracts.keys import scoped_key
from streams.kafka.partitioning import partition_of
from streams.kafka.rekey import Copy, Read, Tombstone, plan

N = 3


def old(execution_id: str, operation_id: str, value: bytes, ts: int = 0) -> Read:
    """A state as the worker wrote it before ids were scoped: keyed by the operation id."""
    return Read(
        partition_of(operation_id, N), operation_id, value, ts, (execution_id, operation_id)
    )


def new(execution_id: str, operation_id: str, value: bytes, ts: int = 0) -> Read:
    key = scoped_key(execution_id, operation_id)
    return Read(partition_of(key, N), key, value, ts, (execution_id, operation_id))


def applied(log: list[Read]) -> list[Read]:
    """The log after the plan is written: copies (keyed, decoded like any state), then
    tombstones."""
    todo = plan(log)
    ids = {r.value: r.ids for r in log if r.value is not None}
    out = list(log)
    for c in todo.copies:
        out.append(Read(partition_of(c.key, N), c.key, c.value, c.timestamp_ms, ids[c.value]))
    for t in todo.tombstones:
        out.append(Read(t.partition, t.key, None, 0, None))
    return out


def compacted(log: list[Read]) -> dict[str, bytes]:
    """Key -> last value, as compaction leaves a topic (tombstones deleted)."""
    last: dict[str, bytes | None] = {}
    for r in log:
        assert r.key is not None
        last[r.key] = r.value
    return {k: v for k, v in last.items() if v is not None}


def test_two_executions_that_shared_an_old_key_are_both_carried_over() -> None:
    log = [old("exec-a", "charge-1", b"a1", 1), old("exec-b", "charge-1", b"b1", 2)]
    todo = plan(log)
    assert todo.copies == [
        Copy("exec-a/charge-1", b"a1", 1),
        Copy("exec-b/charge-1", b"b1", 2),
    ]
    assert todo.tombstones == [Tombstone("charge-1", partition_of("charge-1", N))]
    assert compacted(applied(log)) == {"exec-a/charge-1": b"a1", "exec-b/charge-1": b"b1"}


def test_a_state_a_new_worker_wrote_is_never_overwritten() -> None:
    log = [old("exec-a", "charge-1", b"a1"), new("exec-a", "charge-1", b"a2")]
    todo = plan(log)
    assert todo.copies == [] and todo.tombstones == [Tombstone("charge-1", log[0].partition)]
    assert compacted(applied(log)) == {"exec-a/charge-1": b"a2"}


def test_running_it_again_finds_nothing_to_do() -> None:
    log = applied([old("exec-a", "charge-1", b"a1"), old("exec-b", "charge-1", b"b1")])
    again = plan(log)
    assert (again.copies, again.tombstones) == ([], [])
    assert again.summary()["already_scoped"] == 2


def test_an_operation_id_that_looks_like_a_scoped_key_is_told_apart_by_its_value() -> None:
    # Execution x's operation "exec-b/charge-1" was keyed "exec-b/charge-1": the very key
    # execution exec-b's operation charge-1 has now.
    log = [old("x", "exec-b/charge-1", b"x1"), old("exec-b", "charge-1", b"b1")]
    assert compacted(applied(log)) == {
        scoped_key("x", "exec-b/charge-1"): b"x1",
        "exec-b/charge-1": b"b1",
    }


def test_unreadable_records_are_counted_and_left() -> None:
    log = [Read(0, "charge-1", b"\x00garbage", 0, None), old("exec-a", "op", b"a1")]
    todo = plan(log)
    assert todo.unreadable == 1
    assert "charge-1" in compacted(applied(log))


names = st.sampled_from(["a", "b", "a/b", "b/a", "a%2Fb", "x y"])


@settings(max_examples=300)
@given(st.lists(st.tuples(st.booleans(), names, names), max_size=12))
def test_afterwards_every_operation_has_its_last_state_under_its_scoped_key_and_only_there(
    steps: list[tuple[bool, str, str]],
) -> None:
    """Any log a topic could hold (old-key states written before the upgrade, scoped ones
    after): once the plan is written, compaction leaves each operation's newest state under
    its scoped key, nothing under an old key, and a second run has nothing to do."""
    # the old worker wrote first, the new one after: the log's old records come first
    steps = sorted(steps, key=lambda s: s[0])
    log = []
    for i, (is_new, execution_id, operation_id) in enumerate(steps):
        value = f"{i}".encode()
        log.append((new if is_new else old)(execution_id, operation_id, value, i))

    # Expected: per operation, its newest scoped state if a new worker wrote one; else its
    # last state under an old key, if that key still holds an old state (a new worker's
    # state under the same text replaced it, as compaction would have).
    def is_scoped(r: Read) -> bool:
        return r.key == scoped_key(*r.ids)  # type: ignore[misc]

    last_at_key = {r.key: r for r in log}
    want: dict[str, bytes] = {}
    for r in log:
        key = scoped_key(*r.ids)  # type: ignore[misc]
        replaced = any(is_scoped(x) and x.key == key for x in log)
        still_there = not is_scoped(last_at_key[r.key])
        if is_scoped(r) or (not replaced and still_there):
            want[key] = r.value  # type: ignore[assignment]
    after = applied(log)
    assert compacted(after) == want
    again = plan(after)
    assert (again.copies, again.tombstones) == ([], [])
