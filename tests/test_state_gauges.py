"""The open-work gauges: counted from the stored entries in a worker thread, and a scrape that
reads no table at all."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

from streams.engine.processor import Processor, Stores
from streams.local.scenario import Tick, demo_scenario
from streams.read.metrics import Metrics
from streams.read.state_gauges import StateGauges, count_state
from tests.test_processor import TOPICS, env, ticks


def played() -> Processor:
    proc = Processor(TOPICS, Stores())
    for s in demo_scenario():
        if isinstance(s, Tick):
            ticks(proc, s.at)
        else:
            proc.handle(env(s))
    return proc


def test_the_counts_are_those_of_the_stored_books() -> None:
    proc = played()
    counts = count_state(proc.stores.executions.values())
    assert counts.entries == len(proc.stores.executions)
    assert counts.in_flight == len(proc.inflight) > 0
    # the demo leaves the refund's two attempts UNKNOWN with a work item each, and the SMS
    # settled; the audit's requests stay open with their verdicts
    assert counts.operations_unknown == 2 and counts.work_items_open >= 2
    verdicts = dict(counts.approvals_open)
    assert verdicts.get("STUCK_AFTER_DECISION") == 1 and verdicts.get("ORPHANED_WAIT") == 1


class CountingTable(dict[str, Any]):
    """A table that counts how often it is read as a whole, and from which thread."""

    def __init__(self, *a: Any) -> None:
        super().__init__(*a)
        self.whole_reads: list[str] = []

    def values(self) -> Any:
        self.whole_reads.append(threading.current_thread().name)
        return super().values()

    def items(self) -> Any:
        self.whole_reads.append(threading.current_thread().name)
        return super().items()

    def __iter__(self) -> Iterator[str]:
        self.whole_reads.append(threading.current_thread().name)
        return super().__iter__()


def test_a_scrape_reads_no_table_and_a_refresh_decodes_off_the_loop() -> None:
    proc = played()
    table = CountingTable(proc.stores.executions)
    proc.stores.executions = table
    proc.state.table = table
    metrics = Metrics(proc, dict)
    before = metrics.render().decode()
    assert table.whole_reads == []  # a scrape only reads the last counts
    assert "vigil_state_gauges_age_seconds -1.0" in before
    assert "vigil_executions_in_flight 0.0" in before

    decoded_in: list[str] = []
    import streams.read.state_gauges as sg

    original = sg.Entry.decode

    def spy(raw: Any) -> Any:
        decoded_in.append(threading.current_thread().name)
        return original(raw)

    sg.Entry.decode = spy  # type: ignore[method-assign]
    try:
        counts = asyncio.run(metrics.gauges.refresh(table))
    finally:
        sg.Entry.decode = original  # type: ignore[method-assign]
    assert decoded_in and all(name != "MainThread" for name in decoded_in)
    after = metrics.render().decode()
    assert f"vigil_executions_in_flight {float(counts.in_flight)}" in after
    assert counts.in_flight > 0
    assert "vigil_state_gauges_age_seconds -1.0" not in after


def test_gauges_start_empty_and_age() -> None:
    g = StateGauges()
    assert g.age() is None and g.counts.entries == 0
    asyncio.run(g.refresh({}))
    assert g.age() is not None and g.age() >= 0 and g.rounds == 1


def _reference_counts(raw_entries: list[Any]) -> Any:
    """The gauges computed the long way: every book fully decoded, approvals as the
    ``ApprovalBook`` model (``open_request_ids``)."""
    from collections import Counter

    from streams.core import approvals as ap
    from streams.core import operations as ops
    from streams.engine.state import Entry
    from streams.read.state_gauges import StateCounts

    in_flight = unknown = work = 0
    oldest: float | None = None
    by_verdict: Counter[str] = Counter()
    for raw in raw_entries:
        e = Entry.decode(raw)
        in_flight += e.inflight is not None
        if e.operations:
            for op in ops.load_book(e.operations).operations.values():
                for rec in op.attempts.values():
                    if rec.status == "UNKNOWN":
                        unknown += 1
                        since = rec.since / 1000
                        oldest = since if oldest is None else min(oldest, since)
                    work += rec.work_item_id is not None
        if e.approvals:
            book = ap.ApprovalBook.model_validate_json(e.approvals)
            for rid in ap.open_request_ids(book):
                last = book.last_verdicts.get(rid)
                by_verdict[str(last.verdict) if last else "UNJUDGED"] += 1
    return StateCounts(
        in_flight, unknown, work, tuple(sorted(by_verdict.items())), len(raw_entries), oldest
    )


def test_the_quick_count_equals_full_decoding_on_the_benchmark_mix_at_every_stage() -> None:
    """The count that skips parsing books which cannot add to it gives what decoding every
    book gives, on the benchmark's mix (UNKNOWN attempts, work items, every verdict) taken
    at several points of its run."""
    from bench.core import workload

    proc = Processor(TOPICS, Stores())
    envs = workload(300)
    stages = {len(envs) // 4, len(envs) // 2, 3 * len(envs) // 4, len(envs)}
    seen_unknown = seen_work = seen_verdicts = False
    for i, e in enumerate(envs, 1):
        proc.handle(e)
        if i in stages:
            proc.flush()
            raw = list(proc.stores.executions.values())
            counts = count_state(raw)
            assert counts == _reference_counts(raw)
            seen_unknown |= counts.operations_unknown > 0
            seen_work |= counts.work_items_open > 0
            seen_verdicts |= len(counts.approvals_open) > 1
    assert seen_unknown and seen_work and seen_verdicts


def test_a_round_is_followed_by_a_pause_that_bounds_its_share(monkeypatch: Any) -> None:
    """Counting holds the GIL: after a round that took d seconds, refreshes count nothing
    for d / MAX_SHARE seconds (the last counts stand, their age growing), then count again."""
    import time

    import streams.read.state_gauges as sg

    calls: list[int] = []

    def slow_count(values: Any) -> Any:
        calls.append(1)
        time.sleep(0.02)
        return sg.StateCounts(in_flight=len(calls))

    monkeypatch.setattr(sg, "count_state", slow_count)
    g = StateGauges()
    first = asyncio.run(g.refresh({"a": b"x"}))
    assert first.in_flight == 1 and g.not_before - g.taken_at >= 0.02 / sg.MAX_SHARE
    again = asyncio.run(g.refresh({"a": b"x"}))
    assert again is first and len(calls) == 1 and g.rounds == 1
    monkeypatch.setattr(time, "monotonic", lambda: g.not_before + 0.001)
    third = asyncio.run(g.refresh({"a": b"x"}))
    assert third.in_flight == 2 and g.rounds == 2
