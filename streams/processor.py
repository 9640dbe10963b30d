"""The imperative shell around the core: one input record in, output records out.

It decodes nothing and sends nothing itself. The Faust agent (``agents/pipeline.py``) hands it
an ``Envelope`` and sends the ``Emission``s it returns; the replay path and tests drive it the
same way with plain dicts as stores. It looks state up, calls the pure core, stores what the
core returned and keeps two things only in memory, both rebuilt after a restart or rebalance:
the stream time of each partition and an index of due times per partition.

Stream time and decisions: a partition's watermark is the minimum over the input topics of
the largest event time seen on each (ticks included). Timeouts and verdicts are decided only
for times strictly before the watermark, and stamped with the exact deadline or change point,
so neither the interleaving of topics nor the phase of the ticker changes any answer.
"""

from __future__ import annotations

import hashlib
import heapq
import json
from collections import Counter, deque
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel

from streams.clients import record_time_ms
from streams.core import approvals as ap
from streams.core import executions as ex
from streams.core import operations as ops
from streams.core import trace
from streams.core.alerts import anomaly_alert, verdict_alerts
from streams.core.bounds import out_of_domain
from streams.core.clock import PartitionClock
from streams.core.findings import AnomalyFinding
from streams.core.ids import deterministic_id
from streams.envelope import Envelope
from streams.models import events as ev
from streams.models.base import Record, replace
from streams.models.enums import AlertKind, AlertStatus, AnomalyKind, Owner, Severity
from streams.models.outputs import (
    Alert,
    Anomaly,
    ApprovalVerdict,
    DeadLetter,
    ExecutionState,
    OperationState,
    ReconciliationWorkItem,
    WorkItemResolution,
)
from streams.partitioning import partition_of
from streams.settings import Settings
from streams.state import ExecutionStore
from streams.topics import Topics

EARLIEST_PLAUSIBLE = datetime(1971, 1, 1, tzinfo=UTC)
ONE_MS = timedelta(milliseconds=1)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
Store = MutableMapping[str, Any]


@dataclass(frozen=True, slots=True)
class Emission:
    topic: str
    key: str | None
    record: Record
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def timestamp_ms(self) -> int | None:
        return record_time_ms(self.record)


@dataclass
class Stores:
    """The worker's tables (Faust tables live; dicts in tests and replays)."""

    #: execution id -> everything known of it (``streams.state.Entry``, encoded): its slot,
    #: operations, approvals and the inputs it has applied, in one atomic record.
    executions: Store = field(default_factory=dict)
    #: partition number (as text) -> PartitionClock, saved whenever its watermark moves, so
    #: that a restart or a rebalance does not wait for every input to tick again.
    clocks: Store = field(default_factory=dict)


@dataclass
class Counters:
    """What the worker has done, for metrics and summaries."""

    inputs: Counter[str] = field(default_factory=Counter)
    outputs: Counter[str] = field(default_factory=Counter)
    dead_letters: int = 0
    verdicts: Counter[str] = field(default_factory=Counter)
    anomalies: Counter[str] = field(default_factory=Counter)
    #: records set aside after failing again and again (``Processor.quarantine``)
    quarantined: int = 0
    #: events that arrived behind their partition's watermark (applied at once, out of time
    #: order): a producer writing out of order, or clock ticks ahead of the producers' clocks
    late: int = 0
    #: alerts published, by (kind, severity, status)
    alerts: Counter[tuple[str, str, str]] = field(default_factory=Counter)

    def snapshot(self) -> Counters:
        """A copy, to go back to when a batch fails: counters count what was published."""
        return Counters(
            inputs=Counter(self.inputs),
            outputs=Counter(self.outputs),
            dead_letters=self.dead_letters,
            verdicts=Counter(self.verdicts),
            anomalies=Counter(self.anomalies),
            quarantined=self.quarantined,
            late=self.late,
            alerts=Counter(self.alerts),
            redelivered=self.redelivered,
            traceparents_dropped=self.traceparents_dropped,
        )

    #: inputs Kafka delivered again after a restart or rebalance whose effect the state
    #: already held: skipped, their outputs were published the first time
    redelivered: int = 0
    #: inputs whose ``traceparent`` was malformed: applied, the value dropped (not carried)
    traceparents_dropped: int = 0


