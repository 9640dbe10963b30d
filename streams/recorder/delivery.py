"""The recorder's delivery thread: facts from the agent's calls to the broker, in order, never
waiting the agent, never dropping one.

The agent's thread only validates a fact and puts it in an in-process queue (the inbox). This
thread takes it from there, encodes it (the registry is asked here, never on the agent's
thread) and hands it to a confluent-kafka ``Producer`` with its own queue, which retries while
the broker is away (``message.timeout.ms`` 0: it never gives a fact up on a timer). Two modes:

- **direct**: facts go to the producer as they come. When the producer's queue is full, or
  the oldest fact not yet delivered has waited ``spool_after``, or the registry cannot be
  asked, the thread switches to spooling: it takes back from the producer every fact not yet
  sent (``purge`` of its queue; their delivery reports return them), keeps them first in line
  (``head``), and from then on appends every new fact to the spool file (``spool.py``).
- **spooling**: new facts go to the file. Once nothing is left in the producer, the thread
  replays: the head first, then the file from its cursor, one batch at a time; a batch that is
  not delivered within ``spool_after`` is taken back again and tried later, with a backoff.
  When the head and the file are delivered and nothing is pending, the file is emptied and the
  thread is direct again.

Order per execution: every fact is handed to the producer only once every older fact is
either delivered or back in line before it (head, then file), and the producer keeps the order
of one partition (idempotent, so its retries do not reorder or duplicate). A fact taken back
while it was in flight may have reached the broker; it is then sent again with the same event
id, which the worker reads as one fact.

Facts the broker refuses for good (too large, invalid) are not retried: each is written to
``<spool>.rejected`` and logged as an error, and counted. A producer that fails for good (a
fatal error of the idempotent producer) is replaced, and every fact it held is back in line.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, Producer

from streams.contracts.codec import AvroCodec, RegistryUnavailable
from streams.contracts.models.base import Record
from streams.engine.emission import record_time_ms
from streams.recorder.spool import Spool, line_of

log = logging.getLogger("vigil.recorder")

#: errors that no retry can cure: the fact is written to the rejected file
PERMANENT = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.INVALID_MSG_SIZE,
        KafkaError.INVALID_MSG,
        KafkaError.INVALID_RECORD,
    }
)


@dataclass(slots=True)
class Fact:
    """One recorded fact on its way: ``n`` orders the recorder's facts."""

    n: int
    topic: str
    record: Record


@dataclass(slots=True)
class Counts:
    """What the recorder did, since it started."""

    recorded: int = 0
    delivered: int = 0
    #: facts written to the spool file (or taken back into line) because the broker could not
    #: take them
    spooled: int = 0
    #: spooled facts delivered later
    replayed: int = 0
    rejected: int = 0
    #: times the recorder started spooling
    outages: int = 0


@dataclass(slots=True)
class _Pending:
    fact: Fact
    since: float
    #: where it came from: "direct", "head", or "file" (then ``end`` is its line's end offset)
    origin: str
    end: int = 0
    #: the producer's handle of this send (facts read from an earlier run's spool may share
    #: an ``n`` with this run's)
    token: int = -1


@dataclass(slots=True)
class _Batch:
    """A replay batch in the producer: its entries in order and their results."""

    entries: list[_Pending] = field(default_factory=list)
    results: dict[int, bool] = field(default_factory=dict)

    def done(self) -> bool:
        return len(self.results) == len(self.entries)


