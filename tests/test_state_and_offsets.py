"""The execution entry and its write-behind cache; the offset guard. No Kafka."""

from __future__ import annotations

import json
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.core import executions as ex
from streams.core import operations as ops
from streams.engine import compact
from streams.engine.state import (
    KEPT_BASE_BYTES,
    KEPT_BYTES_PER_CHAR,
    MAX_SEEN,
    Entry,
    ExecutionStore,
)
from streams.kafka.offsets import AckOrder, Check, OffsetGuard

# Fields hold JSON text: never the separator, and never starting with a control character
# (a packed entry's version byte is one, which is how old uncompressed text is told apart),
# nor with a quote: a field is a model's JSON object, and text starting with a quote is how
# an earlier version's JSON-string-wrapped entry is told apart (``Entry.decode``). Hypothesis
# once drew an in-flight field of just '"' in CI.
json_text = st.none() | st.text(
    alphabet=st.characters(blacklist_characters="\x1e", blacklist_categories=("Cs",)), min_size=1
).filter(lambda t: t[0] >= " " and t[0] != '"')
positions = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 99), st.integers(0, 10**12)), max_size=8
)


@given(json_text, json_text, json_text, json_text, positions)
def test_an_entry_survives_its_encoding(inflight, closed, ops, approvals, seen) -> None:
    e = Entry(inflight, closed, ops, approvals, seen)
    assert Entry.decode(e.encode()) == e
    assert Entry.decode(e.encode().encode()) == e  # as bytes, from a raw store


def test_writes_stay_in_the_cache_until_flushed_per_partition() -> None:
    table: dict[str, str] = {}
    store = ExecutionStore(table)
    store.partition = 1
    store.view("inflight")["a"] = '{"x":1}'
    store.partition = 2
    store.view("operations")["b"] = '{"y":2}'
    assert table == {} and store.pending() == 2
    assert store.view("inflight")["a"] == '{"x":1}'  # read through the cache
    assert store.dirty_partitions() == [1, 2]
    assert store.flush(1) == 1 and list(table) == ["a"]
    assert store.view("operations").get("b") == '{"y":2}'  # still cached, still dirty
    store.flush()
    assert Entry.decode(table["b"]).operations == '{"y":2}'
    del store.view("operations")["b"]
    store.flush()
    assert "b" not in table  # an entry with nothing left is deleted


def test_discard_forgets_what_was_not_flushed() -> None:
    table = {"a": Entry(inflight='{"v":1}').encode()}
    store = ExecutionStore(table)
    store.view("inflight")["a"] = '{"v":2}'
    store.discard()
    assert store.view("inflight")["a"] == '{"v":1}'
    assert store.pending() == 0


def test_a_flushed_entry_is_reused_decoded_only_while_the_table_holds_its_text() -> None:
    table: dict[str, str] = {}
    store = ExecutionStore(table)
    store.save("a", "inflight", {"v": 1}, lambda obj: f'{{"v":{obj["v"]}}}')
    store.flush()
    assert store.load("a", "inflight", lambda text: "parsed") == {"v": 1}  # kept decoded
    store.flush()
    table["a"] = Entry(inflight='{"v":2}').encode()  # written by someone else meanwhile
    assert store.load("a", "inflight", lambda text: text) == '{"v":2}'
    store.discard()
    assert store.load("a", "inflight", lambda text: "again") == "again"


@given(
    st.integers(0, 20_000),
    st.lists(st.tuples(st.integers(0, 40), st.integers(0, 400)), min_size=1, max_size=200),
)
def test_entries_kept_decoded_stay_within_their_budget_and_read_as_the_table(
    budget: int, writes: list[tuple[int, int]]
) -> None:
    """Whatever the budget and the writes, what is kept weighs at most the budget, the most
    recently written entries are the ones kept, and an entry read back equals the table's."""
    table: dict[str, bytes] = {}
    store = ExecutionStore(table, kept_bytes=budget)  # type: ignore[arg-type]
    order: list[str] = []
    for key, length in writes:
        k = f"ex-{key}"
        store.view("inflight")[k] = json.dumps({"v": "x" * length})
        store.flush()
        order = [x for x in order if x != k] + [k]
        weights = {
            x: KEPT_BASE_BYTES + KEPT_BYTES_PER_CHAR * len(Entry.decode(table[x]).encode())
            for x in order
        }
        assert store.kept_weight == sum(w for _, _, w in store._kept.values()) <= budget
        assert all(weights[x] <= budget for x in store._kept)
        # the kept ones are a suffix of the writes in order, less the ones too heavy alone
        newest = [x for x in order if weights[x] <= budget][-store.kept() :]
        assert list(store._kept) == (newest if store.kept() else [])
    for k in order:
        assert store.entry(k).encode() == Entry.decode(table[k]).encode()


