"""Gauges of open work (in flight, UNKNOWN operations, open work items, open approvals by
verdict), counted off the event loop.

Why not at scrape time: counting means decoding every stored execution entry, hundreds of
milliseconds at a few thousand executions, and a scrape runs on the worker's event loop, where
it held up every batch and every API request behind it. So a background round, every
``interval`` seconds, takes the stored entries (the raw bytes: a copy of references for the
in-memory store, on the loop, or read in a thread for RocksDB) and decodes and counts them in a
worker thread; a scrape only reads the last counts, with their age
(``vigil_state_gauges_age_seconds``). The counts are of the stored state: the batch in
progress shows from the next round.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from streams.contracts.models.enums import OperationStatus
from streams.core import approvals as ap
from streams.core import operations as ops
from streams.state import Entry


@dataclass(frozen=True, slots=True)
class StateCounts:
    in_flight: int = 0
    operations_unknown: int = 0
    work_items_open: int = 0
    #: open approval requests by their last verdict (UNJUDGED before the first)
    approvals_open: tuple[tuple[str, int], ...] = ()
    entries: int = 0
    #: when the longest-standing UNKNOWN operation became UNKNOWN (event time, epoch
    #: seconds; None: none is UNKNOWN), for an alert on UNKNOWN outcomes left past their SLA
    unknown_oldest_since: float | None = None


def count_state(raw_entries: Iterable[bytes | str]) -> StateCounts:
    """The gauges over stored execution entries (``Entry.pack`` bytes). Pure: any thread."""
    in_flight = unknown = work = entries = 0
    oldest: float | None = None
    by_verdict: Counter[str] = Counter()
    for raw in raw_entries:
        entries += 1
        e = Entry.decode(raw)
        in_flight += e.inflight is not None
        if e.operations:
            book = ops.load_book(e.operations)
            for op in book.operations.values():
                for rec in op.attempts.values():
                    if rec.status == OperationStatus.UNKNOWN:
                        unknown += 1
                        since = rec.since / 1000  # epoch ms
                        oldest = since if oldest is None else min(oldest, since)
                    work += rec.work_item_id is not None
        if e.approvals:
            approvals = ap.ApprovalBook.model_validate_json(e.approvals)
            for rid in ap.open_request_ids(approvals):
                last = approvals.last_verdicts.get(rid)
                by_verdict[str(last.verdict) if last else "UNJUDGED"] += 1
    return StateCounts(in_flight, unknown, work, tuple(sorted(by_verdict.items())), entries, oldest)


@dataclass
class StateGauges:
    """The last counts and when they were taken (monotonic seconds; None: never yet)."""

    counts: StateCounts = field(default_factory=StateCounts)
    taken_at: float | None = None
    rounds: int = 0

    def age(self) -> float | None:
        return None if self.taken_at is None else time.monotonic() - self.taken_at

    async def refresh(self, table: MutableMapping[str, Any]) -> StateCounts:
        """Count the entries ``table`` stores now, decoding in a worker thread."""
        started = time.monotonic()
        values = _values_in_memory(table)
        if values is not None:
            counts = await asyncio.to_thread(count_state, values)
        else:  # a store on disk (RocksDB): read in the thread too
            counts = await asyncio.to_thread(lambda: count_state(v for _, v in table.items()))
        self.counts, self.taken_at = counts, started
        self.rounds += 1
        return counts


def _values_in_memory(table: Any) -> list[Any] | None:
    """The stored values as a list, if they live in a dict in memory (a dict, or a Faust
    memory store under ``agents.changelog.DirectTable``): copying references is the one part
    done on the loop, since the dict changes with every batch."""
    if isinstance(table, dict):
        return list(table.values())
    store = getattr(getattr(table, "table", None), "data", None)
    inner = getattr(store, "data", None)
    if isinstance(inner, dict):
        return list(inner.values())
    return None