class Processor:
    def __init__(
        self,
        topics: Topics,
        stores: Stores,
        *,
        max_future_skew: timedelta = timedelta(hours=1),
        operation_config: ops.OperationConfig | None = None,
        thresholds: ap.ThresholdSet | None = None,
        policies: dict[str, ap.ThresholdOverrides] | None = None,
        closed_retention: timedelta = timedelta(hours=24),
        orphan_after: timedelta = timedelta(hours=1),
        max_kept_bytes: int = 512 * 1024,
        write_behind: bool = False,
        committed: Callable[[str, int], int | None] | None = None,
    ) -> None:
        """``write_behind``: state changes stay in the cache until ``flush`` (the live worker
        flushes once a batch's outputs are delivered); otherwise every ``handle`` flushes.
        ``committed`` (topic, partition -> committed offset), given by the live worker, turns
        on redelivery detection: the input positions each execution applied are kept in its
        entry until the committed offset passes them."""
        self.topics = topics
        self.stores = stores
        self.state = ExecutionStore(stores.executions)
        self.inflight = self.state.view("inflight")
        self.closed = self.state.view("closed")
        self.operations = self.state.view("operations")
        self.approvals = self.state.view("approvals")
        self.write_behind = write_behind
        self.committed = committed
        self._clocks_dirty: set[int] = set()
        self.partitions = topics.execution_status.partitions
        self.input_names = tuple(t.name for t in topics.inputs())
        self.max_future_skew = max_future_skew
        self._skew_ms = int(max_future_skew.total_seconds() * 1000)
        self.operation_config = operation_config or ops.OperationConfig()
        self.thresholds_for = ap.threshold_resolver(policies, thresholds)
        self.closed_retention = closed_retention
        #: a dead letter keeps its original key and value up to this many bytes together
        self.max_kept_bytes = max_kept_bytes
        self.orphan_after = orphan_after
        self.clocks: dict[int, PartitionClock] = {}
        #: the clock of each partition as last stored (or restored): acknowledged records only
        self._saved: dict[int, PartitionClock] = {}
        #: per input topic partition, (offset, event time) of the records observed since the
        #: stored clock, in read order; folded into it up to the first one still held
        self._trail: dict[tuple[str, int], deque[tuple[int, datetime]]] = {}
        #: per input topic partition, offsets of the events held for the watermark
        self._held_offsets: dict[tuple[str, int], set[int]] = {}
        #: per partition, per input topic: processed below this offset, not stored yet
        self._processed: dict[int, dict[str, int]] = {}
        #: the watermark of each partition's clock, with the clock it was computed from
        self._marks: dict[int, tuple[PartitionClock, datetime | None]] = {}
        #: execution id -> partition (murmur2 of the id), memoised: several lookups per event
        self._partitions: dict[str, int] = {}
        # Due-time index per partition: a heap of (due ms, execution id). Stale entries are
        # harmless (advancing a book is idempotent); rebuilt from the tables on first use.
        self.due: dict[int, list[tuple[int, str]]] = {}
        self.dirty: dict[int, set[str]] = {}
        # Events waiting for the watermark to pass their time, per partition: a heap of
        # (event time ms, topic rank, offset, seq, envelope, token).
        self.pending: dict[int, list[tuple[int, int, int, int, Envelope, Any]]] = {}
        #: held events per (input topic, partition): the live worker pauses a topic partition
        #: that runs far ahead of the others (``held_ahead``), so what waits for the watermark
        #: stays bounded whatever the backlog.
        self.held_by: Counter[tuple[str, int]] = Counter()
        #: per input topic partition, the event time of the newest clock tick read there (for
        #: the metrics: how long ago the ticker's clock last reached the partition)
        self.last_tick: dict[tuple[str, int], datetime] = {}
        self._seq = 0
        self._done: list[Any] = []
        #: the input being applied, if any (set until it is applied, so after an exception it
        #: names the input that raised it)
        self.applying: Envelope | None = None
        self._rank = {name: i for i, name in enumerate(self.input_names)}
        self.counters = Counters()
        self._out = {
            ExecutionState: topics.execution_state.name,
            OperationState: topics.operation_state.name,
            ReconciliationWorkItem: topics.reconciliation_work.name,
            WorkItemResolution: topics.reconciliation_work.name,
            ApprovalVerdict: topics.approval_verdicts.name,
            Alert: topics.alerts.name,
            Anomaly: topics.anomalies.name,
            DeadLetter: topics.dead_letters.name,
        }

    @classmethod
    def from_settings(
        cls, settings: Settings, topics: Topics, stores: Stores, **live: Any
    ) -> Processor:
        """The processor the worker and the replay both run, configured alike (``live``:
        the worker's ``write_behind`` and ``committed``)."""
        policies = settings.policies()
        return cls(
            topics,
            stores,
            **live,
            max_future_skew=settings.max_future_skew,
            operation_config=policies.operations,
            thresholds=policies.thresholds,
            policies=policies.approval_policies,
            closed_retention=settings.closed_retention,
            orphan_after=settings.orphan_after,
        )

    # -- lifecycle ------------------------------------------------------------------------
    def forget_partitions(self) -> None:
        """After a rebalance: stream time and due-time indexes are rebuilt from the log and
        the tables. Decisions are stamped with exact due times, so nothing is decided twice
        or differently; at worst one tick later."""
        self.clocks.clear()
        self._saved.clear()
        self._trail.clear()
        self._held_offsets.clear()
        self._processed.clear()
        self._marks.clear()
        self.due.clear()
        self.dirty.clear()
        # Held events were never acknowledged: Kafka redelivers them to the new owner. So it
        # does the inputs whose state was not flushed yet: forget both, acknowledge neither.
        self.pending.clear()
        self.held_by.clear()
        self.last_tick.clear()
        self.state.discard()
        self._clocks_dirty.clear()
        self._done.clear()

    def flush(self, partition: int | None = None) -> int:
        """Write the state changes (of one partition, or all) to the tables. The live worker
        calls it only once the outputs of the inputs behind them are delivered."""
        return self.state.flush(partition)

    def flush_clocks(self, partition: int | None = None) -> None:
        """Write the partition clocks that moved, as acknowledged (``_acked_clock``). After
        ``flush``'s writes are delivered and before the records are acknowledged: a stored
        clock must never be ahead of the stored state it has judged, nor of the records Kafka
        would deliver again after a restart."""
        for p in sorted(self._clocks_dirty) if partition is None else [partition]:
            if p not in self._clocks_dirty:
                continue
            self._clocks_dirty.discard(p)
            if p not in self._saved:
                self._clock(p)  # the stored clock, if any, is where the acknowledged one starts
            clock = self._acked_clock(p)
            if (clock.maxima or clock.through) and clock != self._saved.get(p):
                self.stores.clocks[str(p)] = clock.model_dump_json()
                self._saved[p] = clock

    def dirty_partitions(self) -> list[int]:
        """Partitions with state or a clock not flushed yet."""
        return sorted(set(self.state.dirty_partitions()) | self._clocks_dirty)

    # -- entry point ----------------------------------------------------------------------
    def handle(self, env: Envelope, token: Any = None) -> list[Emission]:
        """Take one input record; return what to publish now.

        ``token`` (the Faust event, live) comes back from ``drain_done`` once the record is
        fully processed: only then may its offset be committed. An event is held until the
        partition's watermark passes its time, then processed in event-time order together
        with the deadlines that fall between events, so that the outputs do not depend on how
        the input topics interleave nor on where the ticks fall.
        """
        self.state.partition = env.partition
        self.applying = None
        out = self._handle(env, token)
        for em in list(out):
            if isinstance(em.record, Anomaly):
                out.append(self._emit(anomaly_alert(em.record)))
        if not self.write_behind:
            self.flush()
            self.flush_clocks()
        return out

    def drain_done(self) -> list[Any]:
        """Tokens of the records processed since the last call (to acknowledge)."""
        done, self._done = self._done, []
        return done

    def held(self) -> int:
        return sum(len(h) for h in self.pending.values())

    def held_ahead(self, topic: str, partition: int) -> bool:
        """Whether the topic partition's newest time is past its partition's watermark: its
        held events wait for the other inputs, so reading it further only holds more. The
        input that sets the watermark is never ahead: pausing it could stop time."""
        clock = self.clocks.get(partition)
        newest = clock.max_for(topic) if clock is not None else None
        if newest is None:
            return False
        watermark = self._watermark(partition)
        return watermark is None or newest > watermark

    def _handle(self, env: Envelope, token: Any) -> list[Emission]:
        out: list[Emission] = []
        if not env.ok:
            self._done.append(token)
            return [self._dead_letter(env)]
        record = env.record
        assert record is not None
        self.counters.inputs[record.avro_name] += 1
        if isinstance(record, ev.ClockTick):
            self._done.append(token)
            refusal = self._check_time(env, record.occurred_at) or out_of_domain(record)
            if refusal is not None:
                out.append(self._anomaly(env, record, refusal))
                return out
            newest = self.last_tick.get((env.topic, env.partition))
            if newest is None or record.occurred_at > newest:
                self.last_tick[(env.topic, env.partition)] = record.occurred_at
            self._observe(env, record.occurred_at, out)
            return out
        if trace.malformed(record):
            self.counters.traceparents_dropped += 1  # applied all the same, without it
        refusal = self._check(env, record)
        if refusal is not None:
            self._done.append(token)
            out.append(self._anomaly(env, record, refusal))
            return out
        t: datetime = record.occurred_at  # type: ignore[attr-defined]
        watermark = self._watermark(env.partition)
        if watermark is not None and t < watermark:  # clock.is_late(t), its watermark cached
            # Behind the watermark: its time has been judged already. Applied at once (it is
            # still a fact); its effect shows from the next evaluated instant.
            self.counters.late += 1
            self._apply(env, record, out)
            self._done.append(token)
        else:
            self._seq += 1
            self.held_by[(env.topic, env.partition)] += 1
            self._held_offsets.setdefault((env.topic, env.partition), set()).add(env.offset)
            heapq.heappush(
                self.pending.setdefault(env.partition, []),
                (_ms(t), self._rank.get(env.topic, 0), env.offset, self._seq, env, token),
            )
        self._observe(env, t, out)
        return out

    def _apply(self, env: Envelope, record: Record, out: list[Emission]) -> None:
        # Left set if applying raises: the input the failure is about may be an event held
        # earlier and released by the record being handled, which is not its cause.
        self.applying = env
        self._apply_record(env, record, out)
        self.applying = None

    def _apply_record(self, env: Envelope, record: Record, out: list[Emission]) -> None:
        execution_id: str = record.execution_id  # type: ignore[attr-defined]
        if self.committed is not None:
            position = (self._rank.get(env.topic, 0), env.partition, env.offset)
            if self.state.applied(execution_id, position):
                self.counters.redelivered += 1
                if not isinstance(record, ev.ExecutionStatusChanged | ev.OperationEvent):
                    # its judgement is due at its own time, as when it was first applied
                    self._schedule(execution_id, record.occurred_at)  # type: ignore[attr-defined]
                return
            self.state.mark_applied(execution_id, position, self._committed_by_rank)
        if isinstance(record, ev.ExecutionStatusChanged):
            self._on_status(env, record, out)
        elif isinstance(record, ev.OperationEvent):
            self._on_operation(env, record, out)
        else:
            self._on_approval_fact(env, record, out)

    def _committed_by_rank(self, rank: int, partition: int) -> int | None:
        assert self.committed is not None
        return self.committed(self.input_names[rank], partition)

    # -- validation the core cannot do (it does not know keys or stream time) --------------
    def _check(self, env: Envelope, record: Record) -> AnomalyFinding | None:
        fields = record.__dict__
        execution_id = fields.get("execution_id")
        # Bytes against bytes: a key that is not UTF-8 must not pass by being decoded lossily.
        if execution_id is None or env.key != execution_id.encode(errors="surrogatepass"):
            key = env.key.decode(errors="replace") if env.key is not None else None
            return AnomalyFinding(
                AnomalyKind.KEY_MISMATCH,
                f"Kafka key {bounded_or_none(key)!r} differs from execution_id "
                f"{bounded_or_none(execution_id)!r}: the record may sit in the wrong partition, "
                "away from the rest of its execution",
            )
        for field_name in ("decision", "outcome"):
            if fields.get(field_name) == "UNRECOGNIZED":
                return AnomalyFinding(
                    AnomalyKind.UNRECOGNIZED_SYMBOL,
                    f"{record.avro_name}.{field_name} has a symbol this version does not know;"
                    " not applied (a decision vigil cannot read is not a decision)",
                )
        return self._check_time(env, record.occurred_at) or out_of_domain(record)  # type: ignore[attr-defined]

    def _check_time(self, env: Envelope, t: datetime) -> AnomalyFinding | None:
        """An event time vigil cannot place: before 1971, or more than ``max_future_skew``
        ahead of the record's own Kafka timestamp.

        Why the record timestamp: a future-skew check exists to catch a producer whose clock
        is broken, and the record timestamp is the one time in the record that the broker has
        checked against its own clock (an input topic refuses a timestamp more than
        ``message.timestamp.after.max.ms`` ahead of the broker's). It is part of the record, so
        the live run and every replay judge alike, and it does not depend on how far the
        worker has read the other topics, nor on gaps between the records of a sparse topic
        (a backfill may be quiet for hours). A record with no timestamp is not checked."""
        if t < EARLIEST_PLAUSIBLE:
            return AnomalyFinding(
                AnomalyKind.TIME_OUT_OF_RANGE, f"event time {t.isoformat()} is before 1971"
            )
        if env.timestamp_ms is not None and env.timestamp_ms >= 0:
            limit_ms = env.timestamp_ms + self._skew_ms
            if _ms(t) > limit_ms:
                return AnomalyFinding(
                    AnomalyKind.TIME_OUT_OF_RANGE,
                    f"event time {t.isoformat()} is more than {self.max_future_skew} ahead of "
                    f"its record timestamp {_ts(env).isoformat()}",
                )
        return None

    # -- executions -----------------------------------------------------------------------
    def _load_execution(self, execution_id: str) -> ex.Slot:
        slot = self.state.load(execution_id, "inflight", ex.load_slot)
        if slot is None:
            slot = self.state.load(execution_id, "closed", ex.load_slot)
        return slot  # type: ignore[no-any-return]

    def _store_execution(self, execution_id: str, step: ex.ExecutionStep) -> None:
        slot = step.slot
        if isinstance(slot, ex.Closed):
            self.state.save(execution_id, "closed", slot, ex.dump_slot)
            self.state.save(execution_id, "inflight", None)
            self._schedule(execution_id, slot.closed_at + self.closed_retention)
        elif isinstance(slot, ex.InFlight):
            self.state.save(execution_id, "inflight", slot, ex.dump_slot)

    def _on_status(
        self, env: Envelope, record: ev.ExecutionStatusChanged, out: list[Emission]
    ) -> None:
        slot = self._load_execution(record.execution_id)
        step = ex.apply_status(slot, record)
        if step.anomaly is not None:
            out.append(self._anomaly(env, record, step.anomaly))
            return
        self._remember_trace(record, trace.EXECUTION)
        self._store_execution(record.execution_id, step)
        if step.published is not None:
            out.append(self._emit(step.published))
        if isinstance(step.slot, ex.InFlight) and slot is None:
            # operations or approvals may have been seen before the first status
            self._sync_open_items(record.execution_id, record.occurred_at, out)

    def _sync_open_items(self, execution_id: str, at: datetime, out: list[Emission]) -> None:
        slot = self.state.load(execution_id, "inflight", ex.load_slot)
        if slot is None:
            return
        step = ex.set_open_items(
            slot,
            ops.open_operation_ids(self._load_operations(execution_id)),
            self._open_approvals(execution_id),
            at,
        )
        if step.published is not None:
            self._store_execution(execution_id, step)
            out.append(self._emit(step.published))

    # -- operations -----------------------------------------------------------------------
    def _load_operations(self, execution_id: str) -> ops.OperationBook | None:
        return self.state.load(  # type: ignore[no-any-return]
            execution_id, "operations", ops.OperationBook.model_validate_json
        )

    def _store_operations(self, book: ops.OperationBook) -> None:
        self.state.save(book.execution_id, "operations", book, _dump_json_lean)
        due = ops.next_deadline(book)
        if due is not None:
            self._schedule(book.execution_id, due)

    def _on_operation(self, env: Envelope, record: ev.OperationEvent, out: list[Emission]) -> None:
        book = self._load_operations(record.execution_id)
        if book is not None:
            # Deadlines before this event, judged on this topic's own order: a reply stamped
            # after its deadline finds the attempt already UNKNOWN, live and in a replay.
            before = ops.advance(book, record.occurred_at - ONE_MS, self.operation_config)
            out.extend(self._emit(r) for r in before.outputs)
            book = before.book
        step = ops.apply_event(book, record, self.operation_config)
        if step.outputs or not step.anomalies:
            self._remember_trace(record, trace.operation_key(record.operation_id))
        out.extend(self._emit(r) for r in step.outputs)
        out.extend(self._anomaly(env, record, f) for f in step.anomalies)
        if step.book is not None:
            self._store_operations(step.book)
        self._sync_open_items(record.execution_id, record.occurred_at, out)

    # -- approvals ------------------------------------------------------------------------
    def _load_approvals(self, execution_id: str) -> ap.ApprovalBook | None:
        return self.state.load(  # type: ignore[no-any-return]
            execution_id, "approvals", ap.ApprovalBook.model_validate_json
        )

    def _open_approvals(self, execution_id: str) -> tuple[str, ...]:
        book = self._load_approvals(execution_id)
        return ap.open_request_ids(book) if book is not None else ()

    def _on_approval_fact(self, env: Envelope, record: Record, out: list[Emission]) -> None:
        """Facts are stored at once; verdicts are judged when the watermark passes them, so
        a decision and its receipt meet whichever topic delivers first, and a fact that comes
        before its request waits for it in the book."""
        execution_id: str = record.execution_id  # type: ignore[attr-defined]
        book = self._load_approvals(execution_id) or ap.ApprovalBook(execution_id=execution_id)
        book = ap.add_fact(book, record)  # type: ignore[arg-type]
        self.state.save(execution_id, "approvals", book, _dump_json)
        self._remember_trace(record, trace.key_of_input(record))
        self._schedule(execution_id, record.occurred_at)  # type: ignore[attr-defined]

    def _advance_approvals(
        self, execution_id: str, horizon: datetime, out: list[Emission]
    ) -> datetime | None:
        book = self._load_approvals(execution_id)
        if book is None:
            return None
        joined = ap.JoinedFacts(self.thresholds_for)  # computed once for both calls
        new_book, verdicts = ap.advance(book, horizon, self.thresholds_for, joined)
        new_book, orphans = ap.take_orphans(new_book, horizon - self.orphan_after)
        new_book = ap.purge_closed(new_book, horizon - self.closed_retention)
        # The id of the verdict record each request leaves, made only for requests that
        # change (most advances change none).
        previous_ids: dict[str, str] = {}
        for v in verdicts:
            emitted = self._emit(v)
            out.append(emitted)
            v = emitted.record  # type: ignore[assignment]  # with its trace context
            previous_id = previous_ids.get(v.request_id)
            if previous_id is None and v.request_id in book.last_verdicts:
                lv = book.last_verdicts[v.request_id]
                previous_id = deterministic_id("verdict", v.request_id, lv.verdict, lv.since)
            out.extend(self._emit(a) for a in verdict_alerts(v, previous_id))
            previous_ids[v.request_id] = v.verdict_id
        for request_id, last_fact in orphans:
            out.append(self._orphan(execution_id, request_id, last_fact))
        # ``advance`` moves ``evaluated_until`` almost every time: that differs first, and
        # spares comparing every request's facts field by field
        if new_book is not book and (
            new_book.evaluated_until != book.evaluated_until or new_book != book
        ):
            self.state.save(execution_id, "approvals", new_book, _dump_json)
        change = ap.next_change(new_book, self.thresholds_for, joined)
        if change is not None:
            self._schedule(execution_id, change)
        orphaned = ap.orphan_deadline(new_book, self.orphan_after)
        if orphaned is not None:  # take_orphans needs the horizon strictly past it
            self._schedule(execution_id, orphaned + ONE_MS)
        return max((v.evaluated_at for v in verdicts), default=None)

    # -- timers ---------------------------------------------------------------------------
    def _schedule(self, execution_id: str, due: datetime) -> None:
        heap = self._ensure_index(self.partition_of(execution_id))
        heapq.heappush(heap, (_ms(due), execution_id))

    def _ensure_index(self, partition: int) -> list[tuple[int, str]]:
        heap = self.due.get(partition)
        if heap is None:
            heap = []
            for key, value in list(self.operations.items()):
                if self.partition_of(key) == partition:
                    due = ops.next_deadline(ops.OperationBook.model_validate_json(value))
                    if due is not None:
                        heap.append((_ms(due), key))
            heap.extend(self._approval_due(partition))
            for key, value in list(self.closed.items()):
                if self.partition_of(key) == partition:
                    slot = ex.load_slot(value)
                    if isinstance(slot, ex.Closed):
                        heap.append((_ms(slot.closed_at + self.closed_retention), key))
            heapq.heapify(heap)
            self.due[partition] = heap
        return heap

    def _approval_due(self, partition: int) -> list[tuple[int, str]]:
        due_list = []
        for key, value in list(self.approvals.items()):
            if self.partition_of(key) == partition:
                book = ap.ApprovalBook.model_validate_json(value)
                due = ap.next_change(book, self.thresholds_for)
                if due is not None:
                    due_list.append((_ms(due), key))
                if book.dirty:
                    # Facts stored but not judged yet (the worker stopped in between): judged at
                    # their own times, as the uninterrupted run judged them when the watermark
                    # passed each; a late fact (nothing after evaluated_until) at the next one.
                    pending = _times_after(book, book.evaluated_until)
                    if pending:
                        due_list.extend((_ms(t), key) for t in pending)
                    else:
                        self.dirty.setdefault(partition, set()).add(key)
        return due_list

    # -- stream time ----------------------------------------------------------------------
    def _observe(self, env: Envelope, t: datetime, out: list[Emission]) -> None:
        if env.topic not in self.input_names:
            return
        self._trail.setdefault((env.topic, env.partition), deque()).append((env.offset, t))
        self._clocks_dirty.add(env.partition)
        clock = (
            self.clocks.get(env.partition)
            or self._clock(env.partition)
            or PartitionClock.start(self.input_names)
        )
        moved = clock.observe(env.topic, t)
        if moved is clock:
            return  # not newer than its topic's maximum: nothing moves
        before = self._watermark(env.partition)
        self.clocks[env.partition] = moved
        after = self._watermark(env.partition)
        if after is not None and (before is None or after > before):
            self._on_watermark(env.partition, after, out)

    def _acked_clock(self, partition: int) -> PartitionClock:
        """The partition's clock over the records that will be acknowledged: per input topic,
        the newest time of the records read up to (not including) its first record still held
        for the watermark. ``AckOrder`` acknowledges each topic partition in offset order, so
        this is exactly the clock of what Kafka will not deliver again; a held record and
        everything read after it on its topic partition come again after a restart, and must
        find a watermark that has not passed them yet."""
        clock = self._saved.get(partition) or PartitionClock.start(self.input_names)
        for topic in self.input_names:
            trail = self._trail.get((topic, partition))
            if not trail:
                continue
            held = self._held_offsets.get((topic, partition))
            newest: datetime | None = None
            while trail and not (held and trail[0][0] in held):
                t = trail.popleft()[1]
                if newest is None or t > newest:
                    newest = t
            if newest is not None:
                clock = clock.observe(topic, newest)
        for topic, offset in self._processed.pop(partition, {}).items():
            clock = clock.processed_through(topic, offset)
        return clock

    def acknowledged(self, topic: str, partition: int, offset: int) -> None:
        """Every record of the topic partition below ``offset`` is processed and its effect
        flushed: stored with the partition's clock at the next ``flush_clocks``."""
        if topic not in self.input_names:
            return
        pending = self._processed.setdefault(partition, {})
        if offset > pending.get(topic, -1):
            pending[topic] = offset
            self._clocks_dirty.add(partition)

    def processed_through(self, topic: str, partition: int) -> int | None:
        """The stored offset below which the topic partition is processed (``acknowledged``),
        from the partition's clock as last stored or restored."""
        clock = self._saved.get(partition)
        if clock is None:
            self._clock(partition)
            clock = self._saved.get(partition)
        return None if clock is None else clock.through_for(topic)

    def _watermark(self, partition: int) -> datetime | None:
        """The watermark of the partition's clock (None: no clock, or not every input seen),
        computed once per clock: it is asked several times per record."""
        clock = self.clocks.get(partition) or self._clock(partition)
        if clock is None:
            return None
        cached = self._marks.get(partition)
        if cached is not None and cached[0] is clock:
            return cached[1]
        watermark = clock.watermark
        self._marks[partition] = (clock, watermark)
        return watermark

    def _clock(self, partition: int) -> PartitionClock | None:
        clock = self.clocks.get(partition)
        if clock is None:
            stored = self.stores.clocks.get(str(partition))
            if stored is not None:
                clock = PartitionClock.model_validate_json(stored)
                if set(clock.inputs) != set(self.input_names):
                    return None  # the input topics changed: start afresh
                self.clocks[partition] = clock
                self._saved[partition] = clock
        return clock

    def _on_watermark(self, partition: int, watermark: datetime, out: list[Emission]) -> None:
        """Process, in time order, every held event and every deadline strictly before the
        watermark. At equal times events go first: an answer stamped at its deadline is in
        time. Keys whose facts changed before a restart are judged first."""
        limit = _ms(watermark) - 1
        heap = self._ensure_index(partition)
        for key in sorted(self.dirty.pop(partition, set())):
            self._advance_key(key, watermark - ONE_MS, out)
        pending = self.pending.get(partition, [])
        while True:
            next_event = pending[0][0] if pending and pending[0][0] <= limit else None
            next_due = heap[0][0] if heap and heap[0][0] <= limit else None
            if next_event is None and next_due is None:
                return
            if next_event is not None and (next_due is None or next_event <= next_due):
                _, _, _, _, env, token = heapq.heappop(pending)
                self.held_by[(env.topic, partition)] -= 1
                self._held_offsets[(env.topic, partition)].discard(env.offset)
                assert env.record is not None
                self._apply(env, env.record, out)
                self._done.append(token)
                continue
            assert next_due is not None
            keys = set()
            while heap and heap[0][0] == next_due:
                keys.add(heapq.heappop(heap)[1])
            at = EPOCH + next_due * ONE_MS
            for key in sorted(keys):
                self._advance_key(key, at, out)

    def _advance_key(self, execution_id: str, horizon: datetime, out: list[Emission]) -> None:
        self._expire_closed(execution_id, horizon)
        changed_at: datetime | None = None
        book = self._load_operations(execution_id)
        if book is not None:
            step = ops.advance(book, horizon, self.operation_config)
            if step.outputs:
                out.extend(self._emit(r) for r in step.outputs)
                self._store_operations(step.book)
                changed_at = max(_record_time(r) for r in step.outputs)
        approvals_at = self._advance_approvals(execution_id, horizon, out)
        if approvals_at is not None:
            changed_at = max(changed_at, approvals_at) if changed_at else approvals_at
        if changed_at is not None:
            self._sync_open_items(execution_id, changed_at, out)

    def _expire_closed(self, execution_id: str, at: datetime) -> None:
        """A terminal execution is remembered for ``closed_retention`` (late events for it are
        anomalies, not resurrections), then forgotten, so the table does not grow forever."""
        slot = self.state.load(execution_id, "closed", ex.load_slot)
        if isinstance(slot, ex.Closed) and slot.closed_at + self.closed_retention <= at:
            self.state.save(execution_id, "closed", None)

    # -- trace context --------------------------------------------------------------------
    def _traces(self, execution_id: str) -> dict[str, str] | None:
        return self.state.load(execution_id, "traces", json.loads)  # type: ignore[no-any-return]

    def _remember_trace(self, record: Record, key: str) -> None:
        """Keep an applied input's trace context as the latest of what it changed, for the
        outputs about that, now and at later deadlines (``streams.core.trace``)."""
        traceparent = trace.traceparent_of(record)
        if traceparent is None:
            return
        execution_id: str = record.execution_id  # type: ignore[attr-defined]
        traces = self._traces(execution_id)
        if traces and traces.get(key) == traceparent and next(reversed(traces)) == key:
            return  # already the latest: the entry stays clean
        self.state.save(
            execution_id, "traces", trace.remember(traces, key, traceparent), _dump_traces
        )

    # -- outputs --------------------------------------------------------------------------
    def _emit(self, record: Record, headers: tuple[tuple[str, str], ...] = ()) -> Emission:
        cls = type(record)
        topic = self._out[cls]
        if record.__dict__.get("traceparent") is None:
            keys = _trace_keys(record)
            if keys is not None:
                traceparent = trace.lookup(self._traces(record.__dict__["execution_id"]), *keys)
                if traceparent is not None:
                    record = replace(record, traceparent=traceparent)
        if cls is ApprovalVerdict:
            self.counters.verdicts[str(record.verdict)] += 1  # type: ignore[attr-defined]
        elif cls is Alert:
            a: Alert = record  # type: ignore[assignment]
            self.counters.alerts[(str(a.kind), str(a.severity), str(a.status))] += 1
            if not headers:
                headers = alert_headers(a)
        self.counters.outputs[cls.avro_name] += 1
        key_field = cls.key_field
        key = None if key_field is None else record.__dict__[key_field]
        return Emission(topic, key, record, headers)

    def _anomaly(self, env: Envelope, record: Record, finding: AnomalyFinding) -> Emission:
        self.counters.anomalies[finding.kind] += 1
        fields = record.__dict__
        occurred = fields.get("occurred_at")
        # The offending event's own time, not the stream time when it was read: that depends
        # on how topics interleave, and a replay must give the very same record.
        detected = occurred or _ts(env)
        if finding.kind == AnomalyKind.TIME_OUT_OF_RANGE or detected < EARLIEST_PLAUSIBLE:
            # the event's own time is the fault: stamp with the record's log timestamp, which
            # the broker accepted (it refuses timestamps far in the future)
            detected = _ts(env)
        return self._emit(
            Anomaly(
                anomaly_id=deterministic_id(
                    "anomaly", env.topic, env.partition, env.offset, finding.kind
                ),
                kind=finding.kind,
                reason=bounded(finding.reason, MAX_TEXT),
                execution_id=bounded_or_none(fields.get("execution_id")),
                event_id=bounded_or_none(fields.get("event_id")),
                event_type=record.avro_name,
                source_topic=env.topic,
                source_partition=env.partition,
                source_offset=env.offset,
                occurred_at=occurred,
                detected_at=detected,
                traceparent=trace.traceparent_of(record),
            )
        )

    def _orphan(self, execution_id: str, request_id: str, last_fact: datetime) -> Emission:
        """Facts about a request that never came: reported once, after ``orphan_after``."""
        kind = AnomalyKind.ORPHAN_FACT
        self.counters.anomalies[kind] += 1
        at = last_fact + self.orphan_after
        return self._emit(
            Anomaly(
                anomaly_id=deterministic_id("anomaly", execution_id, request_id, kind, at),
                kind=kind,
                reason=(
                    f"facts (delivery, decision, acknowledgement or receipt) for approval request"
                    f" {request_id!r} arrived but the request itself did not come within "
                    f"{self.orphan_after} of the last of them; they are dropped"
                ),
                execution_id=execution_id,
                event_type="ApprovalRequested",
                source_topic=self.topics.approval_events.name,
                source_partition=self.partition_of(execution_id),
                source_offset=-1,
                occurred_at=last_fact,
                detected_at=at,
                traceparent=trace.lookup(self._traces(execution_id), trace.request_key(request_id)),
            )
        )

    def _dead_letter(self, env: Envelope, reason: str | None = None) -> Emission:
        self.counters.dead_letters += 1
        key, value = env.key, env.value
        size = len(key or b"") + len(value or b"")
        digest: str | None = None
        if size > self.max_kept_bytes:
            # Kept, the original would make the dead letter larger than the topic accepts, and
            # the batch would fail for ever: its size, digest and coordinates say which it was.
            digest = hashlib.sha256(value if value is not None else key or b"").hexdigest()
            key = value = None
        rec = DeadLetter(
            dead_letter_id=deterministic_id("dlq", env.topic, env.partition, env.offset),
            source_topic=env.topic,
            source_partition=env.partition,
            source_offset=env.offset,
            source_timestamp=_ts(env) if env.timestamp_ms else None,
            reason=bounded(reason or env.error or "unknown", MAX_TEXT),
            original_key=key,
            original_value=value,
            original_size=size if digest is not None else None,
            original_sha256=digest,
            traceparent=None if env.record is None else trace.traceparent_of(env.record),
        )
        self.counters.outputs[rec.avro_name] += 1
        return Emission(self.topics.dead_letters.name, _text_key(env.key), rec)

    def quarantine(self, env: Envelope, reason: str, token: Any = None) -> list[Emission]:
        """A record the worker failed on again and again (an exception in the core, an output
        the broker refuses): set aside as a dead letter with the reason, and a CRITICAL alert,
        so that its partition moves on. Never called by a replay: a record that fails there
        fails the replay."""
        self._done.append(token)
        self.counters.quarantined += 1
        dead = self._dead_letter(env, f"quarantined: {reason}")
        record = dead.record
        assert isinstance(record, DeadLetter)
        alert = Alert(
            alert_id=deterministic_id("alert", "QUARANTINED", record.dead_letter_id),
            kind=AlertKind.ANOMALY,
            status=AlertStatus.FIRING,
            severity=Severity.CRITICAL,
            execution_id=(_text_key(env.key) or "")[:MAX_TEXT],
            subject_id=record.dead_letter_id,
            verdict="QUARANTINED",
            owner=Owner.OPERATOR,
            next_step="inspect the record in the dead-letter topic; it was set aside, not applied",
            evidence=(
                "QUARANTINED",
                record.reason,
                f"{env.topic}/{env.partition}@{env.offset}",
            ),
            occurred_at=record.source_timestamp or _ts(env),
            traceparent=record.traceparent,
        )
        return [dead, self._emit(alert)]

    def partition_of(self, execution_id: str) -> int:
        partition = self._partitions.get(execution_id)
        if partition is None:
            if len(self._partitions) >= 1 << 16:
                self._partitions.clear()  # a memo, not state: bounded by forgetting
            partition = partition_of(execution_id, self.partitions)
            self._partitions[execution_id] = partition
        return partition


