"""The recorder's public API: typed calls for every input fact vigil reads.

    from streams.recorder import Recorder

    recorder = Recorder.from_env()
    run = recorder.execution("exec-1")
    run.status("running")
    op = run.operation("op-1", connector="payments", idempotency_key="refund-42")
    op.sent(reply_due=timedelta(seconds=30))
    op.acknowledged()
    op.verified(effect_ref="refund/8812")
    req = run.approval("req-1", action="deploy", arguments={"service": "api", "version": "1.4"},
                       approver="role:release-owner", resume_handle="checkpoint://t1/c9",
                       risk="high", policy="prod-deploy")
    req.delivered()
    req.decided("accept")
    run.heartbeat()
    run.resumed("req-1")
    recorder.flush()
    recorder.close()

Every call validates its arguments at once (``InvalidFact``, naming the field), builds the
contract record the worker reads (``streams.recorder.facts``), and returns it after putting it
in the recorder's queue: it never waits on the broker or the registry. A background thread
delivers the queue (``streams.recorder.delivery``); ``flush()`` waits for it, and an exit hook
flushes what is left when the process ends. Facts the broker cannot take are spooled to a
local file and sent in order when it answers again.

The calls are plain methods for asyncio code too: they do not block. ``AsyncRecorder`` adds
awaitable ``flush`` and ``aclose`` (run in a thread), for agents that must not block their
event loop even while flushing.

Event time (``occurred_at``) is the caller's clock (``clock``, injectable; each call takes an
``at=`` too), and the current W3C trace context is attached when OpenTelemetry is installed
and a span is active (``traceparent=`` overrides it).
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import logging
import os
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from streams.contracts.codec import AvroCodec
from streams.contracts.models.base import Record
from streams.contracts.models.enums import (
    DecisionCode,
    DeliveryOutcome,
    EvidenceSource,
    ExecutionStatus,
    OperationEventKind,
    Risk,
)
from streams.contracts.models.events import (
    ApprovalDecision,
    ApprovalDelivery,
    ApprovalRequested,
    ApproverAcknowledgement,
    CurrentActionDigest,
    ExecutionStatusChanged,
    OperationEvent,
    RequesterHeartbeat,
    ResumeReceipt,
)
from streams.core.executions import TERMINAL
from streams.durations import parse_duration
from streams.kafka.topics import Topics
from streams.recorder import facts as f
from streams.recorder.delivery import Counts, Delivery, Fact
from streams.settings import Settings, SettingsError

log = logging.getLogger("vigil.recorder")

Clock = Callable[[], datetime]
When = datetime | timedelta | float | None

K = OperationEventKind
#: executions whose last sequence a recorder remembers (the sequence is time-based, so one
#: forgotten continues from its clock; an ended one is forgotten at once)
MAX_SEQUENCES = 100_000


def utc_now() -> datetime:
    return datetime.now(UTC)


# ---------------------------------------------------------------------------------------------
# Trace context


_trace_api: Any = None


def current_traceparent() -> str | None:
    """The W3C traceparent of the current OpenTelemetry span, or None when no span is
    active or OpenTelemetry (``opentelemetry-api``) is not installed: an optional import,
    looked up once."""
    global _trace_api
    if _trace_api is None:
        try:
            from opentelemetry import trace

            _trace_api = trace
        except ImportError:
            _trace_api = False
    if _trace_api is False:
        return None
    ctx = _trace_api.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


# ---------------------------------------------------------------------------------------------
# Metrics: the counts of this process's recorders, read at scrape time (no cost per fact)

_live: weakref.WeakSet[Recorder] = weakref.WeakSet()
_retired = Counts()
_OUTCOMES = ("recorded", "delivered", "spooled", "replayed", "rejected")


class _Collector:
    """``vigil_recorder_facts_total{outcome}``, ``vigil_recorder_outages_total`` and
    ``vigil_recorder_backlog`` in the process's default Prometheus registry, for an agent
    that serves ``/metrics``."""

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        live = list(_live)
        facts = CounterMetricFamily(
            "vigil_recorder_facts",
            "Facts recorded by this process, and what became of them: delivered, spooled "
            "(the broker could not take them), replayed (spooled, then delivered), rejected "
            "(refused by the broker for good, kept in the .rejected file)",
            labels=["outcome"],
        )
        for outcome in _OUTCOMES:
            total = getattr(_retired, outcome) + sum(getattr(r.counts, outcome) for r in live)
            facts.add_metric([outcome], total)
        yield facts
        outages = CounterMetricFamily(
            "vigil_recorder_outages", "Times a recorder of this process started spooling"
        )
        outages.add_metric([], _retired.outages + sum(r.counts.outages for r in live))
        yield outages
        backlog = GaugeMetricFamily(
            "vigil_recorder_backlog", "Facts recorded and not delivered yet (queued or spooled)"
        )
        backlog.add_metric([], sum(r.backlog() for r in live))
        yield backlog


def _register_collector() -> None:
    from prometheus_client import REGISTRY

    REGISTRY.register(_Collector())  # type: ignore[arg-type]


_register_collector()


# ---------------------------------------------------------------------------------------------
# Settings


@dataclass(frozen=True, slots=True)
class RecorderSettings:
    """How a recorder delivers: where it spools, when it starts to, how much it queues."""

    #: VIGIL_RECORDER_SPOOL_DIR — where the spool file lives (default ``<VIGIL_DATA_DIR>/recorder``)
    spool_dir: str = "vigil-data/recorder"
    #: VIGIL_RECORDER_NAME — the spool file's name: one per recorder process on a machine
    name: str = "recorder"
    #: VIGIL_RECORDER_SPOOL_AFTER — a fact undelivered this long starts spooling
    spool_after: timedelta = timedelta(seconds=5)
    #: VIGIL_RECORDER_QUEUE — facts the producer's queue holds before spooling starts
    queue_max: int = 100_000
    #: seconds ``close`` (and the exit hook) waits for the queue to be delivered
    close_timeout: float = 10.0
    #: seconds at most between two fsyncs of the spool
    fsync_interval: float = 1.0

    @classmethod
    def from_env(cls, settings: Settings | None = None) -> RecorderSettings:
        env = os.environ
        data_dir = (settings or Settings.from_env()).data_dir
        out = cls(spool_dir=str(Path(data_dir) / "recorder"))
        if env.get("VIGIL_RECORDER_SPOOL_DIR"):
            out = replace(out, spool_dir=env["VIGIL_RECORDER_SPOOL_DIR"])
        if env.get("VIGIL_RECORDER_NAME"):
            out = replace(out, name=env["VIGIL_RECORDER_NAME"])
        if env.get("VIGIL_RECORDER_SPOOL_AFTER"):
            text = env["VIGIL_RECORDER_SPOOL_AFTER"]
            try:
                value = parse_duration(text)
            except ValueError:
                value = timedelta(-1)
            if value <= timedelta(0):
                raise SettingsError(
                    f"VIGIL_RECORDER_SPOOL_AFTER={text!r} is not a duration above zero "
                    "(e.g. 5s, 500ms)"
                )
            out = replace(out, spool_after=value)
        if env.get("VIGIL_RECORDER_QUEUE"):
            text = env["VIGIL_RECORDER_QUEUE"]
            if not text.isdigit() or int(text) < 1:
                raise SettingsError(f"VIGIL_RECORDER_QUEUE={text!r} is not a whole number >= 1")
            out = replace(out, queue_max=int(text))
        return out

    @property
    def spool_path(self) -> Path:
        return Path(self.spool_dir) / f"{self.name}.spool"


# ---------------------------------------------------------------------------------------------
# The recorder


class Recorder:
    """Publishes an agent process's facts to vigil's input topics (see the module's
    docstring). Thread-safe: calls from several threads are ordered as they are made."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        recorder_settings: RecorderSettings | None = None,
        codec: AvroCodec | None = None,
        clock: Clock = utc_now,
        agent_id: str | None = None,
        producer_config: Mapping[str, Any] | None = None,
        exit_hook: bool = True,
    ) -> None:
        self.settings = settings or Settings.from_env()
        self.options = recorder_settings or RecorderSettings.from_env(self.settings)
        self.clock = clock
        self.agent_id = agent_id
        self.codec = codec or AvroCodec.connect(self.settings.registry_config())
        topics = Topics.from_settings(self.settings)
        self._topic_of: dict[type[Record], str] = {
            model: spec.name for spec in topics.inputs() for model in spec.value_types
        }
        conf = self.settings.confluent_conf() | {
            # co-partitioned with the worker and every other producer (topology.md, Topics)
            "partitioner": "murmur2_random",
            # retries keep the order of a partition and write a fact once
            "enable.idempotence": True,
            # never give a fact up on a timer: an outage is the spool's business
            "message.timeout.ms": 0,
            "linger.ms": 5,
            "queue.buffering.max.messages": self.options.queue_max,
            "client.id": f"vigil-recorder-{self.options.name}",
            # librdkafka's own messages (a refused connection...) as log records, not stderr
            "logger": logging.getLogger("vigil.recorder.kafka"),
        }
        conf.update(producer_config or {})
        #: orders the facts: a fact's number, its sequence and its place in the queue are
        #: taken together, so the queue's order is the order of the calls
        self._lock = threading.RLock()
        self._n = itertools.count()
        self._sequences: dict[str, int] = {}
        self._closed = False
        self._delivery = Delivery(
            conf,
            self.codec,
            self.options.spool_path,
            spool_after=self.options.spool_after.total_seconds(),
            fsync_interval=self.options.fsync_interval,
        )
        self._exit_hook = exit_hook
        if exit_hook:
            atexit.register(self._at_exit)
        _live.add(self)

    @classmethod
    def from_env(cls, **kwargs: Any) -> Recorder:
        """A recorder configured by the environment (KAFKA_BOOTSTRAP_SERVERS,
        SCHEMA_REGISTRY_URL, VIGIL_TOPIC_PREFIX, the Kafka security settings and the
        VIGIL_RECORDER_* variables); keyword arguments as for the constructor."""
        return cls(Settings.from_env(), **kwargs)

    # -- handles ----------------------------------------------------------------------
    def execution(self, execution_id: str, *, agent_id: str | None = None) -> ExecutionRun:
        """The handle through which one execution's facts are recorded."""
        if not isinstance(execution_id, str) or not execution_id:
            raise f.InvalidFact(
                f"execution_id: a non-empty string is required (got {execution_id!r})",
                "execution_id",
            )
        return ExecutionRun(self, execution_id, agent_id or self.agent_id)

    # -- delivery ---------------------------------------------------------------------
    def record(self, record: Record) -> Record:
        """Queue one input record as it is (the typed calls build theirs and come here):
        to the input topic of its type, keyed by its execution id."""
        if self._closed:
            raise RuntimeError("this recorder is closed")
        topic = self._topic_of.get(type(record))
        if topic is None or record.key_field is None:
            raise f.InvalidFact(f"{type(record).__name__} is not an input fact vigil reads")
        with self._lock:
            n = next(self._n)
            self._delivery.counts.recorded += 1
            self._delivery.put(Fact(n, topic, record))
        return record

    def flush(self, timeout: float = 30.0) -> int:
        """Wait until everything recorded so far is delivered, at most ``timeout`` seconds;
        returns how many facts are not delivered yet (queued or spooled, none lost)."""
        return self._delivery.flush(timeout)

    def close(self, timeout: float | None = None) -> int:
        """Flush (``timeout``, default ``close_timeout``), stop the delivery thread and keep
        whatever is undelivered in the spool file, for the next recorder started on it.
        Returns the number of facts left there. A second close does nothing."""
        if self._closed:
            return 0
        self._closed = True
        if self._exit_hook:
            atexit.unregister(self._at_exit)
        left = self._delivery.close(self.options.close_timeout if timeout is None else timeout)
        _live.discard(self)
        for outcome in (*_OUTCOMES, "outages"):
            setattr(_retired, outcome, getattr(_retired, outcome) + getattr(self.counts, outcome))
        return left

    def _at_exit(self) -> None:
        left = self.close()
        if left:
            log.warning("recorder: %d facts kept in %s at exit", left, self.options.spool_path)

    @property
    def counts(self) -> Counts:
        """Facts recorded, delivered, spooled, replayed after an outage, rejected; outages."""
        return self._delivery.counts

    @property
    def spooling(self) -> bool:
        """Whether facts are going to the spool file now (the broker did not take them)."""
        return self._delivery.spooling

    def backlog(self) -> int:
        """Facts recorded and not delivered yet."""
        return self._delivery.backlog()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- for the handles ----------------------------------------------------------------
    def _now(self, at: datetime | None) -> datetime:
        return f.aware(at, "at") if at is not None else self.clock()

    def _trace(self, traceparent: str | None) -> str | None:
        return traceparent if traceparent is not None else current_traceparent()

    def _sequence(self, execution_id: str, at: datetime, given: int | None) -> int:
        with self._lock:
            previous = self._sequences.get(execution_id)
            if given is not None:
                if isinstance(given, bool) or not isinstance(given, int) or given < 0:
                    raise f.InvalidFact(
                        f"sequence: must be a whole number of 0 or more (got {given!r})",
                        "sequence",
                    )
                seq = given
            else:
                seq = f.next_sequence(previous, at)
            self._sequences.pop(execution_id, None)
            self._sequences[execution_id] = max(seq, previous or seq)
            if len(self._sequences) > MAX_SEQUENCES:
                # the least recently changed: its next sequence falls back on its clock
                del self._sequences[next(iter(self._sequences))]
            return seq

    def _ended(self, execution_id: str) -> None:
        with self._lock:
            self._sequences.pop(execution_id, None)


