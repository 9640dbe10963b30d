"""The processor: one input record in, the output records to publish out.

It decodes nothing and sends nothing itself. The worker (``vigil_worker/pipeline.py``) hands it an
``Envelope`` and sends the ``Emission``s it returns; the replay path and tests drive it the
same way with plain dicts as stores. Three parts, each in its own module:

- the scheduler (``streams/engine/scheduler.py``) holds each event until its partition's watermark
  passes its time and says when each execution's deadlines fall;
- the handler (this class) checks what the core cannot check (keys, stream time), loads an
  execution's state, calls the pure core (``streams/core/``) and stores what it returned;
- the emitter (``streams/engine/emitter.py``) turns the core's output records, and the anomalies and
  dead letters about inputs, into ``Emission``s with their topic, key and headers.

Stream time and decisions: a partition's watermark is the minimum over the input topics of
the largest event time seen on each (ticks included), minus the allowed lateness. Timeouts and
verdicts are decided only for times strictly before the watermark, and stamped with the exact
deadline or change point; an event written behind newer records of its own topic partition
is placed by that topic partition's time, never by how far the other topics have been read.
So neither the interleaving of topics nor the phase of the ticker changes any answer.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from streams.contracts.envelope import Envelope
from streams.contracts.models import events as ev
from streams.contracts.models.base import Record
from streams.contracts.models.enums import AlertKind, AlertStatus, AnomalyKind
from streams.contracts.models.outputs import Alert, Anomaly, OperationState, RetryLink
from streams.core import alerts as al
from streams.core import approvals as ap
from streams.core import claims as cl
from streams.core import cross, trace
from streams.core import executions as ex
from streams.core import operations as ops
from streams.core.alerts import anomaly_alert, verdict_alerts
from streams.core.bounds import out_of_domain, text_bounds
from streams.core.clock import PartitionClock
from streams.core.execution import UNLOADED, Execution, Orphan, Refusal, Rules, Step, Verdict
from streams.core.findings import AnomalyFinding
from streams.engine.emission import Emission
from streams.engine.emitter import (
    EARLIEST_PLAUSIBLE,
    MAX_TEXT,
    Counters,
    Emitter,
    alert_headers,
    bounded,
    bounded_or_none,
    log_time,
)
from streams.engine.scheduler import (
    EPOCH,
    ONE_MS,
    Due,
    DueTime,
    Scheduler,
    Timers,
    epoch_ms,
    from_ms,
)
from streams.engine.state import DEFAULT_KEPT_BYTES, ExecutionStore, Position
from streams.kafka.partitioning import partition_of
from streams.kafka.topics import Topics
from streams.settings import Settings

__all__ = ["MAX_TEXT", "Counters", "Emission", "Processor", "Stores", "alert_headers", "bounded"]

Store = MutableMapping[str, Any]


#: The default of ``max_entry_bytes`` (``VIGIL_MAX_ENTRY_BYTES``): half of what Faust's
#: producer sends in one request (1,000,000 bytes) and the broker's default largest record
#: (1,048,588), so that what deadlines add to an entry after its last input, and the input
#: positions the live worker keeps in it, still fit.
DEFAULT_MAX_ENTRY_BYTES = 512 * 1024
#: What one input may add to its entry's packed size at most, per character of its text
#: fields, and besides. An over-estimate by far: a character is stored in at most a couple
#: of places (an idempotency key in its attempt and in the key index), JSON-escaped in at
#: most six bytes, and compressed.
GROWTH_PER_CHARACTER = 16
GROWTH_PER_INPUT = 2048
#: What a deadline (an advance of an execution to a time) may add to its entry at most:
#: this, and as much again per output it gives (each output is one change a deadline made:
#: an attempt UNKNOWN with its work item, a verdict), so that an advance that times out
#: hundreds of operations at once is counted as such.
ADVANCE_GROWTH = 2048
OUTPUT_GROWTH = 1024


def input_growth(record: Record) -> int:
    """An over-estimate of what applying ``record`` adds to its entry's packed size."""
    fields = record.__dict__
    chars = 0
    for name, _ in text_bounds(type(record)):
        text = fields[name]
        if text is not None:
            chars += len(text)
    return GROWTH_PER_INPUT + GROWTH_PER_CHARACTER * chars


