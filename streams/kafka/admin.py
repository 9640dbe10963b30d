"""Creating topics and preparing the registry, idempotently."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from streams.contracts.codec import HTTP_ERRORS, AvroCodec, RegistryUnavailable
from streams.contracts.registry import SubjectOutcome, register_schemas
from streams.kafka.topics import Replication, Topics, TopicSpec, replication
from streams.settings import Settings

log = logging.getLogger("vigil.admin")


@dataclass(frozen=True, slots=True)
class TopicOutcome:
    name: str
    created: bool
    detail: str


def admin_client(settings: Settings) -> AdminClient:
    return AdminClient(settings.confluent_conf())


def cluster_replication(settings: Settings, metadata: Any) -> Replication:
    """The replication of new topics on the cluster whose ``metadata`` (a ``list_topics``
    answer) is given: decided from the brokers it reports, the settings overriding."""
    return replication(
        len(metadata.brokers), settings.replication_factor, settings.min_insync_replicas
    )


def with_replication(
    settings: Settings, timeout: float = 10.0, patience: float | None = None
) -> Settings:
    """``settings`` with the replication the cluster calls for made explicit, for a process
    that creates topics of its own (the worker: Faust's changelogs and leader topic). Set,
    both settings are kept as they are and the cluster is not asked. While the cluster does
    not answer, asked again every ``timeout`` seconds, for ``patience`` seconds at most
    (None: until it answers, as the worker waits for its broker)."""
    if settings.replication_factor is not None and settings.min_insync_replicas is not None:
        return settings
    admin = admin_client(settings)
    began = time.monotonic()
    while True:
        try:
            metadata = admin.list_topics(timeout=timeout)
            break
        except KafkaException as exc:
            if patience is not None and time.monotonic() - began >= patience:
                raise
            log.warning("waiting for the cluster to decide the replication: %s", exc)
    chosen = cluster_replication(settings, metadata)
    log.info(
        "replication of created topics: %d replicas, min.insync.replicas %d (%d brokers)",
        chosen.factor,
        chosen.min_insync,
        len(metadata.brokers),
    )
    return replace(
        settings, replication_factor=chosen.factor, min_insync_replicas=chosen.min_insync
    )


def create_topics(
    settings: Settings, specs: tuple[TopicSpec, ...] | None = None, timeout: float = 30.0
) -> list[TopicOutcome]:
    """Create every catalogue topic that does not exist yet, replicated as
    ``cluster_replication`` decides. An existing topic with another partition count is
    reported, not altered: repartitioning breaks co-partitioning; one with fewer replicas is
    reported too (``kafka-reassign-partitions`` adds replicas without touching the data)."""
    specs = specs if specs is not None else Topics.from_settings(settings).all()
    admin = admin_client(settings)
    metadata = admin.list_topics(timeout=timeout)
    existing = metadata.topics
    chosen = cluster_replication(settings, metadata)
    outcomes: list[TopicOutcome] = []
    todo: list[TopicSpec] = []
    for spec in specs:
        meta = existing.get(spec.name)
        if meta is None:
            todo.append(spec)
            continue
        n = len(meta.partitions)
        notes = [] if n == spec.partitions else [f"{n} partitions"]
        replicas = min((len(p.replicas) for p in meta.partitions.values()), default=0)
        if replicas < chosen.factor:
            notes.append(f"{replicas} replicas")
        detail = f"exists with {' and '.join(notes)} (!)" if notes else "exists"
        outcomes.append(TopicOutcome(spec.name, False, detail))
    if todo:
        futures = admin.create_topics(
            [
                NewTopic(
                    s.name,
                    num_partitions=s.partitions,
                    replication_factor=chosen.factor,
                    config=s.config() | chosen.config(),
                )
                for s in todo
            ],
            operation_timeout=timeout,
        )
        for name, fut in futures.items():
            try:
                fut.result(timeout)
                outcomes.append(TopicOutcome(name, True, "created"))
            except KafkaException as exc:
                err = exc.args[0]
                if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    outcomes.append(TopicOutcome(name, False, "exists"))
                else:
                    raise
    return sorted(outcomes, key=lambda o: o.name)


def prepare_registry(
    settings: Settings, codec: AvroCodec, specs: tuple[TopicSpec, ...] | None = None
) -> list[SubjectOutcome]:
    """Register vigil's schemas under their subjects, each set to BACKWARD_TRANSITIVE, so that
    an incompatible schema is refused by the registry before any record of it reaches a
    topic. Only vigil's own subjects are touched, never the registry's global config."""
    specs = specs if specs is not None else Topics.from_settings(settings).all()
    # Subjects this codec prepared already are not asked again: a process that replays
    # several ranges into the same outputs needs the registry only for what it reads.
    fresh = tuple(
        spec
        for spec in specs
        if any(subject not in codec.prepared_subjects for subject, _ in spec.subjects())
    )
    try:
        outcomes = register_schemas(codec.registry, fresh)
    except HTTP_ERRORS as exc:
        raise RegistryUnavailable(
            f"schema registry unreachable while registering vigil's schemas: {exc}"
        ) from exc
    codec.prepared_subjects.update(subject for spec in fresh for subject, _ in spec.subjects())
    return outcomes
