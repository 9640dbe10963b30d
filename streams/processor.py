"""The processor: one input record in, the output records to publish out.

It decodes nothing and sends nothing itself. The worker (``agents/pipeline.py``) hands it an
``Envelope`` and sends the ``Emission``s it returns; the replay path and tests drive it the
same way with plain dicts as stores. Three parts, each in its own module:

- the scheduler (``streams/scheduler.py``) holds each event until its partition's watermark
  passes its time and says when each execution's deadlines fall;
- the handler (this class) checks what the core cannot check (keys, stream time), loads an
  execution's state, calls the pure core (``streams/core/``) and stores what it returned;
- the emitter (``streams/emitter.py``) turns the core's output records, and the anomalies and
  dead letters about inputs, into ``Emission``s with their topic, key and headers.

Stream time and decisions: a partition's watermark is the minimum over the input topics of
the largest event time seen on each (ticks included). Timeouts and verdicts are decided only
for times strictly before the watermark, and stamped with the exact deadline or change point,
so neither the interleaving of topics nor the phase of the ticker changes any answer.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel

from streams.core import approvals as ap
from streams.core import executions as ex
from streams.core import operations as ops
from streams.core import trace
from streams.core.alerts import anomaly_alert, verdict_alerts
from streams.core.bounds import out_of_domain
from streams.core.clock import PartitionClock
from streams.core.findings import AnomalyFinding
from streams.core.ids import deterministic_id
from streams.emission import Emission, record_time_ms
from streams.emitter import (
    EARLIEST_PLAUSIBLE,
    MAX_TEXT,
    Counters,
    Emitter,
    alert_headers,
    bounded,
    bounded_or_none,
    log_time,
)
from streams.envelope import Envelope
from streams.models import events as ev
from streams.models.base import Record
from streams.models.enums import AnomalyKind
from streams.models.outputs import Anomaly
from streams.partitioning import partition_of
from streams.scheduler import EPOCH, ONE_MS, Due, DueTime, Scheduler, Timers, epoch_ms
from streams.settings import Settings
from streams.state import ExecutionStore
from streams.topics import Topics

__all__ = ["MAX_TEXT", "Counters", "Emission", "Processor", "Stores", "alert_headers", "bounded"]

Store = MutableMapping[str, Any]


@dataclass
class Stores:
    """The worker's tables (Faust tables live; dicts in tests and replays)."""

    #: execution id -> everything known of it (``streams.state.Entry``, encoded): its slot,
    #: operations, approvals and the inputs it has applied, in one atomic record.
    executions: Store = field(default_factory=dict)
    #: partition number (as text) -> PartitionClock, saved whenever its watermark moves, so
    #: that a restart or a rebalance does not wait for every input to tick again.
    clocks: Store = field(default_factory=dict)