def test_no_budget_keeps_nothing_and_a_rebalance_drops_what_is_kept() -> None:
    table: dict[str, bytes] = {}
    none = ExecutionStore(table, kept_bytes=0)  # type: ignore[arg-type]
    none.view("inflight")["a"] = '{"v":1}'
    none.flush()
    assert none.kept() == 0 and none.kept_weight == 0
    store = ExecutionStore(table)  # type: ignore[arg-type]
    store.view("inflight")["b"] = '{"v":2}'
    store.flush()
    assert store.kept() == 1 and store.kept_weight > 0
    store.discard()
    assert store.kept() == 0 and store.kept_weight == 0


def test_applied_positions_are_pruned_below_the_committed_offset_and_bounded() -> None:
    store = ExecutionStore({})
    committed = {0: 5}
    for offset in range(3, 9):
        store.mark_applied("a", (0, 0, offset), lambda r, p: committed.get(r))
    assert store.applied("a", (0, 0, 5)) and store.applied("a", (0, 0, 8))
    assert not store.applied("a", (0, 0, 4))  # Kafka never redelivers below 5
    for offset in range(100, 100 + 2 * MAX_SEEN):
        store.mark_applied("a", (1, 0, offset), lambda r, p: None)
    assert len(store.entry("a").seen) == MAX_SEEN


def test_the_guard_passes_the_next_offset_and_redeliveries() -> None:
    g = OffsetGuard()
    g.start(("t", 0), 10)
    assert g.check(("t", 0), 10, retry=False) is Check.NEXT
    assert g.check(("t", 0), 11, retry=False) is Check.NEXT
    assert g.check(("t", 0), 10, retry=False) is Check.AGAIN  # read again after a seek back
    assert g.expected[("t", 0)] == 12


def test_the_guard_skips_what_the_group_committed_before_it_started() -> None:
    """A stale fetch position (a seek decided before a rebalance and run after it) hands over
    records below the committed offset: applied and committed already, their positions maybe
    forgotten by their entries, they must not be processed again (they came out as DUPLICATE
    and AFTER_TERMINAL anomalies with two workers killed under a backlog)."""
    g = OffsetGuard()
    g.start(("t", 0), 10)
    assert g.check(("t", 0), 5, retry=False) is Check.COMMITTED
    assert g.check(("t", 0), 9, retry=False) is Check.COMMITTED
    assert g.check(("t", 0), 10, retry=False) is Check.NEXT
    assert g.below_committed == 2 and g.expected[("t", 0)] == 11
    g.reset()
    g.start(("t", 0), 4)  # after a rebalance the floor is the new committed offset
    assert g.check(("t", 0), 4, retry=False) is Check.NEXT


def test_the_guard_seeks_back_over_a_jump_and_waits_for_the_seek() -> None:
    g = OffsetGuard()
    g.start(("t", 0), 10)
    assert g.check(("t", 0), 40, retry=True) is Check.SEEK
    assert g.check(("t", 0), 41, retry=False) is Check.WAIT  # fetched before the seek
    assert g.check(("t", 0), 42, retry=True) is Check.SEEK  # the seek was lost: again
    assert g.check(("t", 0), 10, retry=False) is Check.NEXT  # the seek took
    assert g.check(("t", 0), 11, retry=False) is Check.NEXT
    assert g.seeks == 2 and g.skipped_records == 0


def test_a_hole_that_seeks_cannot_fill_is_accepted_and_counted() -> None:
    g = OffsetGuard(max_seeks=3)
    g.start(("t", 0), 10)
    results = [g.check(("t", 0), 13, retry=False) for _ in range(5)]
    assert results[:3] == [Check.SEEK] * 3 and results[3] is Check.HOLE
    assert g.skipped_records == 3 and g.expected[("t", 0)] == 14


def test_records_deleted_by_retention_are_given_up() -> None:
    g = OffsetGuard()
    g.start(("t", 0), 10)
    assert g.give_up(("t", 0), 50) and g.expected[("t", 0)] == 50
    assert g.skipped_records == 40
    assert not g.give_up(("t", 0), 50)


def test_acknowledgements_go_out_in_offset_order_per_partition() -> None:
    """A record held for the watermark (offset 36) holds back the acknowledgement of the
    ticks after it: Faust would otherwise commit past it (see ``AckOrder``)."""
    order = AckOrder()
    held, tick1, tick2, other = object(), object(), object(), object()
    order.admit(("t", 0), 36, held)
    order.admit(("t", 0), 37, tick1)
    order.admit(("t", 0), 38, tick2)
    order.admit(("t", 1), 5, other)
    for token in (tick1, tick2, other):
        order.finish(token)
    assert order.release() == [other]  # partition 1 is free; partition 0 waits for 36
    order.finish(held)
    assert order.release() == [held, tick1, tick2]
    assert order.waiting() == 0 and order.release() == []