def alert_headers(alert: Alert) -> tuple[tuple[str, str], ...]:
    """Kafka headers that let a subscriber filter alerts without decoding Avro, and the
    W3C ``traceparent`` header when the alert has a trace context (tracing-aware consumers
    continue the trace from it)."""
    headers = (
        ("kind", str(alert.kind)),
        ("status", str(alert.status)),
        ("verdict", alert.verdict or ""),
        ("owner", str(alert.owner)),
        ("severity", str(alert.severity)),
    )
    if alert.traceparent is not None:
        headers += (("traceparent", alert.traceparent),)
    return headers


_OPERATION_OUTPUTS = (OperationState, ReconciliationWorkItem, WorkItemResolution)


def _trace_keys(record: Record) -> tuple[str, ...] | None:
    """Under which keys an output's trace context is kept (``trace.lookup`` falls back to the
    execution's), or None for outputs that get theirs where they are made (anomalies and
    the alerts about them, dead letters)."""
    cls = type(record)
    if cls is ExecutionState:
        return ()
    if cls in _OPERATION_OUTPUTS:
        return (trace.operation_key(record.operation_id),)  # type: ignore[attr-defined]
    if cls is ApprovalVerdict:
        return (trace.request_key(record.request_id), trace.SIGNALS)  # type: ignore[attr-defined]
    if cls is Alert:
        kind = record.kind  # type: ignore[attr-defined]
        subject: str = record.subject_id  # type: ignore[attr-defined]
        if kind is AlertKind.APPROVAL_VERDICT:
            return (trace.request_key(subject), trace.SIGNALS)
        if kind is not AlertKind.ANOMALY:
            return (trace.operation_key(subject),)
    return None