class ExecutionRun:
    """One execution's facts: its status changes, its operations, approval requests,
    heartbeats, current action and resume receipts."""

    def __init__(self, recorder: Recorder, execution_id: str, agent_id: str | None) -> None:
        self.recorder = recorder
        self.execution_id = execution_id
        self.agent_id = agent_id

    def status(
        self,
        status: ExecutionStatus | str,
        *,
        reason: str | None = None,
        at: datetime | None = None,
        sequence: int | None = None,
        traceparent: str | None = None,
    ) -> ExecutionStatusChanged:
        """The execution's status changed (``"running"``, ``ExecutionStatus.COMPLETED``...).
        The sequence is the recorder's (see ``facts.next_sequence``) unless given."""
        rec = self.recorder
        code = f.symbol(ExecutionStatus, status, "status")
        when = rec._now(at)
        trace = rec._trace(traceparent)
        with rec._lock:  # a higher sequence is never queued before a lower one
            seq = rec._sequence(self.execution_id, when, sequence)
            record = f.status_changed(
                self.execution_id,
                code,
                when,
                seq,
                agent_id=self.agent_id,
                reason=reason,
                traceparent=trace,
            )
            rec.record(record)
            if code in TERMINAL:
                rec._ended(self.execution_id)
        return record

    def operation(
        self,
        operation_id: str,
        *,
        connector: str,
        idempotency_key: str | None = None,
        attempt: int = 1,
    ) -> OperationRun:
        """The handle of one attempt of an external operation (``attempt`` from 1)."""
        if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
            raise f.InvalidFact(
                f"attempt: must be an integer of 1 or more (got {attempt!r})", "attempt"
            )
        if not isinstance(operation_id, str) or not operation_id:
            raise f.InvalidFact(
                f"operation_id: a non-empty string is required (got {operation_id!r})",
                "operation_id",
            )
        if not isinstance(connector, str):
            raise f.InvalidFact(f"connector: a string is required (got {connector!r})", "connector")
        return OperationRun(self, operation_id, connector, idempotency_key, attempt)

    def approval(
        self,
        request_id: str,
        *,
        action: str,
        arguments: Mapping[str, Any] | None = None,
        action_digest: str | None = None,
        approver: str | None = None,
        resume_handle: str | None = None,
        risk: Risk | str = Risk.LOW,
        policy: str | None = None,
        expires: When = None,
        grace: timedelta | float | None = None,
        heartbeat_fresh: timedelta | float | None = None,
        delivery_deadline: timedelta | float | None = None,
        at: datetime | None = None,
        traceparent: str | None = None,
    ) -> ApprovalRun:
        """Records the approval request now and returns its handle. The digest is
        ``facts.action_digest(action, arguments)`` unless ``action_digest`` gives it;
        ``expires`` is a time or a delay after the request; the thresholds override the
        policy's (docs/rules.md#thresholds)."""
        rec = self.recorder
        when = rec._now(at)
        digest = action_digest if action_digest is not None else f.action_digest(action, arguments)
        record = f.approval_requested(
            self.execution_id,
            request_id,
            when,
            action=action,
            digest=digest,
            approver_ref=approver,
            resume_handle=resume_handle,
            risk=risk,
            policy=policy,
            expires_at=f.due(expires, when, "expires"),
            grace_seconds=f.seconds(grace, "grace"),
            heartbeat_fresh_seconds=f.seconds(heartbeat_fresh, "heartbeat_fresh"),
            delivery_deadline_seconds=f.seconds(delivery_deadline, "delivery_deadline"),
            traceparent=rec._trace(traceparent),
        )
        rec.record(record)
        return ApprovalRun(self, request_id, digest, record)

    def request(self, request_id: str, *, action_digest: str | None = None) -> ApprovalRun:
        """The handle of a request recorded elsewhere (another process, an approval
        service), to record its delivery, acknowledgement, decision or receipt."""
        if not isinstance(request_id, str) or not request_id:
            raise f.InvalidFact(
                f"request_id: a non-empty string is required (got {request_id!r})", "request_id"
            )
        return ApprovalRun(self, request_id, action_digest, None)

    def heartbeat(
        self,
        *,
        resume_handle: str | None = None,
        at: datetime | None = None,
        traceparent: str | None = None,
    ) -> RequesterHeartbeat:
        """The requester is alive and can take an answer (the live-resume proof)."""
        rec = self.recorder
        record = f.requester_heartbeat(
            self.execution_id,
            rec._now(at),
            resume_handle=resume_handle,
            traceparent=rec._trace(traceparent),
        )
        rec.record(record)
        return record

    def current_action(
        self,
        action: str | None = None,
        arguments: Mapping[str, Any] | None = None,
        *,
        action_digest: str | None = None,
        at: datetime | None = None,
        traceparent: str | None = None,
    ) -> CurrentActionDigest:
        """The action the run is on now, as its digest (from ``action`` and ``arguments``,
        or given): a pending request for another digest becomes STALE_REQUEST."""
        if action_digest is None:
            if action is None:
                raise f.InvalidFact("action: give the action (and arguments) or action_digest")
            action_digest = f.action_digest(action, arguments)
        rec = self.recorder
        record = f.current_action_digest(
            self.execution_id, action_digest, rec._now(at), traceparent=rec._trace(traceparent)
        )
        rec.record(record)
        return record

    def resumed(
        self,
        request_id: str,
        *,
        next_status: ExecutionStatus | str | None = None,
        at: datetime | None = None,
        traceparent: str | None = None,
    ) -> ResumeReceipt:
        """The run took the decision on ``request_id`` and moved on (the resume receipt)."""
        rec = self.recorder
        record = f.resume_receipt(
            self.execution_id,
            request_id,
            rec._now(at),
            next_status=next_status,
            traceparent=rec._trace(traceparent),
        )
        rec.record(record)
        return record