def test_a_record_delivered_twice_is_acknowledged_twice_in_order() -> None:
    order = AckOrder()
    first, again = object(), object()
    order.admit(("t", 0), 7, first)
    order.admit(("t", 0), 7, again)  # redelivered after a seek back
    order.finish(again)
    assert order.release() == []  # the first delivery is still in progress
    order.finish(first)
    assert order.release() == [first, again]


@given(json_text, json_text, json_text, json_text, positions)
def test_a_packed_entry_reads_back_the_same(inflight, closed, ops, approvals, seen) -> None:
    e = Entry(inflight, closed, ops, approvals, seen)
    packed = e.pack()
    assert packed[0] == compact.V2
    assert Entry.decode(packed) == e
    assert Entry.decode(bytearray(packed)) == e
    # packed with the first dictionary, as entries written before V2 are: still read
    c = zlib.compressobj(6, zlib.DEFLATED, -12, 4, zlib.Z_DEFAULT_STRATEGY, compact.DICTIONARY_V1)
    assert Entry.decode(bytes([compact.V1]) + c.compress(e.encode().encode()) + c.flush()) == e


def test_entries_written_before_compression_are_read_as_they_are() -> None:
    e = Entry('{"kind":"in_flight"}', None, '{"operations":{}}', None, [(0, 1, 2)])
    assert Entry.decode(e.encode()) == e  # text, as a memory store kept it
    assert Entry.decode(e.encode().encode()) == e  # bytes, as a changelog recovery gives it
    # logged as a JSON string (the table's serializer then), recovered raw now
    assert Entry.decode(json.dumps(e.encode()).encode()) == e
    table = {"a": e.encode()}
    store = ExecutionStore(table)
    assert store.view("operations")["a"] == '{"operations":{}}'
    store.view("inflight")["a"] = '{"kind":"in_flight","v":2}'
    store.flush()
    assert compact.is_packed(table["a"])  # rewritten in the new form
    assert Entry.decode(table["a"]).inflight == '{"kind":"in_flight","v":2}'


def test_a_damaged_packed_entry_is_an_error_not_a_wrong_entry() -> None:
    packed = Entry('{"kind":"in_flight"}').pack()
    with pytest.raises(ValueError):
        Entry.decode(packed[:-3])
    with pytest.raises(ValueError):
        compact.unpack(bytes([compact.V1]) + b"\xff\xfe\xfd")
    with pytest.raises(ValueError):
        compact.unpack(b"\x07abc")  # a version this code never wrote


def test_a_typical_in_flight_entry_packs_smaller_than_in_format_1() -> None:
    # an in-flight execution waiting on an operation, as the memory benchmark keeps 100,000 of
    ex_id, op = "ex-m-0004711", "ex-m-0004711-op1"
    text = Entry(
        inflight=(
            f'{{"kind":"in_flight","execution_id":"{ex_id}","status":"WAITING_FOR_TOOL",'
            '"since":"2026-11-30T05:34:15.108000Z","first_seen_at":"2026-11-30T05:34:15.008000Z",'
            '"last_event_at":"2026-11-30T05:34:15.208000Z","last_sequence":2,'
            f'"last_event_id":"{ex_id}-s2","open_operation_ids":["{op}"],"open_approval_ids":[]}}'
        ),
        operations=(
            f'{{"execution_id":"{ex_id}","operations":{{"{op}":{{"operation_id":"{op}",'
            '"attempts":{"1":{"attempt":1,"connector":"mail",'
            f'"idempotency_key":"idem-{op}","status":"SENT",'
            '"since":"2026-11-30T05:34:15.208000Z","sent":true,'
            '"reply_due_at":"2026-11-30T06:34:15.208000Z","kinds":["SENT"],'
            f'"event_ids":["{op}-1-sent"]}}}}}}}},"by_idempotency_key":{{"idem-{op}":["{op}"]}}}}'
        ),
        seen=[(0, 3, 120455), (1, 3, 40111)],
    )
    # format 1 packed with the first dictionary (as written before format 2): a sixth
    c = zlib.compressobj(6, zlib.DEFLATED, -12, 4, zlib.Z_DEFAULT_STRATEGY, compact.DICTIONARY_V1)
    v1 = 1 + len(c.compress(text.encode().encode()) + c.flush())
    assert v1 * 6 <= len(text.encode())
    # the same execution as written now: format 2 packed with V2, smaller still
    now = Entry(
        inflight=ex.dump_slot(ex.load_slot(text.inflight)),  # type: ignore[arg-type]
        operations=ops.dump_book(ops.load_book(text.operations)),  # type: ignore[arg-type]
        seen=text.seen,
    )
    assert len(now.pack()) * 3 <= len(now.encode()) and len(now.pack()) < v1
