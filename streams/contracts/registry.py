"""vigil's subjects on a shared schema registry: registered explicitly, each with its own
compatibility level.

A registry is often shared by several teams: its global compatibility level is theirs, and a
client that registers whatever it writes lets any build change a contract. So vigil sets the
level of its own subjects only (``PUT /config/{subject}``, BACKWARD_TRANSITIVE: a replay reads
every version ever written) and registers its schemas in one deliberate step (``vigil schemas
register``, also run by ``vigil topics create``); the worker and the CLI only look them up.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from streams.contracts.codec import COMPATIBILITY, registered_schema, set_subject_compatibility
from streams.contracts.models.base import Record
from streams.kafka.topics import TopicSpec


@dataclass(frozen=True, slots=True)
class SubjectOutcome:
    subject: str
    record: str
    schema_id: int
    #: the version number under the subject; None when the registry did not say
    version: int | None
    compatibility: str


def register_schemas(
    registry: SchemaRegistryClient, specs: Iterable[TopicSpec], level: str = COMPATIBILITY
) -> list[SubjectOutcome]:
    """Set ``level`` on every subject of ``specs`` (before registering, so the first version
    is already held to it), then register the record type's schema there; registering a
    schema the subject holds already is a no-op that answers its id. An incompatible schema
    raises the registry's ``SchemaRegistryError`` (409), naming the subject."""
    outcomes: list[SubjectOutcome] = []
    seen: set[str] = set()
    for spec in specs:
        for subject, model in spec.subjects():
            if subject in seen:
                continue
            seen.add(subject)
            set_subject_compatibility(registry, subject, level)
            outcomes.append(register_one(registry, subject, model, level))
    return outcomes


def register_one(
    registry: SchemaRegistryClient, subject: str, model: type[Record], level: str
) -> SubjectOutcome:
    schema = registered_schema(model)
    try:
        schema_id = registry.register_schema(subject, schema)
    except SchemaRegistryError as exc:
        raise SchemaRegistryError(
            exc.http_status_code,
            exc.error_code,
            f"{subject}: {model.avro_name}.avsc refused: {exc.error_message}",
        ) from exc
    version: int | None
    try:
        version = registry.lookup_schema(subject, schema).version
    except SchemaRegistryError:
        version = None
    return SubjectOutcome(subject, model.avro_fullname(), schema_id, version, level)