class Processor:
    """The handler: routes each input to the scheduler or the core, and the core's outputs
    to the emitter. The live worker, the replay and the tests all drive it alike."""

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
        self.partitions = topics.execution_status.partitions
        self.input_names = tuple(t.name for t in topics.inputs())
        self.max_future_skew = max_future_skew
        self._skew_ms = int(max_future_skew.total_seconds() * 1000)
        self.operation_config = operation_config or ops.OperationConfig()
        self.thresholds_for = ap.threshold_resolver(policies, thresholds)
        self.closed_retention = closed_retention
        self.orphan_after = orphan_after
        #: execution id -> partition (murmur2 of the id), memoised: several lookups per event
        self._partitions: dict[str, int] = {}
        self.scheduler = Scheduler(self.input_names, stores.clocks, self._timers)
        self.emitter = Emitter(
            topics,
            self._traces,
            self.partition_of,
            orphan_after=orphan_after,
            max_kept_bytes=max_kept_bytes,
        )
        #: the input being applied, if any (set until it is applied, so after an exception it
        #: names the input that raised it)
        self.applying: Envelope | None = None
        self._rank = self.scheduler.rank

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

    @property
    def counters(self) -> Counters:
        return self.emitter.counters

    @counters.setter
    def counters(self, counters: Counters) -> None:
        self.emitter.counters = counters

    # -- lifecycle ------------------------------------------------------------------------
    def forget_partitions(self) -> None:
        """After a rebalance: stream time, held events and due-time indexes are rebuilt from
        the log and the tables (``Scheduler.forget``). The inputs whose state was not flushed
        yet were not acknowledged either: Kafka delivers them again, so their state is
        dropped too."""
        self.scheduler.forget()
        self.state.discard()

    def flush(self, partition: int | None = None) -> int:
        """Write the state changes (of one partition, or all) to the tables. The live worker
        calls it only once the outputs of the inputs behind them are delivered."""
        return self.state.flush(partition)

    def flush_clocks(self, partition: int | None = None) -> None:
        """Write the partition clocks that moved (``Scheduler.flush_clocks``), after ``flush``'s
        writes are delivered and before the records are acknowledged."""
        self.scheduler.flush_clocks(partition)

    def dirty_partitions(self) -> list[int]:
        """Partitions with state or a clock not flushed yet."""
        return sorted(set(self.state.dirty_partitions()) | self.scheduler.clocks_dirty)

    def acknowledged(self, topic: str, partition: int, offset: int) -> None:
        """Every record of the topic partition below ``offset`` is processed and its effect
        flushed (``Scheduler.acknowledged``)."""
        self.scheduler.acknowledged(topic, partition, offset)

    def processed_through(self, topic: str, partition: int) -> int | None:
        """The stored offset below which the topic partition is processed."""
        return self.scheduler.processed_through(topic, partition)

    def drain_done(self) -> list[Any]:
        """Tokens of the records processed since the last call (to acknowledge)."""
        return self.scheduler.drain_done()

    def held(self) -> int:
        """Events held for the watermark, over all partitions."""
        return self.scheduler.held()

    def held_ahead(self, topic: str, partition: int) -> bool:
        return self.scheduler.held_ahead(topic, partition)

    @property
    def held_by(self) -> Counter[tuple[str, int]]:
        """Held events per input topic partition (flow control, metrics)."""
        return self.scheduler.held_by

    @property
    def clocks(self) -> dict[int, PartitionClock]:
        """Each partition's clock as read so far (metrics)."""
        return self.scheduler.clocks

    @property
    def last_tick(self) -> dict[tuple[str, int], datetime]:
        """Per input topic partition, the time of the newest clock tick read (metrics)."""
        return self.scheduler.last_tick

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
                out.append(self.emitter.emit(anomaly_alert(em.record)))
        if not self.write_behind:
            self.flush()
            self.flush_clocks()
        return out

    def _handle(self, env: Envelope, token: Any) -> list[Emission]:
        out: list[Emission] = []
        scheduler = self.scheduler
        if not env.ok:
            scheduler.done(token)
            return [self.emitter.dead_letter(env)]
        record = env.record
        assert record is not None
        self.counters.inputs[record.avro_name] += 1
        if isinstance(record, ev.ClockTick):
            scheduler.done(token)
            refusal = self._check_time(env, record.occurred_at) or out_of_domain(record)
            if refusal is not None:
                out.append(self.emitter.anomaly(env, record, refusal))
                return out
            scheduler.note_tick(env.topic, env.partition, record.occurred_at)
            self._observe(env, record.occurred_at, out)
            return out
        if trace.malformed(record):
            self.counters.traceparents_dropped += 1  # applied all the same, without it
        refusal = self._check(env, record)
        if refusal is not None:
            scheduler.done(token)
            out.append(self.emitter.anomaly(env, record, refusal))
            return out
        t: datetime = record.occurred_at  # type: ignore[attr-defined]
        watermark = scheduler.watermark(env.partition)
        if watermark is not None and t < watermark:
            # Behind the watermark: its time has been judged already. Applied at once (it is
            # still a fact); its effect shows from the next evaluated instant.
            self.counters.late += 1
            self._apply(env, record, out)
            scheduler.done(token)
        else:
            scheduler.hold(env, epoch_ms(t), token)
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
            if epoch_ms(t) > limit_ms:
                return AnomalyFinding(
                    AnomalyKind.TIME_OUT_OF_RANGE,
                    f"event time {t.isoformat()} is more than {self.max_future_skew} ahead of "
                    f"its record timestamp {log_time(env).isoformat()}",
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
            out.append(self.emitter.anomaly(env, record, step.anomaly))
            return
        self._remember_trace(record, trace.EXECUTION)
        self._store_execution(record.execution_id, step)
        if step.published is not None:
            out.append(self.emitter.emit(step.published))
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
            out.append(self.emitter.emit(step.published))

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
            out.extend(self.emitter.emit(r) for r in before.outputs)
            book = before.book
        step = ops.apply_event(book, record, self.operation_config)
        if step.outputs or not step.anomalies:
            self._remember_trace(record, trace.operation_key(record.operation_id))
        out.extend(self.emitter.emit(r) for r in step.outputs)
        out.extend(self.emitter.anomaly(env, record, f) for f in step.anomalies)
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
            emitted = self.emitter.emit(v)
            out.append(emitted)
            v = emitted.record  # type: ignore[assignment]  # with its trace context
            previous_id = previous_ids.get(v.request_id)
            if previous_id is None and v.request_id in book.last_verdicts:
                lv = book.last_verdicts[v.request_id]
                previous_id = deterministic_id("verdict", v.request_id, lv.verdict, lv.since)
            out.extend(self.emitter.emit(a) for a in verdict_alerts(v, previous_id))
            previous_ids[v.request_id] = v.verdict_id
        for request_id, last_fact in orphans:
            out.append(self.emitter.orphan(execution_id, request_id, last_fact))
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

    # -- timers and stream time ------------------------------------------------------------
    def _schedule(self, execution_id: str, due: datetime) -> None:
        self.scheduler.schedule(self.partition_of(execution_id), epoch_ms(due), execution_id)

    def _timers(self, partition: int) -> Timers:
        """The partition's due times as its tables say (``Scheduler.index``): operation
        deadlines, approval change points and the end of closed executions' retention."""
        due: list[DueTime] = []
        for key, value in list(self.operations.items()):
            if self.partition_of(key) == partition:
                deadline = ops.next_deadline(ops.OperationBook.model_validate_json(value))
                if deadline is not None:
                    due.append(DueTime(epoch_ms(deadline), key))
        judge_first = self._approval_due(partition, due)
        for key, value in list(self.closed.items()):
            if self.partition_of(key) == partition:
                slot = ex.load_slot(value)
                if isinstance(slot, ex.Closed):
                    due.append(DueTime(epoch_ms(slot.closed_at + self.closed_retention), key))
        return Timers(due, judge_first)

    def _approval_due(self, partition: int, due: list[DueTime]) -> set[str]:
        """Adds the approval books' due times to ``due``; returns the books to judge first."""
        judge_first: set[str] = set()
        for key, value in list(self.approvals.items()):
            if self.partition_of(key) == partition:
                book = ap.ApprovalBook.model_validate_json(value)
                change = ap.next_change(book, self.thresholds_for)
                if change is not None:
                    due.append(DueTime(epoch_ms(change), key))
                if book.dirty:
                    # Facts stored but not judged yet (the worker stopped in between): judged at
                    # their own times, as the uninterrupted run judged them when the watermark
                    # passed each; a late fact (nothing after evaluated_until) at the next one.
                    pending = _times_after(book, book.evaluated_until)
                    if pending:
                        due.extend(DueTime(epoch_ms(t), key) for t in pending)
                    else:
                        judge_first.add(key)
        return judge_first

    def _observe(self, env: Envelope, t: datetime, out: list[Emission]) -> None:
        watermark = self.scheduler.observe(env, t)
        if watermark is not None:
            self._on_watermark(env.partition, watermark, out)

    def _on_watermark(self, partition: int, watermark: datetime, out: list[Emission]) -> None:
        """Apply every held event and advance every execution due strictly before the
        watermark, in the scheduler's order."""
        for item in self.scheduler.release(partition, watermark):
            if isinstance(item, Due):
                for key in item.execution_ids:
                    self._advance_key(key, item.at, out)
            else:
                record = item.env.record
                assert record is not None
                self._apply(item.env, record, out)
                self.scheduler.done(item.token)

    def _advance_key(self, execution_id: str, horizon: datetime, out: list[Emission]) -> None:
        self._expire_closed(execution_id, horizon)
        changed_at: datetime | None = None
        book = self._load_operations(execution_id)
        if book is not None:
            step = ops.advance(book, horizon, self.operation_config)
            if step.outputs:
                out.extend(self.emitter.emit(r) for r in step.outputs)
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

    # -- outputs ------------------------------------------------------------------------
    def quarantine(self, env: Envelope, reason: str, token: Any = None) -> list[Emission]:
        """A record the worker failed on again and again (an exception in the core, an output
        the broker refuses): set aside as a dead letter with the reason, and a CRITICAL alert,
        so that its partition moves on. Never called by a replay: a record that fails there
        fails the replay."""
        self.scheduler.done(token)
        return self.emitter.quarantine(env, reason)

    def partition_of(self, execution_id: str) -> int:
        partition = self._partitions.get(execution_id)
        if partition is None:
            if len(self._partitions) >= 1 << 16:
                self._partitions.clear()  # a memo, not state: bounded by forgetting
            partition = partition_of(execution_id, self.partitions)
            self._partitions[execution_id] = partition
        return partition


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


def _record_time(record: Record) -> datetime:
    ms = record_time_ms(record)
    assert ms is not None
    return EPOCH + ms * ONE_MS
