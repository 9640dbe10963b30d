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

Why rounds are spaced by their own cost: the counting thread holds the GIL while it decodes,
so every second it counts is a second the worker does not process. A round costs about a
microsecond or two per entry (an operation book is parsed only when its text names an UNKNOWN
attempt or a work item, an approval book only as plain JSON), and the next round waits for at
least ``1 / MAX_SHARE`` times what the last one took, so counting never takes more than
``MAX_SHARE`` of the worker's time, however many executions are in flight: at a million
entries the gauges are older (their age says how much), not the worker slower.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from streams.contracts.models.enums import OperationStatus
from streams.core import operations as ops
from streams.core.approvals import CLOSED_VERDICTS
from streams.engine.state import Entry


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


#: The largest share of the worker's time the counting rounds may take (see the module's
#: docstring): a round that took d seconds is followed by the next no sooner than d / MAX_SHARE.
MAX_SHARE = 0.05

_CLOSED = frozenset(str(v) for v in CLOSED_VERDICTS)


def count_state(raw_entries: Iterable[bytes | str]) -> StateCounts:
    """The gauges over stored execution entries (``Entry.pack`` bytes). Pure: any thread."""
    in_flight = unknown = work = entries = 0
    oldest: float | None = None
    by_verdict: Counter[str] = Counter()
    for raw in raw_entries:
        entries += 1
        e = Entry.decode(raw)
        in_flight += e.inflight is not None
        text = e.operations
        # An UNKNOWN attempt has that status written out, a work item its "wi-" id: a book
        # whose text names neither adds nothing, and is not parsed.
        if text and ("UNKNOWN" in text or '"wi-' in text):
            book = ops.load_book(text)
            for op in book.operations.values():
                for rec in op.attempts.values():
                    if rec.status == OperationStatus.UNKNOWN:
                        unknown += 1
                        since = rec.since / 1000  # epoch ms
                        oldest = since if oldest is None else min(oldest, since)
                    work += rec.work_item_id is not None
        if e.approvals:
            _count_open_requests(e.approvals, by_verdict)
    return StateCounts(in_flight, unknown, work, tuple(sorted(by_verdict.items())), entries, oldest)


def _count_open_requests(text: str, by_verdict: Counter[str]) -> None:
    """Open requests by last verdict, read from the approval book's stored JSON (the form
    ``ApprovalBook`` writes) without building the book: a request is open when it has been
    requested and its last verdict, if any, does not close it (``open_request_ids``)."""
    book = json.loads(text)
    last = book.get("last_verdicts") or {}
    for rid, request in (book.get("requests") or {}).items():
        if request.get("request") is None:
            continue
        verdict = last.get(rid)
        code = verdict["verdict"] if verdict else None
        if code in _CLOSED:
            continue
        by_verdict[code or "UNJUDGED"] += 1


@dataclass
class StateGauges:
    """The last counts and when they were taken (monotonic seconds; None: never yet)."""

    counts: StateCounts = field(default_factory=StateCounts)
    taken_at: float | None = None
    rounds: int = 0
    #: monotonic seconds before which a refresh counts nothing (``MAX_SHARE``)
    not_before: float = 0.0

    def age(self) -> float | None:
        return None if self.taken_at is None else time.monotonic() - self.taken_at

    async def refresh(self, table: MutableMapping[str, Any]) -> StateCounts:
        """Count the entries ``table`` stores now, decoding in a worker thread; nothing (the
        last counts returned) while the last round's cost keeps the next one away."""
        started = time.monotonic()
        if started < self.not_before:
            return self.counts
        values = _values_in_memory(table)
        if values is not None:
            counts = await asyncio.to_thread(count_state, values)
        else:  # a store on disk (RocksDB): read in the thread too
            counts = await asyncio.to_thread(lambda: count_state(v for _, v in table.items()))
        self.counts, self.taken_at = counts, started
        self.not_before = started + (time.monotonic() - started) / MAX_SHARE
        self.rounds += 1
        return counts


def _values_in_memory(table: Any) -> list[Any] | None:
    """The stored values as a list, if they live in a dict in memory (a dict, or a Faust
    memory store under ``vigil_worker.changelog.DirectTable``): copying references is the one part
    done on the loop, since the dict changes with every batch."""
    if isinstance(table, dict):
        return list(table.values())
    store = getattr(getattr(table, "table", None), "data", None)
    inner = getattr(store, "data", None)
    if isinstance(inner, dict):
        return list(inner.values())
    return None
