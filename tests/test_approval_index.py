"""The approval index without Kafka: what the processor publishes and stores, a table that
counts how often it is read, and the index's answers against a reading of every book."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from streams.contracts.models.events import ApprovalDecision, ApprovalRequested
from streams.contracts.models.outputs import ApprovalVerdict
from streams.core.approvals import ApprovalBook
from streams.engine.processor import Processor, Stores
from streams.engine.state import Entry
from streams.kafka.partitioning import partition_of
from streams.local.scenario import Tick, demo_scenario
from streams.read.approval_index import ApprovalIndex, request_ids, scan
from tests.test_processor import TOPICS, env, ticks

T0 = datetime(2026, 7, 26, 16, 0, tzinfo=UTC)
#: after the demo scenario's last tick: requests made then are not late
T1 = T0 + timedelta(hours=1)
N = 3  # partitions, as TOPICS


class CountingTable(dict[str, Any]):
    """A table that counts whole-table reads (iterations of any kind)."""

    def __init__(self, *a: Any) -> None:
        super().__init__(*a)
        self.iterations = 0

    def items(self) -> Any:
        self.iterations += 1
        return super().items()

    def values(self) -> Any:
        self.iterations += 1
        return super().values()

    def keys(self) -> Any:
        self.iterations += 1
        return super().keys()

    def __iter__(self) -> Iterator[str]:
        self.iterations += 1
        return super().__iter__()


def requested(ex: str, rid: str, minutes: float = 0) -> ApprovalRequested:
    return ApprovalRequested(
        event_id=f"{rid}-requested",
        execution_id=ex,
        request_id=rid,
        action="refund",
        action_digest="d1",
        occurred_at=T1 + timedelta(minutes=minutes),
    )


def run(steps: list[Any]) -> tuple[Stores, list[Any]]:
    """The processor over dict tables, as a worker runs it; returns the tables and the
    outputs it published."""
    stores = Stores()
    proc = Processor(TOPICS, stores)
    out: list[Any] = []
    for s in steps:
        if isinstance(s, Tick):
            out += ticks(proc, s.at)
        else:
            out += [e.record for e in proc.handle(env(s))]
    return stores, out


def every_request(table: dict[str, Any]) -> dict[str, str]:
    """Request id -> execution id by reading every book with the model (what the index
    spares a lookup)."""
    found: dict[str, str] = {}
    for key, raw in table.items():
        approvals = Entry.decode(raw).approvals
        if approvals:
            for rid in ApprovalBook.model_validate_json(approvals).requests:
                found[rid] = key
    return found


def many(n: int) -> list[Any]:
    steps: list[Any] = [requested(f"ex-{i}", f"req-{i}", i / 60) for i in range(n)]
    # a decision for a request that never comes: held in a book, not viewable
    steps.append(
        ApprovalDecision(
            event_id="early-decision",
            execution_id="ex-early",
            request_id="req-never",
            decision="ACCEPT",
            action_digest="d1",
            occurred_at=T1,
        )
    )
    return [*steps, Tick(T1 + timedelta(minutes=n / 60 + 1))]


def test_scan_finds_what_reading_every_book_finds() -> None:
    stores, _ = run([*demo_scenario(), *many(40)])
    table = stores.executions
    result = scan(table.items(), N, frozenset(range(N)))
    merged = {rid: ex for part in result.by_partition.values() for rid, ex in part.items()}
    assert merged == every_request(table)
    assert result.read == len(table) and result.unreadable == 0
    for p, part in result.by_partition.items():
        assert all(partition_of(ex, N) == p for ex in part.values())


def test_published_verdicts_name_every_viewable_request() -> None:
    """Every request stored with its request event gets a verdict when first judged: the
    outputs alone keep the index whole between rebuilds."""
    stores, out = run([*demo_scenario(), *many(40)])
    named = {r.request_id: r.execution_id for r in out if isinstance(r, ApprovalVerdict)}
    viewable = {}
    for key, raw in stores.executions.items():
        approvals = Entry.decode(raw).approvals
        if approvals:
            book = ApprovalBook.model_validate_json(approvals)
            viewable |= {rid: key for rid, f in book.requests.items() if f.request is not None}
    assert viewable and named.items() >= viewable.items()


@given(st.dictionaries(st.text(min_size=1, max_size=20), st.text(min_size=1), max_size=8))
@settings(max_examples=50)
def test_request_ids_are_the_keys_of_the_requests(requests: dict[str, str]) -> None:
    book = ApprovalBook(execution_id="ex").model_dump(mode="json")
    book["requests"] = {rid: {"request_id": rid} for rid in requests}
    import json

    assert request_ids(json.dumps(book)) == list(requests)


def test_lookups_never_read_the_table() -> None:
    stores, _ = run(many(200))
    table = CountingTable(stores.executions)

    async def main() -> None:
        index = ApprovalIndex(table, N)
        assert not index.complete()
        index.assign(range(N))
        assert await index.wait_complete(10)
        reads = table.iterations
        assert reads >= 1 and index.rows_read == len(table)
        for i in range(1_000):
            assert index.find(f"unknown-{i}") is None
        assert index.find("req-7") == "ex-7"
        assert table.iterations == reads  # a lookup, known or not, reads no row
        assert index.size() == 201  # 200 requests, and the decision held for req-never

    asyncio.run(main())


def test_outputs_noted_during_a_rebuild_are_kept() -> None:
    stores, _ = run(many(50))
    gate = threading.Event()

    def slow_rows(table: Any) -> list[tuple[str, Any]]:
        gate.wait(10)
        return list(table.items())

    async def main() -> None:
        index = ApprovalIndex(stores.executions, N, read_rows=slow_rows)
        index.assign(range(N))
        late = ApprovalVerdict.model_construct(request_id="req-late", execution_id="ex-late")
        index.note([late])  # published while the thread reads the table
        assert not index.complete()
        assert not await index.wait_complete(0.05)
        gate.set()
        assert await index.wait_complete(10)
        assert index.find("req-late") == "ex-late"
        assert index.find("req-3") == "ex-3"

    asyncio.run(main())


def test_a_rebalance_keeps_held_partitions_and_rebuilds_new_ones() -> None:
    stores, _ = run(many(60))

    async def main() -> None:
        index = ApprovalIndex(stores.executions, N)
        index.assign({0, 1})
        assert await index.wait_complete(10)
        in_2 = next(f"req-{i}" for i in range(60) if partition_of(f"ex-{i}", N) == 2)
        in_0 = next(f"req-{i}" for i in range(60) if partition_of(f"ex-{i}", N) == 0)
        assert index.find(in_2) is None and index.find(in_0) is not None
        first = index.rows_read
        index.revoke()
        assert not index.complete()  # not found is not known while the assignment is not
        index.assign({0, 2})
        assert await index.wait_complete(10)
        assert index.find(in_2) is not None and index.find(in_0) is not None
        read_again = index.rows_read - first
        assert read_again == sum(1 for k in stores.executions if partition_of(k, N) == 2)
        # the partition that left is dropped; an output of it is not taken
        index.note(
            [
                ApprovalVerdict.model_construct(request_id=rid, execution_id=ex)
                for rid, ex in [(f"req-x{i}", f"ex-x{i}") for i in range(30)]
            ]
        )
        assert all(
            (index.find(f"req-x{i}") is None) == (partition_of(f"ex-x{i}", N) == 1)
            for i in range(30)
        )

    asyncio.run(main())


def test_a_purged_request_is_forgotten() -> None:
    async def main() -> None:
        index = ApprovalIndex({}, N)
        index.assign(range(N))
        assert await index.wait_complete(10)
        index.note([ApprovalVerdict.model_construct(request_id="r", execution_id="ex")])
        assert index.find("r") == "ex"
        index.forget("r", "other")  # another execution's book says nothing of this entry
        assert index.find("r") == "ex"
        index.forget("r", "ex")
        assert index.find("r") is None

    asyncio.run(main())