class OperationRun:
    """One attempt of an operation: prepared, sent, acknowledged, verified, failed,
    cancelled. ``retry()`` is the handle of the next attempt."""

    def __init__(
        self,
        run: ExecutionRun,
        operation_id: str,
        connector: str,
        idempotency_key: str | None,
        attempt: int,
    ) -> None:
        self.run = run
        self.operation_id = operation_id
        self.connector = connector
        self.idempotency_key = idempotency_key
        self.attempt = attempt

    def _event(
        self,
        kind: OperationEventKind,
        when: datetime,
        traceparent: str | None,
        source: EvidenceSource | str = EvidenceSource.RUNTIME,
        **fields: Any,
    ) -> OperationEvent:
        rec = self.run.recorder
        record = f.operation_event(
            self.run.execution_id,
            self.operation_id,
            self.attempt,
            kind,
            when,
            connector=self.connector,
            idempotency_key=self.idempotency_key,
            source=source,
            traceparent=rec._trace(traceparent),
            **fields,
        )
        rec.record(record)
        return record

    def prepared(
        self, *, at: datetime | None = None, traceparent: str | None = None
    ) -> OperationEvent:
        """Intent recorded, nothing sent yet."""
        when = self.run.recorder._now(at)
        return self._event(K.PREPARED, when, traceparent)

    def sent(
        self,
        *,
        reply_due: When = None,
        at: datetime | None = None,
        traceparent: str | None = None,
    ) -> OperationEvent:
        """Handed to the connector. ``reply_due``: the reply deadline, a time or a delay after
        the send (none: the connector's reply timeout, docs/rules.md#deadlines)."""
        when = self.run.recorder._now(at)
        return self._event(
            K.SENT, when, traceparent, reply_due_at=f.due(reply_due, when, "reply_due")
        )

    def acknowledged(
        self,
        *,
        verify_due: When = None,
        source: EvidenceSource | str = EvidenceSource.RUNTIME,
        at: datetime | None = None,
        traceparent: str | None = None,
    ) -> OperationEvent:
        """The connector answered (transport only, not the effect); ``verify_due``: the
        verification deadline, a time or a delay."""
        when = self.run.recorder._now(at)
        return self._event(
            K.ACKNOWLEDGED,
            when,
            traceparent,
            source,
            verify_due_at=f.due(verify_due, when, "verify_due"),
        )

    def verified(
        self,
        *,
        effect_ref: str | None = None,
        source: EvidenceSource | str = EvidenceSource.RUNTIME,
        at: datetime | None = None,
        traceparent: str | None = None,
    ) -> OperationEvent:
        """The effect was confirmed by reading the source; ``effect_ref`` names it there."""
        when = self.run.recorder._now(at)
        return self._event(K.VERIFIED, when, traceparent, source, effect_ref=effect_ref)

    def failed(
        self,
        *,
        detail: str | None = None,
        source: EvidenceSource | str = EvidenceSource.RUNTIME,
        at: datetime | None = None,
        traceparent: str | None = None,
    ) -> OperationEvent:
        """An explicit rejection: the effect cannot have happened."""
        when = self.run.recorder._now(at)
        return self._event(K.FAILED, when, traceparent, source, detail=detail)

    def cancelled(
        self,
        *,
        detail: str | None = None,
        source: EvidenceSource | str = EvidenceSource.RUNTIME,
        at: datetime | None = None,
        traceparent: str | None = None,
    ) -> OperationEvent:
        """Cancelled before any effect."""
        when = self.run.recorder._now(at)
        return self._event(K.CANCELLED, when, traceparent, source, detail=detail)

    def retry(self) -> OperationRun:
        """The handle of the next attempt of this operation (same connector and key)."""
        return OperationRun(
            self.run, self.operation_id, self.connector, self.idempotency_key, self.attempt + 1
        )