def _dump_traces(traces: dict[str, str]) -> str:
    return json.dumps(traces, separators=(",", ":"))


def _times_after(value: Any, after: datetime | None) -> set[datetime]:
    """Every time in a state model later than ``after``."""
    out: set[datetime] = set()

    def walk(v: Any) -> None:
        if isinstance(v, datetime):
            if after is None or v > after:
                out.add(v)
        elif isinstance(v, BaseModel):
            for name in type(v).model_fields:
                walk(getattr(v, name))
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, tuple | list):
            for x in v:
                walk(x)

    walk(value)
    return out


def _dump_json(model: Any) -> str:
    return model.model_dump_json()  # type: ignore[no-any-return]


def _dump_json_lean(model: Any) -> str:
    """Without the fields that are None: every nullable field of an operation book defaults
    to None, so loading gives the same book, and an in-flight execution's entry is about a
    sixth smaller (memory per in-flight execution, BENCHMARKS.md)."""
    return model.model_dump_json(exclude_none=True)  # type: ignore[no-any-return]


def _ms(t: datetime) -> int:
    """Epoch milliseconds, exactly: ``int(t.timestamp() * 1000)`` goes through a float and
    gives the millisecond before for some times, and a deadline scheduled a millisecond early
    was judged short of itself and scheduled again, for ever."""
    return (t - EPOCH) // ONE_MS


def _record_time(record: Record) -> datetime:
    ms = record_time_ms(record)
    assert ms is not None
    return EPOCH + ms * ONE_MS


def _ts(env: Envelope) -> datetime:
    return EPOCH + (env.timestamp_ms or 0) * ONE_MS


#: the longest text an anomaly or dead letter carries from its input (ids, reasons)
MAX_TEXT = 1024


def bounded(text: str, limit: int) -> str:
    """``text`` itself when short enough, else its head and a digest of the whole: outputs
    that quote their input stay far below what the output topics accept."""
    if len(text) <= limit:
        return text
    digest = hashlib.sha256(text.encode(errors="surrogatepass")).hexdigest()[:32]
    return f"{text[:200]}…[{len(text)} characters, sha256 {digest}]"


def bounded_or_none(text: str | None) -> str | None:
    return None if text is None else bounded(text, MAX_TEXT)


def _text_key(key: bytes | None) -> str | None:
    """A Kafka key as text for an output's key (lossy only for keys that are not UTF-8, which
    the key check refuses anyway), bounded like every quoted input."""
    return None if key is None else bounded(key.decode(errors="replace"), MAX_TEXT)
