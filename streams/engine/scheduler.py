"""The event-time scheduler: when each held event and each deadline is processed.

Per partition it keeps the partition clock (the largest event time seen on each input topic;
the watermark is their minimum, minus the allowed lateness), the events held until the
watermark passes the instant each is placed at (``place``: its own time, or, for a late event,
its topic partition's time minus the lateness), and a heap of due times (execution id and when
its books next need advancing). ``release`` gives, in time order, every held event and every
due time strictly before a new watermark; the processor applies or advances each. At equal
times events go first: an answer stamped at its deadline is in time.

Times are integer epoch milliseconds throughout (event times, watermarks, due times), as in the
core: a record's time is converted once, where the processor reads it. Each partition's clock
is a dict of maxima updated in place; the immutable ``PartitionClock`` is built only where a
clock is stored or shown (``flush_clocks``, ``clocks``).

It also does the bookkeeping that lets a stored clock be trusted after a restart: which
records were read since the clock was last stored, which are still held, how far each input
topic partition is acknowledged (``acked_clock``), which tokens are done (``drain_done``), and
the flow control of the live worker (``held_by``, ``held_ahead``). None of this is state: all
of it is rebuilt from the log and the tables after a restart or a rebalance (``forget``).
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Callable, Iterator, MutableMapping
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from streams.contracts.envelope import Envelope
from streams.core.clock import PartitionClock, placed_at, watermark_ms

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ONE_MS = timedelta(milliseconds=1)


def epoch_ms(t: datetime) -> int:
    """Epoch milliseconds, exactly: ``int(t.timestamp() * 1000)`` goes through a float and
    gives the millisecond before for some times, and a deadline scheduled a millisecond early
    would be judged short of itself and scheduled again, for ever."""
    return (t - EPOCH) // ONE_MS


class HeldEvent(NamedTuple):
    """An event waiting for its partition's watermark. Ordered as released: by the instant it
    is placed at (its event time unless it is late, ``Scheduler.place``), then input topic
    rank, offset and arrival (``seq`` is unique, so ``env`` and ``token`` are never
    compared)."""

    time_ms: int
    rank: int
    offset: int
    seq: int
    env: Envelope
    #: given back by ``drain_done`` once the event is processed (the live worker's message)
    token: Any


class DueTime(NamedTuple):
    """An execution whose books need advancing at ``at_ms``. Stale entries are harmless:
    advancing a book to a time it has passed changes nothing, and the processor passes over
    those it knows to be stale without reading the execution (``ExecutionStore.quiet``)."""

    at_ms: int
    execution_id: str


class Due(NamedTuple):
    """Executions to advance to ``at_ms``, released together, in id order."""

    at_ms: int
    execution_ids: tuple[str, ...]


class Read(NamedTuple):
    """An input record observed since its partition's clock was last stored."""

    offset: int
    at_ms: int


def from_ms(ms: int) -> datetime:
    return EPOCH + ms * ONE_MS


class Timers(NamedTuple):
    """A partition's due times as its tables say, rebuilt after a restart or rebalance."""

    due: list[DueTime]
    #: executions with facts stored but never judged and no time after their last judgement:
    #: advanced first, to the instant before the next watermark
    judge_first: set[str]