class ApprovalRun:
    """One approval request: its deliveries, the approver's acknowledgement, the decision
    and the run's resume receipt."""

    def __init__(
        self,
        run: ExecutionRun,
        request_id: str,
        action_digest: str | None,
        requested: ApprovalRequested | None,
    ) -> None:
        self.run = run
        self.request_id = request_id
        self.action_digest = action_digest
        #: the request record, when this handle recorded it
        self.requested = requested

    def delivered(
        self,
        *,
        route: str | None = None,
        at: datetime | None = None,
        traceparent: str | None = None,
    ) -> ApprovalDelivery:
        """The request reached its route (transport evidence only)."""
        return self._delivery(DeliveryOutcome.DELIVERED, route, at, traceparent)

    def delivery_failed(
        self,
        *,
        route: str | None = None,
        at: datetime | None = None,
        traceparent: str | None = None,
    ) -> ApprovalDelivery:
        """Delivering the request to its route failed."""
        return self._delivery(DeliveryOutcome.FAILED, route, at, traceparent)

    def _delivery(
        self, outcome: DeliveryOutcome, route: str | None, at: datetime | None, tp: str | None
    ) -> ApprovalDelivery:
        rec = self.run.recorder
        record = f.approval_delivery(
            self.run.execution_id,
            self.request_id,
            outcome,
            rec._now(at),
            route_ref=route,
            traceparent=rec._trace(tp),
        )
        rec.record(record)
        return record

    def acknowledged(
        self,
        *,
        approver: str | None = None,
        at: datetime | None = None,
        traceparent: str | None = None,
    ) -> ApproverAcknowledgement:
        """The approver saw the request (what a HIGH risk request needs for its route)."""
        rec = self.run.recorder
        record = f.approver_acknowledgement(
            self.run.execution_id,
            self.request_id,
            rec._now(at),
            approver_ref=approver,
            traceparent=rec._trace(traceparent),
        )
        rec.record(record)
        return record

    def decided(
        self,
        decision: DecisionCode | str,
        *,
        action_digest: str | None = None,
        at: datetime | None = None,
        traceparent: str | None = None,
    ) -> ApprovalDecision:
        """The approver's answer: ``"accept"``, ``"decline"`` or ``"cancel"`` (a dismissal,
        never a decline). The digest decided on defaults to the request's, when known."""
        rec = self.run.recorder
        record = f.approval_decision(
            self.run.execution_id,
            self.request_id,
            decision,
            rec._now(at),
            digest=action_digest if action_digest is not None else self.action_digest,
            traceparent=rec._trace(traceparent),
        )
        rec.record(record)
        return record

    def resumed(
        self,
        *,
        next_status: ExecutionStatus | str | None = None,
        at: datetime | None = None,
        traceparent: str | None = None,
    ) -> ResumeReceipt:
        """The run took the decision and moved on (``ExecutionRun.resumed``)."""
        return self.run.resumed(
            self.request_id, next_status=next_status, at=at, traceparent=traceparent
        )


