"""A guard on the offsets the worker is handed: every input record, in order, none skipped.

Why: faust-streaming 0.15.3 resumes fetching before it seeks to the committed offsets after a
rebalance (``tables/recovery.py``), and its fetch loop drops any record below the highest
offset it has handed on (``Consumer._drain_messages``), counting the jumped-over offsets as
acknowledged (``_add_gap``). Records between the committed offset and the old position are
then never processed, and their offsets get committed. Input topics here are neither
compacted nor transactional, so a jump in offsets is a loss, never a hole in the log.

The guard keeps, per input partition, the next offset the worker must see, starting at the
group's committed offset read from the broker. A record past it is refused (not processed,
not acknowledged) and the shell seeks back. A record below the highest committed offset the
broker has confirmed (``confirm``) is skipped: it was processed and its effect stored, and the
entries of the executions forget the positions of the inputs below that offset
(``ExecutionStore.mark_applied``), so processing it again would judge it a second time. A
record between that offset and the next one expected is a redelivery and goes on (the
processor recognises it by the position its entry still keeps or, when it is applied only after
a commit past it was confirmed, by that offset: ``Processor._apply``). A hole that several seeks in
a row cannot fill is real (retention deleted the records, or a transactional producer's
markers) and is accepted, logged and counted.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

TopicPartition = tuple[str, int]


class Check(Enum):
    NEXT = "next"  #: the record expected: process it
    AGAIN = "again"  #: an offset handed on before: a redelivery, process it
    SEEK = "seek"  #: records were skipped: refuse this one and seek back to ``expected``
    WAIT = "wait"  #: a seek is on its way: refuse this one, seek nothing
    #: below the committed offset the guard started from, or below one the broker confirmed
    #: since: applied and committed before (its applied position may be forgotten already),
    #: so skipped, neither processed nor sought
    COMMITTED = "committed"
    HOLE = "hole"  #: the same hole after ``max_seeks`` seeks: accepted, process it


@dataclass
class OffsetGuard:
    max_seeks: int = 5
    expected: dict[TopicPartition, int] = field(default_factory=dict)
    #: per partition: (offset sought, first offset seen past it, seeks so far)
    _seeks: dict[TopicPartition, tuple[int, int, int]] = field(default_factory=dict)
    #: per partition: a seek was made and no record at the expected offset came since
    _seeking: set[TopicPartition] = field(default_factory=set)
    #: per partition: below it every record is skipped (``Check.COMMITTED``): the offset the
    #: guard started from, raised by every committed offset the broker confirms
    floor: dict[TopicPartition, int] = field(default_factory=dict)
    #: per partition: the highest committed offset the broker confirmed to this worker (read
    #: from it, or a commit it accepted). Kept across rebalances: it only ever says that the
    #: records below it were processed and their effect stored.
    confirmed: dict[TopicPartition, int] = field(default_factory=dict)
    skipped_records: int = 0
    seeks: int = 0
    #: records handed over below the committed offset, skipped
    below_committed: int = 0

    def reset(self) -> None:
        """After a rebalance: start again from the committed offsets (``confirmed`` stays)."""
        self.expected.clear()
        self.floor.clear()
        self._seeks.clear()
        self._seeking.clear()

    def knows(self, tp: TopicPartition) -> bool:
        return tp in self.expected

    def start(self, tp: TopicPartition, offset: int) -> None:
        """Expect ``offset`` next, and skip what lies below it or below a confirmed commit."""
        offset = max(offset, self.confirmed.get(tp, offset))
        self.expected[tp] = offset
        self.floor[tp] = offset

    def confirm(self, tp: TopicPartition, offset: int) -> None:
        """The broker holds ``offset`` as the group's committed offset of ``tp``: read from it,
        or a commit it accepted. Every record below it is processed and its effect stored.

        Why the floor rises with it: the processor asks ``committed`` to drop, from the entries,
        the positions of inputs below it (an entry would otherwise grow without bound), so an
        input handed over again below it would no longer be recognised as applied and would be
        judged a second time (a DUPLICATE or AFTER_TERMINAL anomaly). Kafka does hand such
        records over again: a consumer's fetch position can go back within one generation (two
        workers killed again and again under a backlog showed a partition handed over a second
        time from below an offset already committed). Skipping them is right whatever the
        reason: their effect is stored and their outputs published."""
        if offset < 0 or offset <= self.confirmed.get(tp, -1):
            return
        self.confirmed[tp] = offset
        if tp in self.expected:
            self.floor[tp] = max(self.floor.get(tp, 0), offset)
            # the records below are done: the next one expected is at least there
            self.expected[tp] = max(self.expected[tp], offset)

    def committed(self, tp: TopicPartition) -> int | None:
        """The highest committed offset the broker confirmed for ``tp`` (None: none yet):
        below it, entries may forget positions, because the guard skips those records."""
        return self.confirmed.get(tp)

    def check(self, tp: TopicPartition, offset: int, *, retry: bool) -> Check:
        """``retry``: whether the shell may seek again now (its last seek of ``tp`` is old
        enough that records fetched before it have drained)."""
        want = self.expected[tp]
        if offset < self.floor.get(tp, 0):
            # Kafka does not deliver what the group committed, unless a fetch position is
            # stale or went back: a seek decided before a rebalance and run after it, Faust
            # resuming before its seek to the committed offsets, a partition read a second
            # time within a generation. The record's effect is stored and its outputs
            # published; an entry may have forgotten the position (it is below a confirmed
            # committed offset), so processing it would judge it a duplicate.
            self.below_committed += 1
            return Check.COMMITTED
        if offset == want:
            self._seeks.pop(tp, None)
            self._seeking.discard(tp)
            self.expected[tp] = offset + 1
            return Check.NEXT
        if offset < want:
            return Check.AGAIN
        sought, first, n = self._seeks.get(tp, (want, offset, 0))
        if sought != want or tp not in self._seeking:
            sought, first, n = want, offset, 0
        elif offset == first:
            # the seek came back to the very record it jumped to: the hole is in the log
            if n >= self.max_seeks:
                self._seeks.pop(tp, None)
                self._seeking.discard(tp)
                self.skipped_records += offset - want
                self.expected[tp] = offset + 1
                return Check.HOLE
        elif not retry:
            return Check.WAIT
        self._seeks[tp] = (want, first, n + 1)
        self._seeking.add(tp)
        self.seeks += 1
        return Check.SEEK

    def give_up(self, tp: TopicPartition, earliest: int) -> bool:
        """Records below the log start are gone for good (retention): start from there."""
        want = self.expected.get(tp)
        if want is None or want >= earliest:
            return False
        self.skipped_records += earliest - want
        self.expected[tp] = earliest
        self._seeks.pop(tp, None)
        self._seeking.discard(tp)
        return True


class AckOrder:
    """Acknowledges records per partition in offset order only.

    Why: faust-streaming 0.15.3 commits past one unacknowledged record at the head of a
    partition (``Consumer._new_offset`` treats the committed offset as the last one processed,
    not the next one to read: with 36 committed, acknowledging 37 commits 38). A record held
    for the watermark is acknowledged after records behind it, so its offset could be committed
    before it was processed, and lost at the next rebalance. Holding back every acknowledgement
    until the records before it on its partition are done keeps Faust's commits truthful."""

    def __init__(self) -> None:
        self._seq = 0
        self._heads: dict[TopicPartition, list[tuple[int, int, Any]]] = {}
        self._done: set[int] = set()

    def admit(self, tp: TopicPartition, offset: int, token: Any) -> None:
        """A record handed to the processor (its token will come back when done)."""
        self._seq += 1
        heapq.heappush(self._heads.setdefault(tp, []), (offset, self._seq, token))

    def finish(self, token: Any) -> None:
        self._done.add(id(token))

    def release(self) -> list[Any]:
        """Tokens that may be acknowledged now: per partition, the done ones before the first
        one still in progress."""
        out: list[Any] = []
        for heap in self._heads.values():
            while heap and id(heap[0][2]) in self._done:
                token = heapq.heappop(heap)[2]
                self._done.discard(id(token))
                out.append(token)
        return out

    def waiting(self) -> int:
        return sum(len(h) for h in self._heads.values())

    def reset(self) -> None:
        self._heads.clear()
        self._done.clear()
