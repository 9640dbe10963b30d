"""A guard on the offsets the worker is handed: every input record, in order, none skipped.

Why: faust-streaming 0.15.3 resumes fetching before it seeks to the committed offsets after a
rebalance (``tables/recovery.py``), and its fetch loop drops any record below the highest
offset it has handed on (``Consumer._drain_messages``), counting the jumped-over offsets as
acknowledged (``_add_gap``). Records between the committed offset and the old position are
then never processed, and their offsets get committed. Input topics here are neither
compacted nor transactional, so a jump in offsets is a loss, never a hole in the log.

The guard keeps, per input partition, the next offset the worker must see, starting at the
group's committed offset read from the broker. A record past it is refused (not processed,
not acknowledged) and the shell seeks back. A record before it is a redelivery and goes on
(the processor recognises inputs it has applied). A hole that several seeks in a row cannot
fill is real (retention deleted the records, or a transactional producer's markers) and is
accepted, logged and counted.
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
    #: below the committed offset the guard started from: applied and committed before (its
    #: applied position may be forgotten already), so skipped, neither processed nor sought
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
    #: per partition: the committed offset the guard started from
    floor: dict[TopicPartition, int] = field(default_factory=dict)
    skipped_records: int = 0
    seeks: int = 0
    #: records handed over below the committed offset, skipped
    below_committed: int = 0

    def reset(self) -> None:
        """After a rebalance: start again from the committed offsets."""
        self.expected.clear()
        self.floor.clear()
        self._seeks.clear()
        self._seeking.clear()

    def knows(self, tp: TopicPartition) -> bool:
        return tp in self.expected

    def start(self, tp: TopicPartition, offset: int) -> None:
        self.expected[tp] = offset
        self.floor[tp] = offset

    def check(self, tp: TopicPartition, offset: int, *, retry: bool) -> Check:
        """``retry``: whether the shell may seek again now (its last seek of ``tp`` is old
        enough that records fetched before it have drained)."""
        want = self.expected[tp]
        if offset < self.floor.get(tp, 0):
            # Kafka does not deliver what the group committed, unless a fetch position is
            # stale: a seek decided before a rebalance and run after it, or Faust resuming
            # before its seek to the committed offsets. The record's effect is stored and its
            # outputs published; an entry may have forgotten the position (it is below the
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