class Delivery:
    """The delivery thread of one recorder (see the module's docstring)."""

    def __init__(
        self,
        producer_conf: dict[str, Any],
        codec: AvroCodec,
        spool_path: Path,
        *,
        spool_after: float = 5.0,
        replay_batch: int = 500,
        retry_max: float = 5.0,
        fsync_interval: float = 1.0,
        producer_factory: Callable[[dict[str, Any]], Producer] = Producer,
    ) -> None:
        self.producer_conf = producer_conf
        self.codec = codec
        self.spool_after = spool_after
        self.replay_batch = replay_batch
        self.retry_max = retry_max
        self.counts = Counts()
        self.inbox: queue.SimpleQueue[Fact | None] = queue.SimpleQueue()
        self._factory = producer_factory
        self._producer = producer_factory(producer_conf)
        self.spool = Spool(spool_path, fsync_interval)
        self._pending: dict[int, _Pending] = {}
        self._tokens = itertools.count()
        self._head: list[Fact] = []
        self._skip: set[int] = set()
        self._batch: _Batch | None = None
        #: while a take-back collects the facts the producer gives back (else None)
        self._collect: list[Fact] | None = None
        #: a delivery report that starts spooling, acted on after the poll that gave it
        self._spool_because: str | None = None
        self._next_replay = 0.0
        self._failures = 0
        self._outage_since: float | None = None
        self.spooling = self.spool.backlog > 0
        if self.spooling:
            log.warning(
                "recorder spool %s holds %d facts from an earlier run: they are sent first, "
                "in order",
                spool_path,
                self.spool.backlog,
            )
            self._outage_since = time.monotonic()
        self._idle = threading.Condition()
        self._queued = 0  # facts in the inbox, not yet taken (under _idle)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vigil-recorder", daemon=True)
        self._thread.start()

    # -- the agent's side ---------------------------------------------------------------
    def put(self, fact: Fact) -> None:
        with self._idle:
            self._queued += 1
        self.inbox.put(fact)

    def backlog(self) -> int:
        """Facts recorded and not yet delivered: queued, in the producer, or spooled."""
        with self._idle:
            queued = self._queued
        in_line = len(self._head) + self.spool.backlog
        direct = sum(1 for p in list(self._pending.values()) if p.origin == "direct")
        return queued + in_line + direct

    def flush(self, timeout: float) -> int:
        """Wait until every fact recorded so far is delivered, at most ``timeout`` seconds;
        the number not delivered (still queued, pending or spooled, none lost)."""
        deadline = time.monotonic() + timeout
        self._next_replay = 0.0  # try the broker now, whatever the backoff said
        with self._idle:
            while True:
                left = self.backlog_locked()
                remaining = deadline - time.monotonic()
                # done once nothing is left and the spool is emptied (its last batch settled)
                caught_up = left == 0 and not self.spooling
                if caught_up or remaining <= 0 or not self._thread.is_alive():
                    return left
                self._idle.wait(min(remaining, 0.05))

    def backlog_locked(self) -> int:
        in_line = len(self._head) + self.spool.backlog + len(self._collect or ())
        return self._queued + in_line + len(self._pending)

    def close(self, timeout: float) -> int:
        """Flush for ``timeout``, stop the thread, and write whatever is still undelivered to
        the spool, oldest first: a recorder started on it later sends it. The number left."""
        left = self.flush(timeout)
        self._stop.set()
        self.inbox.put(None)
        self._thread.join(timeout + 5)
        # once the thread has ended, everything undelivered is in the spool: count it there
        return left if self._thread.is_alive() else self.spool.backlog

    # -- the thread -----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._step()
        except Exception:  # a bug here must not lose facts silently: say it, keep them
            log.exception("recorder delivery thread failed; undelivered facts are spooled")
        finally:
            self._shutdown()

    def _step(self) -> None:
        took = self._take(timeout=0.02 if not self._pending else 0.005)
        self._producer.poll(0)
        if self._spool_because is not None:
            why, self._spool_because = self._spool_because, None
            self._start_spooling(why)
        now = time.monotonic()
        if self._pending:
            # insertion order is age order (a take-back restamps them all alike)
            oldest = next(iter(self._pending.values())).since
            if now - oldest >= self.spool_after:
                self._take_back(now)
        if self.spooling and not self._pending and now >= self._next_replay:
            self._replay(now)
        self.spool.sync()
        if took or not self._pending:
            with self._idle:
                self._idle.notify_all()

    def _take(self, timeout: float) -> int:
        """Facts from the inbox, to the producer or the spool."""
        took = 0
        try:
            fact = self.inbox.get(timeout=timeout)
        except queue.Empty:
            return 0
        while fact is not None:
            self._place(fact)
            with self._idle:  # counted in one place at a time (the spool or the producer now)
                self._queued -= 1
            took += 1
            if took >= 10_000:
                break
            try:
                fact = self.inbox.get_nowait()
            except queue.Empty:
                break
        return took

    def _place(self, fact: Fact) -> None:
        if not self.spooling:
            if self._produce(_Pending(fact, time.monotonic(), "direct")):
                return
            self._start_spooling("the producer's queue is full or the registry did not answer")
        self.spool.append(fact.n, fact.topic, fact.record)
        self.counts.spooled += 1

    def _produce(self, entry: _Pending) -> bool:
        """Hand one fact to the producer; False if it cannot take it now (queue full, the
        registry unavailable)."""
        fact = entry.fact
        record = fact.record
        try:
            value = self.codec.encode(fact.topic, record)
        except RegistryUnavailable as exc:
            if not self.spooling:  # once per outage: the spooling line follows
                log.warning("recorder: schema registry unavailable (%s); facts are spooled", exc)
            return False
        key = record.kafka_key()
        token = entry.token = next(self._tokens)
        try:
            self._producer.produce(
                fact.topic,
                key=key.encode() if key is not None else None,
                value=value,
                timestamp=record_time_ms(record) or 0,
                on_delivery=lambda err, msg, t=token: self._reported(t, err),
            )
        except BufferError:
            return False
        self._pending[token] = entry
        return True

    def _reported(self, token: int, err: KafkaError | None) -> None:
        entry = self._pending.pop(token, None)
        if entry is None:
            return
        ok = err is None
        if err is not None and err.code() in PERMANENT:
            self._reject(entry.fact, err)
            ok = True  # settled: not retried, not lost (written to the rejected file)
        elif err is not None and err.fatal():
            self._replace_producer(err)
        if err is None:
            self.counts.delivered += 1
            if entry.origin != "direct":
                self.counts.replayed += 1
        if self._batch is not None and entry.origin != "direct":
            self._batch.results[token] = ok
            if self._batch.done():
                self._settle_batch()
            return
        if not ok:  # a direct fact the producer gave back (purged): back in line
            if self._collect is not None:
                self._collect.append(entry.fact)
                return
            self._head.append(entry.fact)
            self._head.sort(key=lambda f: f.n)
            self.counts.spooled += 1
            if not self.spooling:
                # after this poll, not inside its callback: the take-back polls itself
                self._spool_because = f"delivery failed: {err}"
                self.spooling = True

    def _replace_producer(self, err: KafkaError) -> None:
        """The producer failed for good (an idempotent producer's fatal error): a new one
        takes over, and every fact the old one held is back in line (what was in flight
        may have reached the broker too: sent again, one event id). The old producer is
        not polled again, so none of its reports is read twice."""
        log.error("recorder: the producer failed for good (%s); starting a new one", err)
        old, self._producer = self._producer, self._factory(self.producer_conf)
        with contextlib.suppress(Exception):  # let it go without waiting on what it holds
            old.purge(in_queue=True, in_flight=False, blocking=False)
        stranded = [p.fact for p in self._pending.values() if p.origin == "direct"]
        self._pending.clear()
        self._batch = None  # its facts are still in the head or the file
        if stranded:
            self._head = sorted([*self._head, *stranded], key=lambda f: f.n)
            self.counts.spooled += len(stranded)
        if not self.spooling:
            self.spooling = True
            self.counts.outages += 1
            self._outage_since = time.monotonic()
        self._next_replay = 0.0

    def _reject(self, fact: Fact, err: KafkaError) -> None:
        self.counts.rejected += 1
        path = self.spool.path.with_name(self.spool.path.name + ".rejected")
        with open(path, "ab") as f:
            f.write(line_of(fact.n, fact.topic, fact.record))
        log.error(
            "recorder: the broker refused %s %s for good (%s); it is kept in %s",
            fact.record.avro_name,
            getattr(fact.record, "event_id", ""),
            err,
            path,
        )

    def _start_spooling(self, why: str) -> None:
        self.spooling = True
        self.counts.outages += 1
        self._outage_since = time.monotonic()
        self._next_replay = time.monotonic() + self._backoff()
        log.warning(
            "recorder: %s; spooling facts to %s, to be sent in order when the broker answers",
            why,
            self.spool.path,
        )
        self._take_back(time.monotonic())

    def _take_back(self, now: float) -> None:
        """Take the facts the producer has not sent yet back into line (their reports come
        with ``_PURGE_QUEUE``), then wait before trying again."""
        if not self.spooling:
            self._start_spooling(f"no delivery for {self.spool_after:.1f} s")
            return
        self._collect = []
        try:
            self._producer.purge(in_queue=True, in_flight=False, blocking=True)
            self._producer.poll(0)
        finally:
            back, self._collect = sorted(self._collect, key=lambda f: f.n), None
        if back:
            self.counts.spooled += len(back)
            if not self._head and self.spool.drained():
                # the oldest facts there are, and the file holds nothing: they open it
                for fact in back:
                    self.spool.append(fact.n, fact.topic, fact.record)
            else:
                # facts older than the file's (they were in flight when it began): first
                self._head = sorted([*self._head, *back], key=lambda f: f.n)
        for entry in self._pending.values():
            entry.since = now  # in flight: give them another period before asking again
        self._failures += 1
        self._next_replay = now + self._backoff()

    def _backoff(self) -> float:
        return min(self.retry_max, 0.25 * 2 ** min(self._failures, 16))

    def _replay(self, now: float) -> None:
        """One batch of the facts in line: the head first, then the file from its cursor."""
        batch = _Batch()
        self._batch = batch
        refused = False
        for fact in list(self._head[: self.replay_batch]):
            entry = _Pending(fact, now, "head")
            if not self._produce(entry):
                refused = True
                break
            batch.entries.append(entry)
        if not refused:
            room = self.replay_batch - len(batch.entries)
            for s in self.spool.read(self.spool.cursor, room) if room > 0 else ():
                if s.end in self._skip:
                    continue
                entry = _Pending(Fact(s.n, s.topic, s.record), now, "file", s.end)
                if not self._produce(entry):
                    refused = True
                    break
                batch.entries.append(entry)
        if not batch.entries:
            self._batch = None
            if (
                not refused
                and not self._head
                and all(s.end in self._skip for s in self.spool.read(self.spool.cursor))
            ):
                # what is left in the file is delivered already, or unreadable (rejected)
                self.spool.advance(self.spool.size(), self.spool.backlog)
                self._skip.clear()
            if not self._head and self.spool.drained():
                self._recovered()
            else:
                self._failures += 1
                self._next_replay = now + self._backoff()
            return
        self._producer.poll(0)

    def _settle_batch(self) -> None:
        batch, self._batch = self._batch, None
        assert batch is not None
        advanced_to: int | None = None
        delivered_file = 0
        gap = False
        delivered_head = set()
        for entry in batch.entries:
            ok = batch.results.get(entry.token, False)
            if entry.origin == "head":
                if ok:
                    delivered_head.add(entry.fact.n)
                else:
                    gap = True
                continue
            if ok and not gap:
                advanced_to = entry.end
                delivered_file += 1
            elif ok:
                self._skip.add(entry.end)
            else:
                gap = True
        if delivered_head:
            self._head = [f for f in self._head if f.n not in delivered_head]
        if advanced_to is not None:
            self._skip = {e for e in self._skip if e > advanced_to}
            self.spool.advance(advanced_to, delivered_file)
        if gap:
            self._failures += 1
            self._next_replay = time.monotonic() + self._backoff()
        else:
            self._failures = 0
            self._next_replay = 0.0
            if not self._head and self.spool.drained():
                self._recovered()

    def _recovered(self) -> None:
        lasted = time.monotonic() - (self._outage_since or time.monotonic())
        log.warning(
            "recorder: the broker answers again; every spooled fact is delivered, in order "
            "(%d so far, outage of %.1f s); sending directly again",
            self.counts.replayed,
            lasted,
        )
        self.spool.reset()
        self._skip.clear()
        self.spooling = False
        self._outage_since = None
        self._failures = 0

    def _shutdown(self) -> None:
        """The thread's end: whatever is not delivered goes to the spool, oldest first."""
        # what the agent recorded last, behind everything else
        late: list[Fact] = []
        while True:
            try:
                fact = self.inbox.get_nowait()
            except queue.Empty:
                break
            if fact is not None:
                late.append(fact)
        if self._pending:
            # only what is not sent yet: librdkafka's idempotent producer cannot purge what
            # is in flight. That is kept from the recorder's own copy below, and may reach
            # the broker too: the same event id twice, one fact.
            self._collect = []
            self._producer.purge(in_queue=True, in_flight=False, blocking=True)
            self._producer.poll(0)
            self._batch = None
        back = self._collect or []
        self._collect = None
        stranded = back + [p.fact for p in self._pending.values() if p.origin == "direct"]
        self._pending.clear()
        head = sorted([*self._head, *stranded], key=lambda f: f.n)
        if head or self._skip:
            self.spool.rewrite([(f.n, f.topic, f.record) for f in head], self._skip)
            self._head, self._skip = [], set()
        for fact in late:
            self.spool.append(fact.n, fact.topic, fact.record)
        self.counts.spooled += len(stranded) + len(late)
        with self._idle:
            self._queued = 0
        left = self.spool.backlog
        if left:
            log.warning(
                "recorder closed with %d facts not delivered; they are kept in %s and sent "
                "by the next recorder started on it",
                left,
                self.spool.path,
            )
        elif self.spool.drained():
            self.spool.reset()
        self.spool.close()
        with self._idle:
            self._idle.notify_all()
