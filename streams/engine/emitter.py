"""The emitter: what the processor publishes, as ``Emission``s ready for the producer.

Each output record gets its topic, its Kafka key (the record's key field), its headers (alerts:
filter headers and ``traceparent``) and the trace context of what it is about; every output is
counted. Anomalies, orphan reports and dead letters are built here from the input that caused
them, with deterministic ids, so that a replay of the same records publishes the same bytes.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from streams.contracts.envelope import Envelope
from streams.contracts.models.base import Record, replace
from streams.contracts.models.enums import AlertKind, AlertStatus, AnomalyKind, Owner, Severity
from streams.contracts.models.outputs import (
    Alert,
    Anomaly,
    ApprovalVerdict,
    DeadLetter,
    ExecutionState,
    OperationState,
    ReconciliationWorkItem,
    WorkItemResolution,
)
from streams.core import trace
from streams.core.findings import AnomalyFinding
from streams.core.ids import deterministic_id, scoped_key
from streams.engine.emission import Emission
from streams.kafka.topics import Topics

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ONE_MS = timedelta(milliseconds=1)
EARLIEST_PLAUSIBLE = datetime(1971, 1, 1, tzinfo=UTC)
#: the longest text an anomaly or dead letter carries from its input (ids, reasons)
MAX_TEXT = 1024

#: an execution id -> the trace contexts kept for it (``streams.core.trace``), or None
TraceLookup = Callable[[str], dict[str, str] | None]


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
    #: inputs Kafka delivered again after a restart or rebalance whose effect the state
    #: already held: skipped, their outputs were published the first time
    redelivered: int = 0
    #: inputs whose ``traceparent`` was malformed: applied, the value dropped (not carried)
    traceparents_dropped: int = 0

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


class Emitter:
    def __init__(
        self,
        topics: Topics,
        traces: TraceLookup,
        partition_of: Callable[[str], int],
        *,
        orphan_after: timedelta,
        max_kept_bytes: int,
    ) -> None:
        """``traces``: the trace contexts the state keeps for an execution; ``partition_of``:
        the input partition of an execution id (an orphan report names it)."""
        self.topics = topics
        self.traces = traces
        self.partition_of = partition_of
        self.orphan_after = orphan_after
        #: a dead letter keeps its original key and value up to this many bytes together
        self.max_kept_bytes = max_kept_bytes
        self.counters = Counters()
        self._topic_of: dict[type[Record], str] = {
            ExecutionState: topics.execution_state.name,
            OperationState: topics.operation_state.name,
            ReconciliationWorkItem: topics.reconciliation_work.name,
            WorkItemResolution: topics.reconciliation_work.name,
            ApprovalVerdict: topics.approval_verdicts.name,
            Alert: topics.alerts.name,
            Anomaly: topics.anomalies.name,
            DeadLetter: topics.dead_letters.name,
        }

    def emit(self, record: Record, headers: tuple[tuple[str, str], ...] = ()) -> Emission:
        """An output record, with the trace context of what it is about when it has none."""
        cls = type(record)
        topic = self._topic_of[cls]
        fields = record.__dict__
        if fields.get("traceparent") is None:
            keys_of = _TRACE_KEYS.get(cls)
            keys = None if keys_of is None else keys_of(record)
            if keys is not None:
                traceparent = trace.lookup(self.traces(fields["execution_id"]), *keys)
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
        key = None if key_field is None else fields[key_field]
        if cls.key_scoped:
            key = scoped_key(fields["execution_id"], key)
        return Emission(topic, key, record, headers)

    def anomaly(self, env: Envelope, record: Record, finding: AnomalyFinding) -> Emission:
        """An input the core or the shell refused, reported with its coordinates."""
        self.counters.anomalies[finding.kind] += 1
        fields = record.__dict__
        occurred = fields.get("occurred_at")
        # The offending event's own time, not the stream time when it was read: that depends
        # on how topics interleave, and a replay must give the very same record.
        detected = occurred or log_time(env)
        if finding.kind == AnomalyKind.TIME_OUT_OF_RANGE or detected < EARLIEST_PLAUSIBLE:
            # the event's own time is the fault: stamp with the record's log timestamp, which
            # the broker accepted (it refuses timestamps far in the future)
            detected = log_time(env)
        return self.emit(
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

    def orphan(self, execution_id: str, request_id: str, last_fact: datetime) -> Emission:
        """Facts about a request that never came: reported once, after ``orphan_after``."""
        kind = AnomalyKind.ORPHAN_FACT
        self.counters.anomalies[kind] += 1
        at = last_fact + self.orphan_after
        return self.emit(
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
                traceparent=trace.lookup(self.traces(execution_id), trace.request_key(request_id)),
            )
        )

    def dead_letter(self, env: Envelope, reason: str | None = None) -> Emission:
        """An input that cannot be applied (undecodable, or quarantined), kept with its
        coordinates and, when small enough, its original bytes."""
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
            source_timestamp=log_time(env) if env.timestamp_ms else None,
            reason=bounded(reason or env.error or "unknown", MAX_TEXT),
            original_key=key,
            original_value=value,
            original_size=size if digest is not None else None,
            original_sha256=digest,
            traceparent=None if env.record is None else trace.traceparent_of(env.record),
        )
        self.counters.outputs[rec.avro_name] += 1
        return Emission(self.topics.dead_letters.name, _text_key(env.key), rec)

    def quarantine(self, env: Envelope, reason: str) -> list[Emission]:
        """A record set aside: its dead letter and a CRITICAL alert pointing at it."""
        self.counters.quarantined += 1
        dead = self.dead_letter(env, f"quarantined: {reason}")
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
            occurred_at=record.source_timestamp or log_time(env),
            traceparent=record.traceparent,
            ends_with_resolved=True,
        )
        return [dead, self.emit(alert)]


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


def _alert_trace_keys(alert: Alert) -> tuple[str, ...] | None:
    subject = alert.subject_id
    if alert.kind is AlertKind.APPROVAL_VERDICT:
        return (trace.request_key(subject), trace.SIGNALS)
    if alert.kind is not AlertKind.ANOMALY:
        return (trace.operation_key(subject),)
    return None


def _operation_trace_keys(record: Record) -> tuple[str, ...]:
    return (trace.operation_key(record.operation_id),)  # type: ignore[attr-defined]


def _no_trace_keys(record: Record) -> tuple[str, ...]:
    return ()


#: Per output type, under which keys its trace context is kept (``trace.lookup`` falls back
#: to the execution's; None from the function: none to look up). Types not listed get theirs
#: where they are made (anomalies, dead letters).
_TRACE_KEYS: dict[type[Record], Callable[[Any], tuple[str, ...] | None]] = {
    ExecutionState: _no_trace_keys,
    OperationState: _operation_trace_keys,
    ReconciliationWorkItem: _operation_trace_keys,
    WorkItemResolution: _operation_trace_keys,
    ApprovalVerdict: lambda r: (trace.request_key(r.request_id), trace.SIGNALS),
    Alert: _alert_trace_keys,
}


def log_time(env: Envelope) -> datetime:
    """The input record's Kafka timestamp (the epoch when it has none)."""
    return EPOCH + (env.timestamp_ms or 0) * ONE_MS


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
