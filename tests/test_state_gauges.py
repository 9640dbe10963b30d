"""The open-work gauges: counted from the stored entries in a worker thread, and a scrape that
reads no table at all."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

from streams.local.scenario import Tick, demo_scenario
from streams.processor import Processor, Stores
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
