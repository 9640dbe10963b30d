"""Stream time of one partition.

vigil never reads a clock to decide. Time moves only when records arrive: input events carry the
time they happened, and a ticker writes clock ticks (wall-clock time as *data*) into every
partition of every input topic, so a quiet partition still advances and a replay of the log
sees the very same ticks.

A worker consumes several co-partitioned input topics, and Kafka gives no order between them:
live, one topic may run ahead of another; in a backfill, one may be read entirely before the
other. The per-partition clock therefore keeps, for each input topic, the largest event time
seen there (ticks included), and its **watermark is the minimum over the input topics** — it
does not exist until every input topic has been seen on the partition.

Why the minimum: a decision at time T (a reply deadline, a grace period, a stale heartbeat) is
only taken once *every* input of the partition has gone past T. If each topic partition is in
time order, every event at or before T has then been seen, whichever topic it came from and
whatever the interleaving, so the live run and any replay take the same decision on the same
evidence. Taking the maximum instead would let a fast topic fire a timeout while the answer
that prevents it is still waiting, unread, on a slower topic.

That argument needs each topic partition in time order, and a producer may write an event
after newer records of its topic partition (a reply sent minutes after the ticks that passed
its deadline). Whether such an event is *late* must not depend on how far the worker has read
the *other* topics, or a replay, reading them at another pace, would judge it otherwise. So
lateness is measured against the event's own topic partition, which every reader reads in the
same order: its **topic time** is the largest event time written before it there (ticks
included), a fact of the log. An event more than the allowed lateness behind its topic time is
late, and is placed at that topic time minus the lateness (``placed_at``); the watermark is the
minimum of the topic times minus the lateness (``watermark_ms``). Every event is then placed no
earlier than the watermark as it is read, whatever the interleaving, so the held events and
the deadlines between them are processed in one order in every run and every replay.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from operator import itemgetter

from pydantic import AwareDatetime, BaseModel, ConfigDict, field_validator, model_validator

from streams.contracts.models.base import construct

_time = itemgetter(1)


def placed_at(event_ms: int, topic_time_ms: int | None, lateness_ms: int) -> int:
    """The instant (epoch ms) at which an event is judged, from facts of its own topic
    partition: its event time, unless that is more than ``lateness_ms`` behind the topic time
    (the largest event time written before it on the same topic partition, None for the
    first record), in which case it is late and judged at the topic time minus the lateness.

    Why the topic time and not the watermark: the watermark depends on how far the other
    topics have been read, which differs between a live run and a replay; the records before
    an event on its own topic partition are the same for every reader. Why not rewrite the
    past instead: decisions the event could have changed (a reply deadline, a grace period)
    may have been published already; a late event is applied as a fact, after them.
    """
    if topic_time_ms is None:
        return event_ms
    floor = topic_time_ms - lateness_ms
    return event_ms if event_ms >= floor else floor


def watermark_ms(topic_times: list[int] | tuple[int, ...], lateness_ms: int) -> int:
    """The partition's watermark from its topics' times: their minimum, minus the lateness.

    An event is never placed before its own topic's time minus the lateness, so no event read
    later can be placed before this instant: what lies strictly before it can be decided."""
    return min(topic_times) - lateness_ms


class PartitionClock(BaseModel):
    """The stream time of one partition, as an immutable value the shell replaces on every record.

    ``inputs`` is the configured set of input topics of the partition; ``maxima`` holds, per
    topic seen so far, the largest event time seen on it (sorted by topic, so equal clocks
    compare and serialise equal). It is JSON-serialisable so the shell may keep it in a table.

    ``through`` holds, per input topic, the offset below which every record of the topic
    partition has been processed and its effect stored: a durable floor for the worker that
    reads the partition next, whatever offset the consumer group happens to have committed.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    inputs: tuple[str, ...]
    maxima: tuple[tuple[str, AwareDatetime], ...] = ()
    through: tuple[tuple[str, int], ...] = ()

    @field_validator("inputs")
    @classmethod
    def _inputs(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("a partition clock needs at least one input topic")
        return tuple(sorted(set(value)))

    @model_validator(mode="after")
    def _maxima(self) -> PartitionClock:
        topics = [topic for topic, _ in self.maxima]
        if topics != sorted(set(topics)) or not set(topics) <= set(self.inputs):
            raise ValueError("maxima must be sorted, unique, and only for input topics")
        return self

    @classmethod
    def start(cls, inputs: tuple[str, ...] | list[str] | frozenset[str]) -> PartitionClock:
        """A clock that has seen nothing yet."""
        return cls(inputs=tuple(inputs))

    def max_for(self, topic: str) -> datetime | None:
        """The largest event time seen on ``topic`` (None if nothing yet)."""
        for seen, t in self.maxima:  # a handful of topics: a scan beats building a dict
            if seen == topic:
                return t
        return None

    def observe(self, topic: str, t: datetime) -> PartitionClock:
        """The clock after a record of ``topic`` with event time ``t`` (a tick or an event).

        Never goes backwards: an older ``t`` returns this very clock. A topic outside the
        configured inputs is a wiring error of the shell and raises ``ValueError``.
        """
        if topic not in self.inputs:
            raise ValueError(f"{topic!r} is not an input topic of this clock {self.inputs}")
        if t.tzinfo is None:
            raise ValueError("event times must be timezone-aware")
        current = self.max_for(topic)
        if current is not None and t <= current:
            return self
        maxima = dict(self.maxima)
        maxima[topic] = t
        # Built without re-validation (once per record on the hot path): the invariants hold
        # by construction, inputs unchanged and maxima sorted, unique and within the inputs.
        return construct(
            PartitionClock,
            {
                "inputs": self.inputs,
                "maxima": tuple(sorted(maxima.items())),
                "through": self.through,
            },
        )

    def through_for(self, topic: str) -> int | None:
        """The offset below which ``topic``'s records of this partition are all processed."""
        for seen, offset in self.through:
            if seen == topic:
                return offset
        return None

    def processed_through(self, topic: str, offset: int) -> PartitionClock:
        """The clock with ``topic`` processed below ``offset`` (never lowered)."""
        if topic not in self.inputs:
            raise ValueError(f"{topic!r} is not an input topic of this clock {self.inputs}")
        current = self.through_for(topic)
        if current is not None and offset <= current:
            return self
        through = dict(self.through)
        through[topic] = offset
        return construct(
            PartitionClock,
            {
                "inputs": self.inputs,
                "maxima": self.maxima,
                "through": tuple(sorted(through.items())),
            },
        )

    @property
    def watermark(self) -> datetime | None:
        """Minimum over the input topics of their largest event time; None until all are seen."""
        if len(self.maxima) < len(self.inputs):
            return None
        return min(self.maxima, key=_time)[1]

    @property
    def stream_time(self) -> datetime | None:
        """The largest event time seen on the partition, any topic: informative only (metrics,
        the read side). Decisions use ``watermark``."""
        return max(self.maxima, key=_time)[1] if self.maxima else None

    def has_passed(self, t: datetime) -> bool:
        """Whether a decision due at ``t`` may be taken now: every input has gone *past* ``t``.

        Strictly past, so that evidence stamped exactly ``t`` on a slower topic (an answer that
        arrived right at its deadline) is seen before the deadline is judged.
        """
        watermark = self.watermark
        return watermark is not None and watermark > t

    def placed_at(self, topic: str, t: datetime, lateness: timedelta) -> datetime:
        """When an event of ``topic`` at ``t``, read now, is judged (``placed_at``): ``t``,
        or its topic time minus ``lateness`` when it is further behind than that."""
        topic_time = self.max_for(topic)
        if topic_time is None or t >= topic_time - lateness:
            return t
        return topic_time - lateness

    def is_late(self, t: datetime) -> bool:
        """Whether an event at ``t`` is behind the watermark (``t < watermark``), i.e. a
        decision it mattered to may have been taken. The shell never lets an event be judged
        behind the watermark: it places it (``placed_at``) first. Before the watermark exists
        nothing is behind it.
        """
        watermark = self.watermark
        return watermark is not None and t < watermark