@dataclass
class Stores:
    """The worker's tables (Faust tables live; dicts in tests and replays)."""

    #: execution id -> everything known of it (``streams.engine.state.Entry``, encoded): its slot,
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
        allowed_lateness: timedelta = timedelta(0),
        operation_config: ops.OperationConfig | None = None,
        thresholds: ap.ThresholdSet | None = None,
        policies: dict[str, ap.ThresholdOverrides] | None = None,
        closed_retention: timedelta = timedelta(hours=24),
        orphan_after: timedelta = timedelta(hours=1),
        anomaly_alert_ttl: timedelta = timedelta(hours=1),
        max_kept_bytes: int = 512 * 1024,
        max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES,
        state_cache_bytes: int = DEFAULT_KEPT_BYTES,
        write_behind: bool = False,
        committed: Callable[[str, int], int | None] | None = None,
        cross_execution: bool = False,
    ) -> None:
        """``write_behind``: state changes stay in the cache until ``flush`` (the live worker
        flushes once a batch's outputs are delivered); otherwise every ``handle`` flushes.
        ``committed`` (topic, partition -> committed offset), given by the live worker, turns
        on redelivery detection: the input positions each execution applied are kept in its
        entry until the committed offset passes them, and an input below the committed offset
        is a redelivery. ``max_entry_bytes``: the largest an
        execution's packed entry may grow to by an input (``_apply``). ``cross_execution`` (the
        live worker, and a replay, which runs the join in-process: ``streams/local_join.py``)
        turns on the join of attempts across executions (``streams.core.claims``): claims and
        progress published, retry links applied (``_on_link``). ``anomaly_alert_ttl``: how long
        after its anomaly an ANOMALY alert ends, in stream time (``_end_later``).
        ``state_cache_bytes``: what the entries kept decoded between flushes may weigh
        (``ExecutionStore``)."""
        self.topics = topics
        self.stores = stores
        self.state = ExecutionStore(stores.executions, state_cache_bytes)
        self.inflight = self.state.view("inflight")
        self.closed = self.state.view("closed")
        self.operations = self.state.view("operations")
        self.approvals = self.state.view("approvals")
        self.links = self.state.view("links")
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
        self.max_entry_bytes = max_entry_bytes
        self.anomaly_alert_ttl = anomaly_alert_ttl
        self._anomaly_ttl_ms = anomaly_alert_ttl // ONE_MS
        #: ids of the anomalies found while applying an input to its execution in the call
        #: being handled: their alerts' ends go with that execution's entry (``handle``)
        self._applied_anomalies: set[str] = set()
        #: per partition, the key of its own entry (``partition_home``)
        self._homes: dict[int, str] = {}
        self.rules = Rules(
            self.operation_config, self.thresholds_for, closed_retention, orphan_after
        )
        #: execution id -> partition (murmur2 of the id), memoised: several lookups per event
        self._partitions: dict[str, int] = {}
        self.allowed_lateness = allowed_lateness
        self.scheduler = Scheduler(
            self.input_names, stores.clocks, self._timers, allowed_lateness // ONE_MS
        )
        self.emitter = Emitter(
            topics,
            self.state.traces,
            self.partition_of,
            orphan_after=orphan_after,
            max_kept_bytes=max_kept_bytes,
        )
        #: the input being applied, if any (set until it is applied, so after an exception it
        #: names the input that raised it)
        self.applying: Envelope | None = None
        self._rank = self.scheduler.rank
        self.cross_execution = cross_execution
        self.claims_topic = topics.idempotency_claims.name
        #: per input partition, the watermark last published as progress to the claims
        #: topic, and the partitions that published claims since
        self._progress_sent: dict[int, int] = {}
        self._claimed: set[int] = set()
        #: per input partition, its latest watermark (what ``publish_progress`` tells)
        self._watermarks: dict[int, int] = {}

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
            allowed_lateness=settings.allowed_lateness,
            operation_config=policies.operations,
            thresholds=policies.thresholds,
            policies=policies.approval_policies,
            closed_retention=settings.closed_retention,
            orphan_after=settings.orphan_after,
            anomaly_alert_ttl=settings.anomaly_alert_ttl,
            max_entry_bytes=settings.max_entry_bytes,
            state_cache_bytes=settings.state_cache_mb * 1024 * 1024,
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

    def flush(self, partition: int | None = None, limit: int | None = None) -> int:
        """Write the state changes (of one partition, or all) to the tables. The live worker
        writes them to its tables' overlays before it publishes the outputs, and sends them
        once the outputs are delivered (``vigil_worker/pipeline.py``). ``limit``: the largest
        packed entry the table can store (``ExecutionStore.flush``)."""
        return self.state.flush(partition, limit)

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
        return {where: from_ms(ms) for where, ms in self.scheduler.last_tick.items()}

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
        self._applied_anomalies.clear()
        out = self._handle(env, token)
        if out:
            applied = self._applied_anomalies
            for i in range(len(out)):
                record = out[i].record
                cls = type(record)
                if cls is Anomaly:
                    alert = anomaly_alert(record)  # type: ignore[arg-type]
                    out.append(self.emitter.emit(alert))
                    routed = record.anomaly_id in applied  # type: ignore[union-attr]
                    self._end_later(alert, routed, env.partition, out)
                elif cls is Alert and record.kind is AlertKind.ANOMALY:  # type: ignore[union-attr]
                    self._end_later(record, False, env.partition, out)  # type: ignore[arg-type]
            applied.clear()
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
        if type(record) is RetryLink:
            # decided already, by the claims join: applied at once, in the order read
            scheduler.done(token)
            self._on_link(record, out)
            return out
        t = record.occurred_at  # type: ignore[attr-defined]
        t_ms = (t - EPOCH) // ONE_MS  # epoch_ms, inlined: once per record
        if type(record) is ev.ClockTick:
            scheduler.done(token)
            refusal = self._check_time(env, t, t_ms) or out_of_domain(record)
            if refusal is not None:
                out.append(self.emitter.anomaly(env, record, refusal))
                return out
            scheduler.note_tick(env.topic, env.partition, t_ms)
            self._observe(env, t_ms, out)
            return out
        if trace.malformed(record):
            self.counters.traceparents_dropped += 1  # applied all the same, without it
        refusal = self._check(env, record, t, t_ms)
        if refusal is not None:
            scheduler.done(token)
            out.append(self.emitter.anomaly(env, record, refusal))
            return out
        # Placed by its own topic partition's time (a fact of the log, the same in every run
        # and replay): at its event time, or, when it is more than the allowed lateness
        # behind, late and at that time minus the lateness. Never behind the watermark, so it
        # is held and applied in order with the deadlines around it (docs/rules.md#time).
        placed = scheduler.place(env, t_ms)
        if placed != t_ms:
            self.counters.late += 1
        scheduler.hold(env, placed, token)
        self._observe(env, t_ms, out)
        return out

    def _apply(self, env: Envelope, record: Record, out: list[Emission]) -> None:
        """One input, unless its effect is stored already (a redelivery), and unless it
        would make its execution's entry larger than ``max_entry_bytes`` (``_apply_measured``)."""
        # Left set if applying raises: the input the failure is about may be an event held
        # earlier and released by the record being handled, which is not its cause.
        self.applying = env
        execution_id: str = record.execution_id  # type: ignore[attr-defined]
        state = self.state
        position: Position | None = None
        committed = self.committed
        if committed is not None:
            position = (self._rank.get(env.topic, 0), env.partition, env.offset)
            # Below the committed offset, an input is applied and its effect stored, but its
            # entry may have forgotten its position (``ExecutionStore.mark_applied``): a copy
            # handed over again before the commit, held for the watermark meanwhile, is
            # released after it.
            below = committed(env.topic, env.partition)
            if (below is not None and env.offset < below) or state.applied(execution_id, position):
                self.counters.redelivered += 1
                if not isinstance(record, ev.ExecutionStatusChanged | ev.OperationEvent):
                    # its judgement is due at its own time, as when it was first applied
                    self._schedule(execution_id, epoch_ms(record.occurred_at))  # type: ignore[attr-defined]
                self.applying = None
                return
        if state.room(execution_id, input_growth(record), self.max_entry_bytes):
            if position is not None:
                state.mark_applied(execution_id, position, self._committed_by_rank)
            self._on_input(env, record, out)
        else:
            self._apply_measured(env, record, out, execution_id, position)
        self.applying = None

    def _apply_measured(
        self,
        env: Envelope,
        record: Record,
        out: list[Emission],
        execution_id: str,
        position: Position | None,
    ) -> None:
        """An input that might take its execution's entry past ``max_entry_bytes``: applied,
        then the entry measured exactly; if it is past the bound, the input is undone (the
        entry back as it was, its outputs and their counts dropped) and quarantined instead,
        a dead letter and a CRITICAL alert, and its partition moves on.

        Why: an entry is one changelog record, and a record larger than the changelog takes
        can never be written. Its batch would fail for ever, the outputs published before
        each failure would describe a state that is never stored, and every later input of
        the partition would wait behind it. The decision depends on the entry's content
        alone (``Entry.content_size``), so the live worker and a replay set aside the same
        inputs; ``input_growth`` over-estimates what an input adds, so an entry is measured
        before any input that could take it past the bound."""
        state = self.state
        before = state.snapshot(execution_id)
        mark, counted = len(out), self.counters.snapshot()
        if position is not None:
            state.mark_applied(execution_id, position, self._committed_by_rank)
        self._on_input(env, record, out)
        size = state.measure(execution_id)
        if size <= self.max_entry_bytes:
            return
        del out[mark:]
        self.counters = counted
        state.restore(execution_id, before, size)
        reason = (
            f"applied, it would make the entry of execution {bounded(execution_id, 200)!r} "
            f"{size:,} bytes packed, above the bound of {self.max_entry_bytes:,} "
            "(VIGIL_MAX_ENTRY_BYTES): an entry that large cannot be stored"
        )
        out.extend(self.emitter.quarantine(env, reason))

    def _on_input(self, env: Envelope, record: Record, out: list[Emission]) -> None:
        """The input into its execution's aggregate, the parts it replaced saved, its
        outputs published."""
        execution_id: str = record.execution_id  # type: ignore[attr-defined]
        execution: Execution = self.state.execution(execution_id, self._build)
        step = execution.apply(record)
        if execution.changed:
            self._store(execution)
        self._publish(execution_id, step, out, env, record)
        self._note_quiet(execution_id, execution)

    def _committed_by_rank(self, rank: int, partition: int) -> int | None:
        assert self.committed is not None
        return self.committed(self.input_names[rank], partition)

    # -- validation the core cannot do (it does not know keys or stream time) --------------
    def _check(
        self, env: Envelope, record: Record, t: datetime, t_ms: int
    ) -> AnomalyFinding | None:
        fields = record.__dict__
        execution_id = fields.get("execution_id")
        # Bytes against bytes: a key that is not UTF-8 must not pass by being decoded lossily.
        if execution_id is None or env.key != execution_id.encode("utf-8", "surrogatepass"):
            key = env.key.decode(errors="replace") if env.key is not None else None
            return AnomalyFinding(
                AnomalyKind.KEY_MISMATCH,
                f"Kafka key {bounded_or_none(key)!r} differs from execution_id "
                f"{bounded_or_none(execution_id)!r}: the record may sit in the wrong partition, "
                "away from the rest of its execution",
            )
        cls = type(record)
        names = _SYMBOL_FIELDS.get(cls)
        if names is None:
            names = _SYMBOL_FIELDS[cls] = tuple(
                n for n in ("decision", "outcome") if n in cls.model_fields
            )
        for field_name in names:
            if fields[field_name] == "UNRECOGNIZED":
                return AnomalyFinding(
                    AnomalyKind.UNRECOGNIZED_SYMBOL,
                    f"{record.avro_name}.{field_name} has a symbol this version does not know;"
                    " not applied (a decision vigil cannot read is not a decision)",
                )
        return self._check_time(env, t, t_ms) or out_of_domain(record)

    def _check_time(self, env: Envelope, t: datetime, t_ms: int) -> AnomalyFinding | None:
        """An event time vigil cannot place: before 1971, or more than ``max_future_skew``
        ahead of the record's own Kafka timestamp.

        Why the record timestamp: a future-skew check exists to catch a producer whose clock
        is broken, and the record timestamp is the one time in the record that the broker has
        checked against its own clock (an input topic refuses a timestamp more than
        ``message.timestamp.after.max.ms`` ahead of the broker's). It is part of the record, so
        the live run and every replay judge alike, and it does not depend on how far the
        worker has read the other topics, nor on gaps between the records of a sparse topic
        (a backfill may be quiet for hours). A record with no timestamp is not checked."""
        if t_ms < _EARLIEST_PLAUSIBLE_MS:
            return AnomalyFinding(
                AnomalyKind.TIME_OUT_OF_RANGE, f"event time {t.isoformat()} is before 1971"
            )
        timestamp_ms = env.timestamp_ms
        if timestamp_ms is not None and 0 <= timestamp_ms < t_ms - self._skew_ms:
            return AnomalyFinding(
                AnomalyKind.TIME_OUT_OF_RANGE,
                f"event time {t.isoformat()} is more than {self.max_future_skew} ahead of "
                f"its record timestamp {log_time(env).isoformat()}",
            )
        return None

    # -- the execution aggregate ----------------------------------------------------------
    def _execution(self, execution_id: str) -> Execution:
        """The execution's aggregate, built once per batch from its entry's parts."""
        return self.state.execution(execution_id, self._build)  # type: ignore[no-any-return]

    def _build(self, execution_id: str) -> Execution:
        state = self.state
        load, absent = state.load, state.absent

        def book(name: str) -> Any:
            return load(execution_id, name, _PARSE[name])

        # A book is decoded when first needed; one the entry does not have is known absent
        # at once, which is what lets ``Execution.quiet_until`` answer without decoding.
        return Execution(
            execution_id,
            self.rules,
            load(execution_id, "inflight", _in_flight),
            load(execution_id, "closed", _closed),
            None if absent(execution_id, "operations") else UNLOADED,
            None if absent(execution_id, "approvals") else UNLOADED,
            book,
        )

    def _note_quiet(self, execution_id: str, execution: Execution) -> None:
        """Tell the store until when advancing the execution has nothing to do, if its parts
        in hand say so exactly (``Execution.quiet_until``, and the ends of its alerts), so
        that ``_on_watermark`` passes over its stale due times without decoding it."""
        until = execution.quiet_until()
        state = self.state
        if until is None:
            state.quiet.pop(execution_id, None)
            return
        ends = state.load(execution_id, "alerts", al.load_ends)
        if ends and ends[0].ends_at < until:
            until = ends[0].ends_at
        state.quiet[execution_id] = until

    def _store(self, execution: Execution) -> None:
        """The parts the last call replaced, into the entry (written at the next flush)."""
        changed = execution.changed
        self.state.save_parts(execution.execution_id, execution, changed, _DUMP)
        changed.clear()

    def _advance_key(self, execution_id: str, horizon: int, out: list[Emission]) -> None:
        execution: Execution = self.state.execution(execution_id, self._build)
        step = execution.advance(horizon)
        self.state.grow(execution_id, ADVANCE_GROWTH + OUTPUT_GROWTH * len(step.outputs))
        if execution.changed:
            self._store(execution)
        if step.outputs or step.due:
            self._publish(execution_id, step, out)
        ends = self.state.load(execution_id, "alerts", al.load_ends)
        if ends and ends[0].ends_at <= horizon:
            rest, resolved = al.due_ends(ends, horizon)
            self.state.save(execution_id, "alerts", rest or None, al.dump_ends)
            emit = self.emitter.emit
            out.extend(emit(a) for a in resolved)
            if rest:
                self._schedule(execution_id, rest[0].ends_at)
        self._note_quiet(execution_id, execution)

    # -- the ends of anomaly alerts (streams.core.alerts) -----------------------------------
    def _end_later(self, alert: Alert, routed: bool, partition: int, out: list[Emission]) -> None:
        """Keep the end of a FIRING ANOMALY alert, ``anomaly_alert_ttl`` after it, to publish
        once stream time reaches it (``_advance_key``); the RESOLVED alerts of ends brought
        forward by it go out now (``alerts.add_end``).

        Where it is kept: with the execution's entry when the anomaly was found applying an
        input to it (``routed``): the entry says in the same record that the input was
        applied, so after a crash it holds both or neither. Else (an input refused as it was
        read, a clock tick, a quarantined record) with the partition's own entry
        (``partition_home``): those are found again when their input is read again, and their
        input is acknowledged only after the entries are stored."""
        if alert.status is not AlertStatus.FIRING:
            return
        home = alert.execution_id if routed else self.partition_home(partition)
        ends = self.state.load(home, "alerts", al.load_ends)
        new, early = al.add_end(ends, al.anomaly_end(alert, self._anomaly_ttl_ms))
        if new is ends:
            return
        self.state.save(home, "alerts", new, al.dump_ends)
        self._schedule(home, new[0].ends_at)
        out.extend(self.emitter.emit(a) for a in early)

    def partition_home(self, partition: int) -> str:
        """The key of the partition's own entry, which holds only the ends of alerts that
        belong to no execution of it: a key that murmur2 puts on that partition, so that the
        entry, its changelog record and its timers all live where the partition's inputs do.
        A producer using such an id as an execution id shares the entry, harmlessly: the ends
        kept there are a set, whoever they belong to."""
        home = self._homes.get(partition)
        if home is None:
            n = 0
            while True:
                home = f"\x00vigil-partition-{partition}-{n}"
                if self.partition_of(home) == partition:
                    break
                n += 1
            self._homes[partition] = home
        return home

    def _publish(
        self,
        execution_id: str,
        step: Step,
        out: list[Emission],
        env: Envelope | None = None,
        record: Record | None = None,
    ) -> None:
        """A step's outputs to the emitter, in order, and its due times to the scheduler.
        An input's trace context is remembered before the outputs it caused are stamped."""
        emit = self.emitter.emit
        outputs, trace_key, traced_from = step.outputs, step.trace_key, step.traced_from
        for i, item in enumerate(outputs):
            if i == traced_from and trace_key is not None:
                self._remember_trace(record, trace_key)  # type: ignore[arg-type]
            cls = type(item)
            if cls is Verdict:
                emitted = emit(item.record)  # type: ignore[union-attr]
                out.append(emitted)
                alerts = verdict_alerts(emitted.record, item.previous_id)  # type: ignore[arg-type, union-attr]
                out.extend(emit(a) for a in alerts)
            elif cls is Refusal:
                found = self.emitter.anomaly(env, record, item.finding)  # type: ignore[arg-type, union-attr]
                self._applied_anomalies.add(found.record.anomaly_id)  # type: ignore[attr-defined]
                out.append(found)
            elif cls is Orphan:
                found = self.emitter.orphan(execution_id, item.request_id, item.last_fact)  # type: ignore[union-attr]
                self._applied_anomalies.add(found.record.anomaly_id)  # type: ignore[attr-defined]
                out.append(found)
            elif cls is OperationState and self.cross_execution:
                out.append(emit(self._across(item)))  # type: ignore[arg-type]
            else:
                out.append(emit(item))  # type: ignore[arg-type]
        if trace_key is not None and traced_from >= len(outputs):
            self._remember_trace(record, trace_key)  # type: ignore[arg-type]
        if self.cross_execution:
            op_ids = {o.operation_id for o in outputs if type(o) is OperationState}
            if op_ids:
                self._claim(execution_id, op_ids, out)
                self._end_blind_retries(execution_id, op_ids, out)
        if step.due:
            schedule = self.scheduler.schedule
            partition = self.partition_of(execution_id)
            for due in step.due:
                schedule(partition, due, execution_id)
            # (the caller, ``_on_input`` or ``_advance_key``, tells the quiet instant next)

    # -- timers and stream time ------------------------------------------------------------
    def _schedule(self, execution_id: str, due: int) -> None:
        self.scheduler.schedule(self.partition_of(execution_id), due, execution_id)
        self.state.quiet.pop(execution_id, None)

    def _timers(self, partition: int) -> Timers:
        """The partition's due times as its tables say (``Scheduler.index``): each stored
        execution's ``next_due``, and the executions whose facts were stored but not judged
        before a late one (judged first)."""
        due: list[DueTime] = []
        judge_first: set[str] = set()
        quiet = self.state.quiet
        # Only the partition's own entries are decoded: each partition's index is rebuilt on
        # its own, so decoding them all would cost every entry once per partition.
        for key, entry in self.state.entries(lambda k: self.partition_of(k) == partition):
            execution = Execution(
                key,
                self.rules,
                *(None if text is None else parse(text) for text, parse in _parts(entry)),
            )
            due.extend(DueTime(t, key) for t in execution.next_due())
            end = al.next_end(al.load_ends(entry.alerts)) if entry.alerts else None
            if end is not None:
                due.append(DueTime(end, key))
            if execution.pending_dirty():
                judge_first.add(key)
            # what ``_note_quiet`` would say of it: its due times as rebuilt here
            until = execution.quiet_until()
            if until is not None:
                quiet[key] = until if end is None else min(until, end)
        return Timers(due, judge_first)

    def _observe(self, env: Envelope, t_ms: int, out: list[Emission]) -> None:
        watermark = self.scheduler.observe(env, t_ms)
        if watermark is not None:
            self._on_watermark(env.partition, watermark, out)

    def _on_watermark(self, partition: int, watermark_ms: int, out: list[Emission]) -> None:
        """Apply every held event and advance every execution due strictly before the
        watermark, in the scheduler's order."""
        done = self.scheduler.done
        quiet = self.state.quiet
        for item in self.scheduler.release(partition, watermark_ms):
            if type(item) is Due:
                at = item.at_ms
                for key in item.execution_ids:
                    until = quiet.get(key)
                    if until is None or until <= at:
                        self._advance_key(key, at, out)
                    # else a stale due time: advancing to it would change nothing
            else:
                env = item.env  # type: ignore[union-attr]
                record = env.record
                assert record is not None
                self._apply(env, record, out)
                done(item.token)  # type: ignore[union-attr]
        if self.cross_execution:
            self._progress(partition, watermark_ms, out)

    # -- blind retries across executions (streams.core.claims, streams.core.cross) ----------
    def _claim(self, execution_id: str, op_ids: set[str], out: list[Emission]) -> None:
        """A claim for every attempt with an idempotency key of each operation whose state
        the step published (an unchanged attempt's claim is a repetition the join ignores)."""
        book = self._execution(execution_id).operations
        if book is None:
            return
        for claim in cl.claims_of(book, sorted(op_ids)):
            record = cl.claim_record(claim)
            self.counters.outputs[record.avro_name] += 1
            out.append(
                Emission(self.claims_topic, cl.claims_key(claim.connector, claim.key), record)
            )
            self._claimed.add(self.partition_of(execution_id))

    def publish_progress(self) -> list[Emission]:
        """Progress for every input partition whose latest watermark is not told yet, however
        little it moved: what a replay publishes once its last input is handled, so that the
        join decides everything the watermark passed (live, the ticks keep it moving)."""
        out: list[Emission] = []
        if self.cross_execution:
            for partition, watermark_ms in sorted(self._watermarks.items()):
                self._progress(partition, watermark_ms, out, every=True)
        return out

    def _progress(
        self, partition: int, watermark_ms: int, out: list[Emission], every: bool = False
    ) -> None:
        """Tell every claims partition how far this partition's claims are complete: after
        claims, at the next watermark; else at most once a second of event time (``every``:
        whenever it moved)."""
        self._watermarks[partition] = watermark_ms
        last = self._progress_sent.get(partition)
        if last is not None and watermark_ms <= last:
            return
        if (
            not every
            and partition not in self._claimed
            and last is not None
            and watermark_ms - last < 1000
        ):
            return
        self._claimed.discard(partition)
        self._progress_sent[partition] = watermark_ms
        record = cl.progress_record(partition, self.partitions, watermark_ms)
        for p in range(self.partitions):
            out.append(Emission(self.claims_topic, None, record, (), p))

    def _across(self, state: OperationState) -> OperationState:
        """An operation's state with the other executions' attempts in its verdict."""
        links = self.state.load(state.execution_id, "links", cross.load_links)
        return state if links is None else cross.overlay(state, links)

    def _on_link(self, link: RetryLink, out: list[Emission]) -> None:
        """What the claims join tells this execution: kept, the operation's state published
        again if its verdict or holder changed, and the FORBIDDEN_RETRY alert of the later
        send."""
        execution_id = link.execution_id
        state = self.state
        links = state.load(execution_id, "links", cross.load_links)
        new, changed = cross.apply_link(links, link, epoch_ms(link.occurred_at))
        if not changed:
            return
        state.save(execution_id, "links", new, cross.dump_links)
        book = self._execution(execution_id).operations
        if book is not None and link.operation_id in book.operations:
            base = next(s for s in ops.current_states(book) if s.operation_id == link.operation_id)
            after = cross.overlay(base, new)
            if after != cross.overlay(base, links):
                out.append(self.emitter.emit(after))
        alert = cross.blind_retry_alert(link)
        if alert is not None:
            out.append(self.emitter.emit(alert))
        self._end_blind_retries(execution_id, {link.operation_id}, out)

    def _end_blind_retries(self, execution_id: str, op_ids: set[str], out: list[Emission]) -> None:
        """The RESOLVED alerts of the blind retries of these operations whose two attempts
        are now both settled (``cross.ended_alerts``), the links kept without them."""
        links = self.state.load(execution_id, "links", cross.load_links)
        if links is None:
            return
        book = self._execution(execution_id).operations
        new, ended = cross.ended_alerts(links, book, op_ids)
        if ended:
            self.state.save(execution_id, "links", new, cross.dump_links)
            out.extend(self.emitter.emit(a) for a in ended)

    # -- trace context --------------------------------------------------------------------
    def _traces(self, execution_id: str) -> dict[str, str] | None:
        return self.state.traces(execution_id)

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
        self.state.partition = env.partition
        out = self.emitter.quarantine(env, reason)
        for emission in list(out):
            if type(emission.record) is Alert:
                self._end_later(emission.record, False, env.partition, out)
        return out

    def partition_of(self, execution_id: str) -> int:
        partition = self._partitions.get(execution_id)
        if partition is None:
            if len(self._partitions) >= 1 << 16:
                self._partitions.clear()  # a memo, not state: bounded by forgetting
            partition = partition_of(execution_id, self.partitions)
            self._partitions[execution_id] = partition
        return partition