class AsyncRecorder:
    """A ``Recorder`` for asyncio agents: the same handles (their calls never block),
    and awaitable ``flush`` and ``aclose`` that wait in a thread, not on the event loop.

        async with AsyncRecorder.from_env() as recorder:
            run = recorder.execution("exec-1")
            run.status("running")
            await recorder.flush()
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.sync = Recorder(*args, **kwargs)

    @classmethod
    def from_env(cls, **kwargs: Any) -> AsyncRecorder:
        return cls(Settings.from_env(), **kwargs)

    def execution(self, execution_id: str, *, agent_id: str | None = None) -> ExecutionRun:
        return self.sync.execution(execution_id, agent_id=agent_id)

    def record(self, record: Record) -> Record:
        return self.sync.record(record)

    async def flush(self, timeout: float = 30.0) -> int:
        return await asyncio.to_thread(self.sync.flush, timeout)

    async def aclose(self, timeout: float | None = None) -> int:
        return await asyncio.to_thread(self.sync.close, timeout)

    @property
    def counts(self) -> Counts:
        return self.sync.counts

    @property
    def spooling(self) -> bool:
        return self.sync.spooling

    async def __aenter__(self) -> AsyncRecorder:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()


__all__ = [
    "ApprovalRun",
    "AsyncRecorder",
    "ExecutionRun",
    "OperationRun",
    "Recorder",
    "RecorderSettings",
    "current_traceparent",
    "utc_now",
]
