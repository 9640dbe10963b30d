"""Creating topics and preparing the registry, idempotently."""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from streams.contracts.codec import HTTP_ERRORS, AvroCodec, RegistryUnavailable
from streams.contracts.registry import SubjectOutcome, register_schemas
from streams.kafka.topics import Topics, TopicSpec
from streams.settings import Settings


@dataclass(frozen=True, slots=True)
class TopicOutcome:
    name: str
    created: bool
    detail: str


def admin_client(settings: Settings) -> AdminClient:
    return AdminClient(settings.confluent_conf())


def create_topics(
    settings: Settings, specs: tuple[TopicSpec, ...] | None = None, timeout: float = 30.0
) -> list[TopicOutcome]:
    """Create every catalogue topic that does not exist yet. An existing topic with another
    partition count is reported, not altered: repartitioning breaks co-partitioning."""
    specs = specs if specs is not None else Topics.from_settings(settings).all()
    admin = admin_client(settings)
    existing = admin.list_topics(timeout=timeout).topics
    outcomes: list[TopicOutcome] = []
    todo: list[TopicSpec] = []
    for spec in specs:
        meta = existing.get(spec.name)
        if meta is None:
            todo.append(spec)
            continue
        n = len(meta.partitions)
        detail = "exists" if n == spec.partitions else f"exists with {n} partitions (!)"
        outcomes.append(TopicOutcome(spec.name, False, detail))
    if todo:
        futures = admin.create_topics(
            [
                NewTopic(
                    s.name,
                    num_partitions=s.partitions,
                    replication_factor=settings.replication_factor,
                    config=s.config(),
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
