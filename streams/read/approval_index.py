"""Which execution holds an approval request: the index behind ``GET /v1/approvals/{id}``.

Why an index: an approval request id does not name its execution, and the table is keyed by
execution. Finding a request by reading every entry costs time proportional to the table, on
the event loop that also runs the pipeline and every other request: about 120 ms a lookup at
a few thousand executions, and twenty unknown ids in parallel made a ``/metrics`` scrape ten
times slower. With the index a lookup is a dictionary probe per owned partition, then one
table read of the execution it names.

What it holds: request id -> execution id, per partition this worker owns (the active
partitions of the executions table, not its standby copies: another worker answers for
those). Two sources keep it whole:

- **What the worker publishes.** Every request gets a verdict the first time it is judged
  (``core.approvals.advance`` emits whenever a request has no verdict yet), and a verdict names
  both ids. The pipeline calls ``note`` with the outputs of each batch once the broker has them
  and before the state is written: an index ahead of the table is harmless (a lookup reads the
  table, and a request it does not hold is not found), one behind it would answer 404 for a
  request that is stored.
- **The table, after a rebalance or a restart.** The processor's memory is not recovered, the
  table is (from its changelog). Once Faust has recovered the tables of a new assignment,
  ``assign`` drops the partitions that left and rebuilds the ones that came, by reading their
  entries in a worker thread (``asyncio.to_thread``): the event loop only swaps the result in.
  Partitions held before and after keep their index: nobody else wrote to them in between.

While a rebuild runs, the index cannot say that a request does not exist. A lookup it cannot
answer then waits for the rebuild (``wait_complete``, bounded) and, if it is still running,
is answered 503 "approval index rebuilding" with ``Retry-After``, a state the caller can act
on. Not a threaded scan as a fallback: N unknown ids would be N scans competing for the
interpreter with the event loop, the very load the index removes.

Stale entries: the processor drops a closed request from its book after the retention, and
publishes nothing then. A lookup that finds the book without the request drops the entry
(``forget``). And once the index has taken more new entries since the last rebuild than that
rebuild read rows (and at least ``REFRESH_MIN``), every owned partition is read again in the
background: a rebuild costs at most one row read per entry added, and entries of purged
requests never outnumber the live ones for long.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from streams.contracts.models.outputs import ApprovalVerdict
from streams.engine.state import Entry
from streams.kafka.partitioning import partition_of

log = logging.getLogger("vigil.approval_index")

#: New entries since the last rebuild below which no refresh runs, whatever the table size.
REFRESH_MIN = 10_000
#: A snapshot of the table that changed size while it was copied is taken again this often.
SNAPSHOT_TRIES = 20


def request_ids(approvals: str) -> list[str]:
    """The request ids an execution's stored approval book holds (its JSON, as the table
    stores it). Read with ``json``, not the model: a rebuild reads every book of a partition."""
    book = json.loads(approvals)
    requests = book.get("requests") if isinstance(book, dict) else None
    return list(requests) if isinstance(requests, dict) else []


def scan(rows: Iterable[tuple[str, Any]], partitions: int, wanted: frozenset[int]) -> ScanResult:
    """Request id -> execution id for the entries of the ``wanted`` partitions, from the
    table's (key, stored value) rows. An entry that cannot be read is skipped and counted:
    the processor reports it when it loads it, the index only has nothing to say about it."""
    found: dict[int, dict[str, str]] = {p: {} for p in wanted}
    read = unreadable = 0
    for execution_id, raw in rows:
        if not isinstance(execution_id, str) or raw is None:
            continue
        p = partition_of(execution_id, partitions)
        if p not in wanted:
            continue
        read += 1
        try:
            approvals = Entry.decode(raw).approvals
            ids = request_ids(approvals) if approvals else []
        except (ValueError, TypeError, AttributeError):
            unreadable += 1
            continue
        index = found[p]
        for rid in ids:
            index[rid] = execution_id
    return ScanResult(found, read, unreadable)


class ScanResult:
    __slots__ = ("by_partition", "read", "unreadable")

    def __init__(self, by_partition: dict[int, dict[str, str]], read: int, unreadable: int):
        self.by_partition = by_partition
        self.read = read
        self.unreadable = unreadable


def snapshot(table: Any) -> list[tuple[str, Any]]:
    """The table's rows, copied. For the in-memory store this copies a ``dict``'s items in
    one step that no other thread interleaves with; a store whose iteration a concurrent
    write can break (``RuntimeError``: changed size during iteration) is copied again."""
    for _ in range(SNAPSHOT_TRIES - 1):
        try:
            return list(table.items())
        except RuntimeError:
            continue
    return list(table.items())


class ApprovalIndex:
    """Request id -> execution id for the partitions this worker owns (see the module)."""

    def __init__(
        self,
        table: Any,
        partitions: int,
        *,
        read_rows: Callable[[Any], list[tuple[str, Any]]] = snapshot,
    ) -> None:
        #: the executions table (read in a worker thread by rebuilds, never iterated here)
        self.table = table
        self.partitions = partitions
        self.read_rows = read_rows
        self._by_partition: dict[int, dict[str, str]] = {}
        #: partitions owned now, and those of them whose index is complete
        self._owned: set[int] = set()
        self._complete: set[int] = set()
        #: whether the owned partitions are known (False before the first assignment and
        #: between a revocation and the end of the next recovery)
        self._assigned = False
        self._generation = 0
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: what ``note`` added, per partition, since the running rebuild began reading
        self._during: dict[int, dict[str, str]] = {}
        #: rows read by the last rebuild, and entries added since: what triggers a refresh
        self._last_read = 0
        self._added = 0
        #: rows read by every rebuild so far: a lookup never adds to it (tests and metrics)
        self.rows_read = 0
        self.rebuilds = 0

    # -- what the worker does ------------------------------------------------------------------
    def note(self, records: Iterable[Any]) -> None:
        """Index the requests named by published outputs (only verdicts name one)."""
        for record in records:
            if type(record) is not ApprovalVerdict:
                continue
            execution_id = record.execution_id
            if not execution_id:
                continue
            p = partition_of(execution_id, self.partitions)
            index = self._by_partition.get(p)
            if index is None:
                continue  # not a partition this worker owns (any more)
            if index.get(record.request_id) != execution_id:
                index[record.request_id] = execution_id
                self._added += 1
            during = self._during.get(p)
            if during is not None:
                during[record.request_id] = execution_id
        if self._added > max(self._last_read, REFRESH_MIN) and self._task is None:
            self._start(set(self._owned))

    def revoke(self) -> None:
        """A rebalance started: which partitions stay is not known until it ends."""
        self._generation += 1
        self._assigned = False
        self._signal()

    def assign(self, owned: Iterable[int]) -> None:
        """The tables of a new assignment are recovered: keep the partitions held before,
        rebuild the others off the event loop. Idempotent (Faust may say so twice)."""
        owned = set(owned)
        if self._assigned and owned == self._owned:
            return
        self._generation += 1
        for p in list(self._by_partition):
            if p not in owned:
                del self._by_partition[p]
        self._complete &= owned
        self._owned = owned
        self._assigned = True
        new = owned - self._complete
        for p in new:
            self._by_partition[p] = {}  # ``note`` fills it while the rebuild reads the table
        if self._task is not None:
            self._task.cancel()  # its partitions may have moved; what is missing starts below
            self._task = None
        if new:
            self._start(new)
        self._signal()

    def _start(self, partitions: set[int]) -> None:
        self._during = {p: {} for p in partitions}
        self._task = asyncio.ensure_future(self._rebuild(self._generation, partitions))

    async def _rebuild(self, generation: int, partitions: set[int]) -> None:
        """Read the partitions' entries in a worker thread and swap the result in. What
        ``note`` added while the thread read is kept: it is at least as new as the table."""
        delay = 0.5
        try:
            while generation == self._generation:
                try:
                    result = await asyncio.to_thread(self._read, frozenset(partitions))
                    break
                except Exception:
                    log.warning("approval index: reading the table failed; again", exc_info=True)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 10.0)
            else:
                return
            if generation != self._generation:
                return  # a rebalance came: its own rebuild follows
            for p, found in result.by_partition.items():
                if p in self._owned:
                    self._by_partition[p] = found | self._during.get(p, {})
                    self._complete.add(p)
            self.rows_read += result.read
            self.rebuilds += 1
            self._last_read = result.read
            self._added = 0
            if result.unreadable:
                log.warning("approval index: %s unreadable entries skipped", result.unreadable)
        finally:
            if self._task is asyncio.current_task():
                self._task = None
                self._during = {}
            self._signal()

    def _read(self, partitions: frozenset[int]) -> ScanResult:
        return scan(self.read_rows(self.table), self.partitions, partitions)

    def _signal(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # -- what a lookup asks ----------------------------------------------------------------------
    def complete(self) -> bool:
        """Whether every owned partition is indexed: a request not found does not exist here."""
        return self._assigned and self._complete >= self._owned

    async def wait_complete(self, timeout: float) -> bool:
        """Wait (without blocking the loop) until ``complete``, at most ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self.complete():
            left = deadline - loop.time()
            if left <= 0:
                return False
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                return self.complete()
        return True

    def find(self, request_id: str) -> str | None:
        """The execution this worker's index says holds the request (one probe per owned
        partition: their number, never the table's size)."""
        for index in self._by_partition.values():
            execution_id = index.get(request_id)
            if execution_id is not None:
                return execution_id
        return None

    def forget(self, request_id: str, execution_id: str) -> None:
        """The execution's book no longer holds the request (purged after the retention)."""
        index = self._by_partition.get(partition_of(execution_id, self.partitions))
        if index is not None and index.get(request_id) == execution_id:
            del index[request_id]

    def size(self) -> int:
        return sum(len(index) for index in self._by_partition.values())

    def stats(self) -> Mapping[str, int]:
        return {
            "entries": self.size(),
            "rows_read": self.rows_read,
            "rebuilds": self.rebuilds,
            "complete": int(self.complete()),
        }
