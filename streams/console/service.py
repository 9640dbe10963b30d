"""The console's consumer: a thread that applies vigil's output topics to the SQLite view, and
the context the HTTP handlers answer from (``streams/console/server.py`` runs both).

The consumer does not join a group: it assigns itself every partition of the six topics and
seeks to the positions stored in the view (the truth: they commit with the rows), so every
replica reads everything and keeps its own complete view, and any number of consoles can run
behind a load balancer without a shared database. The group id ``<app_id>-console`` only
carries committed positions so that ordinary Kafka tooling can show the console's lag.

On an empty view (first start, or the file deleted) the compacted state topics are read from
the beginning and the others from ``VIGIL_CONSOLE_ALERTS_SINCE`` before each partition's newest
record (record timestamps are event times).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from streams.console.settings import ConsoleSettings
from streams.console.view import Change, ConsoleView, Incoming
from streams.kafka.topics import Topics
from streams.settings import Settings

if TYPE_CHECKING:
    from confluent_kafka import Consumer

    from streams.contracts.codec import AvroCodec
    from streams.kafka.clients import RecordProducer

log = logging.getLogger("vigil.console")
T = TypeVar("T")

#: Records applied per SQLite transaction at most.
BATCH = 2000
#: How often the log end offsets are asked of the broker for the lag.
WATERMARK_INTERVAL = 2.0
#: reads of the log ends kept for freshness: about a minute at WATERMARK_INTERVAL
FRESHNESS_CHECKS = 32


class EndsCheck(NamedTuple):
    """The log end of every partition, read at wall-clock ``at`` (seconds)."""

    at: float
    ends: dict[tuple[str, int], int]


def fresh_as_of(checks: Iterable[EndsCheck], positions: dict[tuple[str, int], int]) -> float | None:
    """When the view was last known complete: the newest read of the log ends that the view's
    positions have all reached (it holds every record the topics held then). None when it
    reached none of those kept (still catching up, or no end read yet).

    This is the view's freshness, in wall-clock time, where the newest record's event time
    is not: on a quiet fleet that stands still while the view stays complete."""
    newest = None
    for check in checks:
        if all(positions.get(tp, 0) >= end for tp, end in check.ends.items()):
            newest = check.at if newest is None else max(newest, check.at)
    return newest


#: How often the records applied are logged (while there are any).
REPORT_INTERVAL = 5.0


def console_topics(topics: Topics) -> tuple[tuple[str, bool], ...]:
    """(name, compacted) of the topics the console reads."""
    specs = (
        topics.execution_state,
        topics.operation_state,
        topics.approval_verdicts,
        topics.reconciliation_work,
        topics.alerts,
        topics.reconciliation_checks,
    )
    return tuple((s.name, s.cleanup_policy == "compact") for s in specs)


# --------------------------------------------------------------------------------------------
# Change hub
# --------------------------------------------------------------------------------------------


class ChangeHub:
    """Fans the changes of each applied transaction out to subscribers (the page's SSE).

    ``publish`` may be called from any thread; delivery happens on the event loop the hub was
    bound to. Each subscriber has a bounded queue: one that does not keep up is dropped (its
    iterator ends) rather than slowing the consumer or growing memory.
    """

    def __init__(self, queue_size: int = 256) -> None:
        self.queue_size = queue_size
        self._subscribers: set[asyncio.Queue[list[Change] | None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def publish(self, changes: list[Change]) -> None:
        if not changes:
            return
        loop = self._loop
        if loop is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._deliver(changes)
        else:
            with contextlib.suppress(RuntimeError):  # the loop is closing
                loop.call_soon_threadsafe(self._deliver, changes)

    def _deliver(self, changes: list[Change]) -> None:
        for q in list(self._subscribers):
            try:
                q.put_nowait(changes)
            except asyncio.QueueFull:
                self._subscribers.discard(q)
                q.get_nowait()  # make room for the end marker
                q.put_nowait(None)

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    async def subscribe(self) -> AsyncIterator[list[Change]]:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        q: asyncio.Queue[list[Change] | None] = asyncio.Queue(self.queue_size)
        self._subscribers.add(q)
        try:
            while True:
                item = await q.get()
                if item is None:
                    return  # dropped: too slow
                yield item
        finally:
            self._subscribers.discard(q)


# --------------------------------------------------------------------------------------------
# Consumer thread
# --------------------------------------------------------------------------------------------


@dataclass
class ConsumerStatus:
    """What the consumer thread tells the HTTP side: log end offsets and liveness."""

    log_end: dict[tuple[str, int], int] = field(default_factory=dict)
    started: bool = False
    beat: float = 0.0
    error: str | None = None
    thread: threading.Thread | None = None
    #: the latest reads of every log end: (wall-clock seconds, the ends then), oldest first
    checks: deque[EndsCheck] = field(default_factory=lambda: deque(maxlen=FRESHNESS_CHECKS))

    def note_ends(self, at: float) -> None:
        """Every partition's end was just read (at wall-clock ``at``): kept for freshness."""
        if self.log_end and all(end >= 0 for end in self.log_end.values()):
            self.checks.append(EndsCheck(at, dict(self.log_end)))

    def fresh_at(self, positions: dict[tuple[str, int], int]) -> float | None:
        """The view's freshness (``fresh_as_of``) over the latest reads of the log ends."""
        return fresh_as_of(self.checks, positions)

    def alive(self, stale_after: float = 30.0) -> bool:
        return (
            self.thread is not None
            and self.thread.is_alive()
            and self.started
            and time.monotonic() - self.beat < stale_after
        )

    def lag(self, positions: dict[tuple[str, int], int]) -> list[dict[str, Any]]:
        out = []
        for (topic, p), end in sorted(self.log_end.items()):
            applied = positions.get((topic, p))
            out.append(
                {
                    "topic": topic,
                    "partition": p,
                    "applied": applied,
                    "log_end": end,
                    "lag": max(0, end - (applied if applied is not None else 0))
                    if end >= 0
                    else None,
                }
            )
        return out


class ConsoleConsumer:
    """Reads the five output topics into the view until stopped."""

    def __init__(
        self,
        settings: Settings,
        console: ConsoleSettings,
        view: ConsoleView,
        hub: ChangeHub,
        codec: AvroCodec,
        status: ConsumerStatus,
    ) -> None:
        self.settings = settings
        self.console = console
        self.view = view
        self.hub = hub
        self.codec = codec
        self.status = status
        self.stop = threading.Event()
        self.topics = console_topics(Topics.from_settings(settings))

    def _consumer(self) -> Consumer:
        from confluent_kafka import Consumer

        conf = self.settings.confluent_conf() | {
            "group.id": f"{self.settings.app_id}-console",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
        }
        return Consumer(conf)

    def _partitions(self, c: Consumer) -> dict[str, list[int]]:
        """The partitions of every console topic, waiting for topics not created yet."""
        names = [t for t, _ in self.topics]
        while not self.stop.is_set():
            meta = c.list_topics(timeout=10)
            missing = [t for t in names if t not in meta.topics or meta.topics[t].error]
            if not missing:
                return {t: sorted(meta.topics[t].partitions) for t in names}
            log.warning("waiting for topics %s", ", ".join(missing))
            self.stop.wait(2.0)
        return {}

    def _start_offsets(self, c: Consumer, parts: dict[str, list[int]]) -> list[Any]:
        """Stored positions; on an empty view, the beginning of compacted topics and the time
        window of the others."""
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        stored = self.view.positions()
        compacted = dict(self.topics)
        out: list[TopicPartition] = []
        windowed: list[TopicPartition] = []
        for topic, ps in parts.items():
            for p in ps:
                if (topic, p) in stored:
                    out.append(TopicPartition(topic, p, stored[(topic, p)]))
                elif compacted[topic] or self.console.alerts_since is None:
                    out.append(TopicPartition(topic, p, OFFSET_BEGINNING))
                else:
                    windowed.append(TopicPartition(topic, p))
        if windowed:
            out += self._window_starts(c, windowed, self.console.alerts_since)
        return out

    def _window_starts(self, c: Consumer, tps: list[Any], since: timedelta | None) -> list[Any]:
        """The first offset of each partition whose timestamp is within ``since`` of the
        partition's newest record."""
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        assert since is not None
        newest: dict[tuple[str, int], int] = {}
        peek = []
        ends: dict[tuple[str, int], int] = {}
        for tp in tps:
            low, high = c.get_watermark_offsets(tp, timeout=10, cached=False)
            ends[(tp.topic, tp.partition)] = high
            if high > low:
                peek.append(TopicPartition(tp.topic, tp.partition, high - 1))
        if peek:
            c.assign(peek)
            deadline = time.monotonic() + 15
            while len(newest) < len(peek) and time.monotonic() < deadline:
                msg = c.poll(0.5)
                if msg is None or msg.error():
                    continue
                newest[(msg.topic(), msg.partition())] = msg.timestamp()[1]
            c.unassign()
        span = int(since.total_seconds() * 1000)
        query = [TopicPartition(t, p, ts - span) for (t, p), ts in newest.items() if ts is not None]
        found = {
            (tp.topic, tp.partition): tp.offset
            for tp in (c.offsets_for_times(query, timeout=10) if query else [])
        }
        out = []
        for tp in tps:
            key = (tp.topic, tp.partition)
            offset = found.get(key)
            if offset is None or offset < 0:
                # empty partition, or no timestamp known: from the beginning
                offset = OFFSET_BEGINNING if key not in newest else ends[key]
            out.append(TopicPartition(tp.topic, tp.partition, offset))
        return out

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # the thread dies: /healthz says so
            log.exception("console consumer stopped")
            self.status.error = f"{type(exc).__name__}: {exc}"
            raise

    def _run(self) -> None:
        from confluent_kafka import KafkaError, TopicPartition

        from streams.contracts.codec import DecodeError, RegistryUnavailable

        c = self._consumer()
        try:
            parts = self._partitions(c)
            if not parts:
                return
            starts = self._retrying("finding start offsets", lambda: self._start_offsets(c, parts))
            if starts is None:
                return
            c.assign(starts)
            self.status.log_end = {(t, p): -1 for t, ps in parts.items() for p in ps}
            threading.Thread(target=self._watch_ends, name="console-log-ends", daemon=True).start()
            self.status.started = True
            self.status.beat = time.monotonic()
            last_report = time.monotonic()
            applied = 0
            log.info(
                "console consumer assigned %d partitions (%s view)",
                len(starts),
                "empty" if self.view.is_empty() else "stored",
            )
            while not self.stop.is_set():
                msgs = c.consume(BATCH, 0.2)
                self.status.beat = time.monotonic()
                batch: list[Incoming] = []
                for m in msgs:
                    err = m.error()
                    if err is not None:
                        if err.code() != KafkaError._PARTITION_EOF:
                            log.warning("consumer error: %s", err)
                        continue
                    try:
                        rec = self.codec.decode(m.topic(), m.value())
                    except DecodeError as exc:
                        log.warning(
                            "skipped %s/%d@%d: %s", m.topic(), m.partition(), m.offset(), exc
                        )
                        rec = None
                    except RegistryUnavailable as exc:
                        log.warning("schema registry unavailable (%s); reading again", exc)
                        self._rewind(c, msgs)
                        batch = []
                        self.stop.wait(1.0)
                        break
                    batch.append(Incoming(m.topic(), m.partition(), m.offset(), rec))
                if batch:
                    applied += len(batch)
                    changes = self.view.apply(batch)
                    self.hub.publish(changes)
                    self._commit(c, batch, TopicPartition)
                now = time.monotonic()
                if applied and now - last_report > REPORT_INTERVAL:
                    log.info(
                        "applied %d records in %.1f s (%.0f/s)",
                        applied,
                        now - last_report,
                        applied / (now - last_report),
                    )
                    applied, last_report = 0, now
        finally:
            c.close()

    def _retrying(self, what: str, call: Callable[[], T]) -> T | None:
        """``call()`` until it succeeds or the consumer is stopped: right after topics are
        created a partition may have no leader yet, and a broker may be restarting."""
        from confluent_kafka import KafkaException

        delay = 0.2
        while not self.stop.is_set():
            try:
                return call()
            except KafkaException as exc:
                log.warning("%s: %s; again in %.1f s", what, exc, delay)
                self.stop.wait(delay)
                delay = min(delay * 2, 5.0)
        return None

    def _rewind(self, c: Consumer, msgs: Sequence[Any]) -> None:
        from confluent_kafka import TopicPartition

        first: dict[tuple[str, int], int] = {}
        for m in msgs:
            if m.error() is None:
                first.setdefault((m.topic(), m.partition()), m.offset())
        for (t, p), o in first.items():
            c.seek(TopicPartition(t, p, o))

    def _commit(self, c: Consumer, batch: list[Incoming], tp: Any) -> None:
        """Positions for Kafka tooling only (the view's own positions are the truth)."""
        last: dict[tuple[str, int], int] = {}
        for i in batch:
            last[(i.topic, i.partition)] = i.offset + 1
        with contextlib.suppress(Exception):
            c.commit(offsets=[tp(t, p, o) for (t, p), o in last.items()], asynchronous=True)

    def _watch_ends(self) -> None:
        """The log end offsets for the lag, asked of the broker every few seconds by a
        consumer of its own, so that a slow answer never holds up applying records."""
        from confluent_kafka import TopicPartition

        c = self._consumer()
        try:
            while True:
                # read before the ends: a record on the topics at this instant is below them
                checked = time.time()
                for t, p in list(self.status.log_end):
                    try:
                        _, high = c.get_watermark_offsets(
                            TopicPartition(t, p), timeout=5, cached=False
                        )
                    except Exception:  # unreachable or no leader yet: keep the last value
                        continue
                    self.status.log_end[(t, p)] = high
                self.status.note_ends(checked)
                if self.stop.wait(WATERMARK_INTERVAL):
                    return
        finally:
            c.close()


# --------------------------------------------------------------------------------------------
# The context handed to the HTTP modules, and the process
# --------------------------------------------------------------------------------------------


@dataclass
class ConsoleContext:
    """Everything an HTTP module of the console needs (api, page, review)."""

    view: ConsoleView
    settings: Settings
    hub: ChangeHub
    read_token: str | None
    write_token: str | None
    #: a producer for the input topics (manual review); created on first use
    producer_factory: Callable[[], RecordProducer]
    console: ConsoleSettings = field(default_factory=ConsoleSettings)
    status: ConsumerStatus = field(default_factory=ConsumerStatus)
    topics: Topics | None = None

    def lag(self) -> list[dict[str, Any]]:
        return self.status.lag(self.view.positions())

    def fresh_at(self) -> str | None:
        """The view's freshness as ISO-8601 (``fresh_as_of``), None while not known."""
        from datetime import UTC, datetime

        at = self.status.fresh_at(self.view.positions())
        if at is None:
            return None
        return (
            datetime.fromtimestamp(at, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z")
        )

    def total_lag(self) -> int | None:
        rows = self.lag()
        if not rows or any(r["lag"] is None for r in rows):
            return None
        return sum(r["lag"] for r in rows)