#: Per input type, its fields that carry a symbol its producer may know and vigil may not
#: (filled as types are met).
_SYMBOL_FIELDS: dict[type[Record], tuple[str, ...]] = {}
_EARLIEST_PLAUSIBLE_MS = epoch_ms(EARLIEST_PLAUSIBLE)


def _dump_traces(traces: dict[str, str]) -> str:
    return json.dumps(traces, separators=(",", ":"))


def _in_flight(text: str) -> ex.InFlight | None:
    slot = ex.load_slot(text)
    return slot if isinstance(slot, ex.InFlight) else None


def _closed(text: str) -> ex.Closed | None:
    slot = ex.load_slot(text)
    return slot if isinstance(slot, ex.Closed) else None


def _parts(entry: Any) -> tuple[tuple[str | None, Callable[[str], Any]], ...]:
    """An entry's four parts as text, each with what parses it."""
    return (
        (entry.inflight, _in_flight),
        (entry.closed, _closed),
        (entry.operations, ops.load_book),
        (entry.approvals, ap.Ledger.loads),
    )


def _dump_json(model: Any) -> str:
    return model.model_dump_json()  # type: ignore[no-any-return]


#: How each book of an execution is read from its entry.
_PARSE: dict[str, Callable[[str], Any]] = {
    "operations": ops.load_book,
    "approvals": ap.Ledger.loads,
}

#: How each part of an execution is written into its entry.
_DUMP: dict[str, Callable[[Any], str]] = {
    "inflight": ex.dump_slot,
    "closed": ex.dump_slot,
    "operations": ops.dump_book,
    "approvals": ap.Ledger.dumps,
}