class Scheduler:
    def __init__(
        self,
        input_names: tuple[str, ...],
        clocks: MutableMapping[str, Any],
        timers: Callable[[int], Timers],
        lateness_ms: int = 0,
    ) -> None:
        """``clocks``: the table of stored partition clocks (partition number as text -> a
        clock's JSON); ``timers``: a partition's due times from the tables, asked once per
        partition after every ``forget``; ``lateness_ms``: how far an event may be behind its
        own topic partition's time and still be judged at its own time (``place``)."""
        self.input_names = input_names
        self.lateness_ms = lateness_ms
        self.store = clocks
        self.timers = timers
        self.rank = {name: i for i, name in enumerate(input_names)}
        #: per partition, the largest event time read on each input topic (epoch ms), as read
        #: so far; updated in place
        self.maxima: dict[int, dict[str, int]] = {}
        #: per partition, the minimum of ``maxima`` minus the lateness once every input topic
        #: is in it, else absent: the watermark, kept as the maxima move (it only rises)
        self.watermarks: dict[int, int] = {}
        #: the clock of each partition as last stored (or restored): acknowledged records only
        self.saved: dict[int, PartitionClock] = {}
        #: partitions whose clock moved or whose acknowledgements rose since last stored
        self.clocks_dirty: set[int] = set()
        #: per input topic partition, the records observed since the stored clock, in read
        #: order; folded into it up to the first one still held
        self.trail: dict[tuple[str, int], deque[Read]] = {}
        #: per input topic partition, offsets of the events held for the watermark
        self.held_offsets: dict[tuple[str, int], set[int]] = {}
        #: per partition, per input topic: processed below this offset, not stored yet
        self.processed: dict[int, dict[str, int]] = {}
        #: per partition, a heap of due times; built from the tables on first use
        self.due: dict[int, list[DueTime]] = {}
        #: per partition, executions to advance before anything else (``Timers.judge_first``)
        self.judge_first: dict[int, set[str]] = {}
        #: per partition, a heap of the events waiting for the watermark
        self.pending: dict[int, list[HeldEvent]] = {}
        #: held events per (input topic, partition): the live worker pauses a topic partition
        #: that runs far ahead of the others (``held_ahead``), so what waits for the watermark
        #: stays bounded whatever the backlog.
        self.held_by: Counter[tuple[str, int]] = Counter()
        #: per input topic partition, the event time of the newest clock tick read there (for
        #: the metrics: how long ago the ticker's clock last reached the partition)
        self.last_tick: dict[tuple[str, int], int] = {}
        self.seq = 0
        self.done_tokens: list[Any] = []

    def forget(self) -> None:
        """After a rebalance: stream time and due-time indexes are rebuilt from the log and
        the tables. Decisions are stamped with exact due times, so nothing is decided twice
        or differently; at worst one tick later. Held events were never acknowledged: Kafka
        delivers them again to the partition's owner."""
        self.maxima.clear()
        self.watermarks.clear()
        self.saved.clear()
        self.trail.clear()
        self.held_offsets.clear()
        self.processed.clear()
        self.due.clear()
        self.judge_first.clear()
        self.pending.clear()
        self.held_by.clear()
        self.last_tick.clear()
        self.clocks_dirty.clear()
        self.done_tokens.clear()

    # -- held events and tokens -------------------------------------------------------------
    def hold(self, env: Envelope, time_ms: int, token: Any) -> None:
        """Keep an event until its partition's watermark passes ``time_ms`` (where ``place``
        put it)."""
        self.seq += 1
        topic, partition, offset = env.topic, env.partition, env.offset
        where = (topic, partition)
        self.held_by[where] += 1
        offsets = self.held_offsets.get(where)
        if offsets is None:
            offsets = self.held_offsets[where] = set()
        offsets.add(offset)
        heap = self.pending.get(partition)
        if heap is None:
            heap = self.pending[partition] = []
        heapq.heappush(
            heap, HeldEvent(time_ms, self.rank.get(topic, 0), offset, self.seq, env, token)
        )

    def done(self, token: Any) -> None:
        """The input ``token`` stands for is processed: it may be acknowledged."""
        self.done_tokens.append(token)

    def drain_done(self) -> list[Any]:
        """Tokens of the records processed since the last call (to acknowledge)."""
        done, self.done_tokens = self.done_tokens, []
        return done

    def held(self) -> int:
        return sum(len(h) for h in self.pending.values())

    def held_ahead(self, topic: str, partition: int) -> bool:
        """Whether the topic partition's newest time is past its partition's watermark: its
        held events wait for the other inputs, so reading it further only holds more. The
        input that sets the watermark is never ahead: pausing it could stop time."""
        maxima = self.maxima.get(partition)
        newest = maxima.get(topic) if maxima is not None else None
        if newest is None:
            return False
        watermark = self.watermarks.get(partition)
        return watermark is None or newest - self.lateness_ms > watermark

    # -- due times --------------------------------------------------------------------------
    def schedule(self, partition: int, at_ms: int, execution_id: str) -> None:
        heapq.heappush(self.index(partition), DueTime(at_ms, execution_id))

    def index(self, partition: int) -> list[DueTime]:
        heap = self.due.get(partition)
        if heap is None:
            timers = self.timers(partition)
            heap = timers.due
            heapq.heapify(heap)
            self.due[partition] = heap
            if timers.judge_first:
                self.judge_first.setdefault(partition, set()).update(timers.judge_first)
        return heap

    def release(self, partition: int, watermark_ms: int) -> Iterator[HeldEvent | Due]:
        """Every held event and every due time strictly before ``watermark_ms``, in time
        order, events first at equal times. Lazy: what the caller schedules or holds while
        applying one is seen by the next."""
        limit = watermark_ms - 1
        heap = self.index(partition)
        first = self.judge_first.pop(partition, None)
        if first:
            yield Due(limit, tuple(sorted(first)))
        pending = self.pending.get(partition)
        if pending is None:
            pending = self.pending[partition] = []
        held_by, held_offsets = self.held_by, self.held_offsets
        pop = heapq.heappop
        while True:
            next_event = pending[0].time_ms if pending else None
            if next_event is not None and next_event > limit:
                next_event = None
            next_due = heap[0].at_ms if heap else None
            if next_due is not None and next_due > limit:
                next_due = None
            if next_event is not None and (next_due is None or next_event <= next_due):
                held = pop(pending)
                where = (held.env.topic, partition)
                held_by[where] -= 1
                held_offsets[where].discard(held.offset)
                yield held
                continue
            if next_due is None:
                return
            key = pop(heap).execution_id
            if not heap or heap[0].at_ms != next_due:
                yield Due(next_due, (key,))
                continue
            keys = {key}
            while heap and heap[0].at_ms == next_due:
                keys.add(pop(heap).execution_id)
            yield Due(next_due, tuple(sorted(keys)))

    # -- stream time ------------------------------------------------------------------------
    def note_tick(self, topic: str, partition: int, at_ms: int) -> None:
        newest = self.last_tick.get((topic, partition))
        if newest is None or at_ms > newest:
            self.last_tick[(topic, partition)] = at_ms

    def place(self, env: Envelope, t_ms: int) -> int:
        """When an input event at ``t_ms`` is judged (``core.clock.placed_at``), from its own
        topic partition's time as read up to it: a fact of the log, the same for every reader
        whatever the interleaving of topics. Called before ``observe`` takes it in."""
        partition = env.partition
        maxima = self.maxima.get(partition)
        if maxima is None:
            maxima = self._maxima(partition)
        return placed_at(t_ms, maxima.get(env.topic), self.lateness_ms)  # None: not an input

    def observe(self, env: Envelope, t_ms: int) -> int | None:
        """Take an input's event time into its partition's clock; returns the new watermark
        when it moved forward (then ``release`` has work), else None."""
        topic, partition = env.topic, env.partition
        if topic not in self.rank:
            return None
        where = (topic, partition)
        trail = self.trail.get(where)
        if trail is None:
            trail = self.trail[where] = deque()
        trail.append(Read(env.offset, t_ms))
        self.clocks_dirty.add(partition)
        maxima = self.maxima.get(partition)
        if maxima is None:
            maxima = self._maxima(partition)
        newest = maxima.get(topic)
        if newest is not None and t_ms <= newest:
            return None  # not newer than its topic's maximum: nothing moves
        maxima[topic] = t_ms
        before = self.watermarks.get(partition)
        if before is None:
            if len(maxima) < len(self.input_names):
                return None
        elif newest is not None and newest - self.lateness_ms != before:
            return None  # another topic holds the minimum: it stays
        after = watermark_ms(tuple(maxima.values()), self.lateness_ms)
        if after == before:
            return None
        self.watermarks[partition] = after
        return after

    def watermark(self, partition: int) -> int | None:
        """The partition's watermark, epoch ms (None: no clock, or not every input seen)."""
        if partition not in self.maxima:
            self._maxima(partition)
        return self.watermarks.get(partition)

    def _maxima(self, partition: int) -> dict[str, int]:
        """The partition's maxima as stored (``restore``), or none yet."""
        clock = self.restore(partition)
        maxima = {} if clock is None else {topic: epoch_ms(t) for topic, t in clock.maxima}
        self.maxima[partition] = maxima
        if len(maxima) == len(self.input_names):
            self.watermarks[partition] = watermark_ms(tuple(maxima.values()), self.lateness_ms)
        return maxima

    @property
    def clocks(self) -> dict[int, PartitionClock]:
        """Each partition's clock as read so far, as ``PartitionClock``s (metrics, tests)."""
        inputs = tuple(self.input_names)
        return {
            p: PartitionClock(
                inputs=inputs, maxima=tuple(sorted((k, from_ms(v)) for k, v in m.items()))
            )
            for p, m in self.maxima.items()
        }

    def restore(self, partition: int) -> PartitionClock | None:
        """The partition's clock as stored (None: none, or for other input topics), read from
        the table once."""
        clock = self.saved.get(partition)
        if clock is None:
            stored = self.store.get(str(partition))
            if stored is not None:
                clock = PartitionClock.model_validate_json(stored)
                if set(clock.inputs) != set(self.input_names):
                    return None  # the input topics changed: start afresh
                self.saved[partition] = clock
        return clock

    # -- acknowledgements and the stored clock ----------------------------------------------
    def acknowledged(self, topic: str, partition: int, offset: int) -> None:
        """Every record of the topic partition below ``offset`` is processed and its effect
        flushed: stored with the partition's clock at the next ``flush_clocks``."""
        if topic not in self.rank:
            return
        processed = self.processed.setdefault(partition, {})
        if offset > processed.get(topic, -1):
            processed[topic] = offset
            self.clocks_dirty.add(partition)

    def processed_through(self, topic: str, partition: int) -> int | None:
        """The stored offset below which the topic partition is processed (``acknowledged``),
        from the partition's clock as last stored or restored."""
        clock = self.saved.get(partition)
        if clock is None:
            self.restore(partition)
            clock = self.saved.get(partition)
        return None if clock is None else clock.through_for(topic)

    def flush_clocks(self, partition: int | None = None) -> None:
        """Write the partition clocks that moved, as acknowledged (``acked_clock``). After the
        state's writes are delivered and before the records are acknowledged: a stored clock
        must never be ahead of the stored state it has judged, nor of the records Kafka would
        deliver again after a restart."""
        for p in sorted(self.clocks_dirty) if partition is None else [partition]:
            if p not in self.clocks_dirty:
                continue
            self.clocks_dirty.discard(p)
            if p not in self.saved:
                self.restore(p)  # the stored clock, if any, is where the acknowledged one starts
            clock = self.acked_clock(p)
            if (clock.maxima or clock.through) and clock != self.saved.get(p):
                self.store[str(p)] = clock.model_dump_json()
                self.saved[p] = clock

    def acked_clock(self, partition: int) -> PartitionClock:
        """The partition's clock over the records that will be acknowledged: per input topic,
        the newest time of the records read up to (not including) its first record still held
        for the watermark. ``AckOrder`` acknowledges each topic partition in offset order, so
        this is exactly the clock of what Kafka will not deliver again; a held record and
        everything read after it on its topic partition come again after a restart, and must
        find a watermark that has not passed them yet."""
        clock = self.saved.get(partition) or PartitionClock.start(self.input_names)
        for topic in self.input_names:
            trail = self.trail.get((topic, partition))
            if not trail:
                continue
            held = self.held_offsets.get((topic, partition))
            newest: int | None = None
            while trail and not (held and trail[0].offset in held):
                t = trail.popleft().at_ms
                if newest is None or t > newest:
                    newest = t
            if newest is not None:
                clock = clock.observe(topic, from_ms(newest))
        for topic, offset in self.processed.pop(partition, {}).items():
            clock = clock.processed_through(topic, offset)
        return clock
