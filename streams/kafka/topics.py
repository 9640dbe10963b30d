"""The topic catalogue: every topic vigil reads or writes, and the registry subject of every
record type on it, in one place.

Faust creates only its own internal topics (table changelogs, repartitions); user topics must
exist before a worker starts, so ``vigil topics create`` creates these idempotently. Input
topics are co-partitioned (same partition count, keyed by execution_id, murmur2) so that one
worker task sees every fact of an execution, and the tables used together share partitions.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from functools import cache

from streams.contracts.models import events as ev
from streams.contracts.models import outputs as out
from streams.contracts.models.base import Record
from streams.settings import Settings

DAY_MS = 24 * 3600 * 1000

#: replicas of a topic when the cluster has this many brokers or more and no setting says
#: otherwise: one broker may be lost, or restarted, while the others still hold two copies
DEFAULT_REPLICAS = 3
#: in-sync replicas an ``acks=all`` write needs on a topic of ``DEFAULT_REPLICAS`` or more:
#: a write acknowledged is on two brokers, and one broker down does not stop writes
DEFAULT_MIN_INSYNC = 2


class ReplicationError(ValueError):
    """The replication settings ask for more than the cluster can hold."""


@dataclass(frozen=True, slots=True)
class Replication:
    """How the topics vigil creates are replicated: ``factor`` copies of every partition, and
    ``min_insync`` of them must have a record before an ``acks=all`` write is acknowledged
    (the topic's ``min.insync.replicas``)."""

    factor: int
    min_insync: int

    def config(self) -> dict[str, str]:
        """The topic configuration that carries it (the factor is the topic's creation)."""
        return {"min.insync.replicas": str(self.min_insync)}


def replication(
    brokers: int, factor: int | None = None, min_insync: int | None = None
) -> Replication:
    """The replication of new topics on a cluster of ``brokers``, ``factor`` and
    ``min_insync`` (``VIGIL_REPLICATION_FACTOR``, ``VIGIL_MIN_INSYNC_REPLICAS``) overriding.

    Unset, the factor is ``DEFAULT_REPLICAS``, or one copy per broker on a smaller cluster;
    ``min_insync`` is ``DEFAULT_MIN_INSYNC`` when the factor is at least three, else 1: with
    two replicas, two in sync would stop every write while either broker is away, and with
    one there is nothing else to wait for. A factor above the brokers is refused here, with
    the settings named, rather than by the broker's INVALID_REPLICATION_FACTOR.
    """
    if brokers < 1:
        raise ReplicationError("the cluster reports no broker")
    chosen = factor if factor is not None else min(DEFAULT_REPLICAS, brokers)
    if chosen > brokers:
        raise ReplicationError(
            f"VIGIL_REPLICATION_FACTOR={chosen} but the cluster reports {brokers} "
            f"broker{'s' if brokers != 1 else ''}"
        )
    if min_insync is None:
        in_sync = DEFAULT_MIN_INSYNC if chosen >= DEFAULT_REPLICAS else 1
    else:
        in_sync = min_insync
    if in_sync > chosen:
        raise ReplicationError(
            f"VIGIL_MIN_INSYNC_REPLICAS={in_sync} is more than the {chosen} replicas "
            "of each partition: no write could ever be acknowledged"
        )
    return Replication(chosen, in_sync)


class Role(StrEnum):
    INPUT = "input"
    OUTPUT = "output"
    #: written and read by the workers themselves: the join of attempts across executions
    #: (``streams.core.claims``)
    INTERNAL = "internal"


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    role: Role
    key: str
    value_types: tuple[type[Record], ...]
    partitions: int
    cleanup_policy: str
    retention_ms: int
    doc: str
    #: inputs: the broker refuses a record timestamp more than this ahead of its own clock
    #: (``message.timestamp.after.max.ms``), the reference of vigil's future-skew check
    future_skew_ms: int | None = None
    #: who writes an output when it is not the worker (``vigil reconcile``)
    writer: str | None = None

    def config(self) -> dict[str, str]:
        conf = {"cleanup.policy": self.cleanup_policy}
        if self.future_skew_ms is not None:
            conf["message.timestamp.after.max.ms"] = str(self.future_skew_ms)
        if self.cleanup_policy == "delete":
            conf["retention.ms"] = str(self.retention_ms)
        else:
            conf["min.compaction.lag.ms"] = "60000"
            conf["delete.retention.ms"] = str(DAY_MS)
        return conf

    @property
    def value_subject(self) -> bool:
        """Whether the topic's values use the default ``<topic>-value`` subject
        (TopicNameStrategy): an output that carries one record type, so ksqlDB, Flink SQL,
        Kafka Connect and registry UIs find its schema without settings. Inputs (their events
        and clock ticks) and outputs with several record types use ``<topic>-<record full
        name>`` (TopicRecordNameStrategy), one subject per record type."""
        return self.role is Role.OUTPUT and len(self.value_types) == 1

    def subject(self, model: type[Record]) -> str:
        """The registry subject of ``model``'s values on this topic."""
        return subject_name(self.name, model, value_subject=self.value_subject)

    def subjects(self) -> tuple[tuple[str, type[Record]], ...]:
        """Every subject of this topic, with the record type registered under it."""
        return tuple((self.subject(m), m) for m in self.value_types)


def subject_name(topic: str, model: type[Record], *, value_subject: bool | None = None) -> str:
    """The subject of ``model`` on ``topic``: ``<topic>-value`` for the record type of a
    single-type output (``value_subject``; by default: whether ``model`` is one of those in the
    catalogue, whatever the prefix and suffix of ``topic``), else ``<topic>-<full name>``."""
    if value_subject is None:
        value_subject = model in value_subject_models()
    return f"{topic}-value" if value_subject else f"{topic}-{model.avro_fullname()}"


@cache
def value_subject_models() -> frozenset[type[Record]]:
    """The record types that are the only type of their output topic. A record type lives on
    one topic of the catalogue, so its subject strategy follows from the type alone."""
    return frozenset(
        t.value_types[0] for t in Topics.from_settings(Settings()).all() if t.value_subject
    )


@dataclass(frozen=True)
class Topics:
    """Topic names for one deployment (prefix) and one output set (suffix)."""

    execution_status: TopicSpec
    operation_events: TopicSpec
    approval_events: TopicSpec
    run_signals: TopicSpec
    execution_state: TopicSpec
    operation_state: TopicSpec
    reconciliation_work: TopicSpec
    approval_verdicts: TopicSpec
    alerts: TopicSpec
    anomalies: TopicSpec
    dead_letters: TopicSpec
    reconciliation_checks: TopicSpec
    idempotency_claims: TopicSpec
    retry_links: TopicSpec

    @classmethod
    def from_settings(cls, s: Settings) -> Topics:
        p, sfx, n = s.topic_prefix, s.output_suffix, s.partitions
        tick = (ev.ClockTick,)

        def i(name: str, types: tuple[type[Record], ...], doc: str) -> TopicSpec:
            return TopicSpec(
                f"{p}.{name}",
                Role.INPUT,
                "execution_id (ticks: none)",
                types + tick,
                n,
                "delete",
                s.retention_ms,
                doc,
                int(s.max_future_skew.total_seconds() * 1000),
            )

        def o(
            name: str, key: str, types: tuple[type[Record], ...], policy: str, days: int, doc: str
        ) -> TopicSpec:
            return TopicSpec(
                f"{p}.{name}{sfx}", Role.OUTPUT, key, types, n, policy, s.retention_ms, doc
            )

        return cls(
            execution_status=i(
                "execution-status",
                (ev.ExecutionStatusChanged,),
                "Status changes of executions, from agent runtimes.",
            ),
            operation_events=i(
                "operation-events",
                (ev.OperationEvent,),
                "Operation facts from runtimes, connectors, reconcilers, reviewers.",
            ),
            approval_events=i(
                "approval-events",
                (
                    ev.ApprovalRequested,
                    ev.ApprovalDelivery,
                    ev.ApproverAcknowledgement,
                    ev.ApprovalDecision,
                ),
                "Approval requests, deliveries, acknowledgements and decisions.",
            ),
            run_signals=i(
                "run-signals",
                (ev.CurrentActionDigest, ev.ResumeReceipt, ev.RequesterHeartbeat),
                "What runs say about themselves: current action digest, resume receipts, "
                "heartbeats.",
            ),
            execution_state=o(
                "execution-state",
                "execution_id",
                (out.ExecutionState,),
                "compact",
                0,
                "Latest state of every execution.",
            ),
            operation_state=o(
                "operation-state",
                "execution_id/operation_id",
                (out.OperationState,),
                "compact",
                0,
                "Latest state of every operation, with retry verdict.",
            ),
            reconciliation_work=o(
                "reconciliation-work",
                "execution_id/operation_id",
                (out.ReconciliationWorkItem, out.WorkItemResolution),
                "delete",
                30,
                "Work items for reconcilers and their resolutions.",
            ),
            approval_verdicts=o(
                "approval-verdicts",
                "execution_id/request_id",
                (out.ApprovalVerdict,),
                "delete",
                30,
                "Verdict transitions of approval waits.",
            ),
            alerts=o(
                "alerts",
                "execution_id/subject_id",
                (out.Alert,),
                "delete",
                30,
                "Actionable transitions for alerting subscribers.",
            ),
            anomalies=o(
                "anomalies",
                "execution_id (or source coordinates)",
                (out.Anomaly,),
                "delete",
                30,
                "Inputs reported instead of applied.",
            ),
            dead_letters=o(
                "dead-letters",
                "original key",
                (out.DeadLetter,),
                "delete",
                30,
                "Undecodable or invalid records with their original bytes.",
            ),
            reconciliation_checks=replace(
                o(
                    "reconciliation-checks",
                    "work_item_id (partition: the work item's own)",
                    (out.ReconciliationCheck,),
                    "compact",
                    0,
                    "vigil reconcile's progress per work item: every check made at the source, "
                    "its outcome, the next one due.",
                ),
                writer="vigil reconcile",
            ),
            idempotency_claims=TopicSpec(
                f"{p}.idempotency-claims{sfx}",
                Role.INTERNAL,
                "connector/idempotency_key, each percent-encoded (progress: none, to every "
                "partition)",
                (out.IdempotencyClaim, out.ClaimsProgress),
                n,
                "delete",
                s.retention_ms,
                "Every status of every attempt that carries an idempotency key, repartitioned "
                "by connector and key, and each input partition's progress: the join of "
                "attempts across executions (blind retries).",
            ),
            retry_links=TopicSpec(
                f"{p}.retry-links{sfx}",
                Role.INTERNAL,
                "execution_id",
                (out.RetryLink,),
                n,
                "delete",
                s.retention_ms,
                "Blind retries across executions found by the claims join, told to each of "
                "the two executions, and the later statuses of the other attempt.",
            ),
        )

    def all(self) -> tuple[TopicSpec, ...]:
        return tuple(vars(self).values())

    def inputs(self) -> tuple[TopicSpec, ...]:
        return tuple(t for t in self.all() if t.role is Role.INPUT)

    def outputs(self) -> tuple[TopicSpec, ...]:
        return tuple(t for t in self.all() if t.role is Role.OUTPUT)

    def internal(self) -> tuple[TopicSpec, ...]:
        return tuple(t for t in self.all() if t.role is Role.INTERNAL)

    def subjects(self) -> tuple[tuple[str, type[Record]], ...]:
        """Every registry subject of the catalogue, with its record type."""
        return tuple(pair for t in self.all() for pair in t.subjects())

    def by_name(self, name: str) -> TopicSpec:
        for t in self.all():
            if t.name == name:
                return t
        known = ", ".join(t.name for t in self.all())
        raise KeyError(f"unknown topic {name!r}; known: {known}")
