"""Avro in the Confluent wire format, through confluent-kafka's schema-registry serdes.

Several record types share an input topic (every input topic also carries clock ticks), so
subjects follow the *topic-record* name strategy: ``<topic>-<record full name>``. Decoding
looks at the writer's schema id, asks the registry (cached) which record that is, and hands
the bytes to the ``AvroDeserializer`` of that record with our schema as the reader schema, so
Avro schema resolution absorbs compatible evolution (a field added by a newer producer).
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from confluent_kafka.schema_registry import (
    SchemaRegistryClient,
    topic_record_subject_name_strategy,
)
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from pydantic import ValidationError

from streams.avro_writer import UnsupportedSchema, Writer, compile_writer
from streams.models.base import Record
from streams.models.events import INPUT_MODELS
from streams.models.outputs import OUTPUT_MODELS

MAGIC_BYTE = 0
ALL_MODELS: tuple[type[Record], ...] = INPUT_MODELS + OUTPUT_MODELS
MODELS_BY_FULLNAME: dict[str, type[Record]] = {m.avro_fullname(): m for m in ALL_MODELS}


class DecodeError(Exception):
    """A record that cannot be turned into a contract model; the message is the reason."""


@dataclass(frozen=True, slots=True)
class RegistryConfig:
    url: str
    basic_auth: str | None = None  # "user:secret"; never logged

    def client_conf(self) -> dict[str, Any]:
        conf: dict[str, Any] = {"url": self.url}
        if self.basic_auth:
            conf["basic.auth.user.info"] = self.basic_auth
        return conf


class AvroCodec:
    """Encodes contract models to Confluent-framed Avro and back, registering as it goes."""

    def __init__(self, registry: SchemaRegistryClient, *, auto_register: bool = True) -> None:
        self.registry = registry
        self.auto_register = auto_register
        self._serializers: dict[type[Record], AvroSerializer] = {}
        self._deserializers: dict[type[Record], AvroDeserializer] = {}
        self._writer_names: dict[int, str] = {}
        # The hot path, after the first record of a kind: a writer compiled for the model's
        # schema (``streams.avro_writer``, fastavro's bytes at half the cost), or fastavro
        # with the parsed schema, without confluent's per-record subject lookups.
        self._writers: dict[tuple[str, type[Record]], tuple[bytes, Any, Writer | None]] = {}
        self._readers: dict[tuple[int, type[Record]], tuple[Any, Any]] = {}
        self._writer_schemas: dict[int, Any] = {}

    @classmethod
    def connect(cls, config: RegistryConfig, **kwargs: Any) -> AvroCodec:
        return cls(SchemaRegistryClient(config.client_conf()), **kwargs)

    # -- encoding -------------------------------------------------------------------------
    def serializer(self, model: type[Record]) -> AvroSerializer:
        ser = self._serializers.get(model)
        if ser is None:
            ser = AvroSerializer(
                self.registry,
                model.avro_schema_str(),
                to_dict=lambda obj, _ctx: obj.to_avro(),
                conf={
                    "auto.register.schemas": self.auto_register,
                    "subject.name.strategy": topic_record_subject_name_strategy,
                },
            )
            self._serializers[model] = ser
        return ser

    def encode(self, topic: str, record: Record) -> bytes:
        """The first record of a kind per topic goes through confluent's ``AvroSerializer``,
        which registers (or looks up) the subject's schema; its id is kept, and the rest are
        written with the same header by the writer compiled for the model's schema (by
        fastavro if it has none)."""
        model = type(record)
        cached = self._writers.get((topic, model))
        if cached is not None:
            header, parsed, write = cached
            if write is not None:
                return write(record.__dict__, header)
            buf = io.BytesIO()
            buf.write(header)
            schemaless_writer(buf, parsed, avro_dict(record))
            return buf.getvalue()
        ctx = SerializationContext(topic, MessageField.VALUE)
        data = self.serializer(model)(record, ctx)
        assert data is not None
        self._writers[(topic, model)] = (data[:5], _parsed(model), _compiled(model))
        return data

    # -- decoding -------------------------------------------------------------------------
    def writer_fullname(self, schema_id: int) -> str:
        name = self._writer_names.get(schema_id)
        if name is None:
            try:
                schema = self.registry.get_schema(schema_id)
            except SchemaRegistryError as exc:
                raise DecodeError(f"unknown schema id {schema_id}: {exc.error_message}") from exc
            parsed = json.loads(schema.schema_str)
            if not isinstance(parsed, dict) or "name" not in parsed:
                raise DecodeError(f"schema id {schema_id} is not a named Avro record")
            ns = parsed.get("namespace")
            raw = parsed["name"]
            name = raw if "." in raw or not ns else f"{ns}.{raw}"
            self._writer_names[schema_id] = name
        return name

    def _reader(self, schema_id: int, model: type[Record]) -> tuple[Any, Any]:
        """The writer's schema (from the registry, once per id) and ours, parsed: Avro schema
        resolution absorbs a compatible change (a field added by a newer producer). When the
        writer's schema is ours, field for field, there is nothing to resolve: the reader
        schema is None and fastavro reads with the writer's alone, at half the cost."""
        pair = self._readers.get((schema_id, model))
        if pair is None:
            writer = self._writer_schemas.get(schema_id)
            if writer is None:
                text = self.registry.get_schema(schema_id).schema_str
                writer = (parse_schema(json.loads(text)), json.loads(text))
                self._writer_schemas[schema_id] = writer
            parsed, declared = writer
            pair = (parsed, None if declared == model.avro_schema() else _parsed(model))
            self._readers[(schema_id, model)] = pair
        return pair

    def deserializer(self, model: type[Record]) -> AvroDeserializer:
        de = self._deserializers.get(model)
        if de is None:
            de = AvroDeserializer(self.registry, model.avro_schema_str())
            self._deserializers[model] = de
        return de

    def decode(
        self, topic: str, data: bytes | None, allowed: Iterable[type[Record]] | None = None
    ) -> Record:
        """Decode one value or raise ``DecodeError`` saying exactly why not."""
        if data is None or len(data) == 0:
            raise DecodeError("empty value (tombstone or null) on a topic that carries records")
        if data[0] != MAGIC_BYTE:
            raise DecodeError(f"wrong magic byte {data[0]:#04x}: not Confluent-framed Avro")
        if len(data) < 5:
            raise DecodeError(f"truncated header: {len(data)} bytes, need at least 5")
        (schema_id,) = struct.unpack(">I", data[1:5])
        fullname = self.writer_fullname(schema_id)
        model = MODELS_BY_FULLNAME.get(fullname)
        if model is None:
            raise DecodeError(f"record type {fullname} (schema id {schema_id}) is not a contract")
        if allowed is not None and model not in tuple(allowed):
            raise DecodeError(f"record type {fullname} does not belong on topic {topic}")
        try:
            writer, reader = self._reader(schema_id, model)
            raw = schemaless_reader(io.BytesIO(data[5:]), writer, reader)
        except Exception as exc:  # fastavro raises EOFError, ValueError, IndexError, ...
            raise DecodeError(
                f"undecodable Avro for {fullname}: {type(exc).__name__}: {exc}"
            ) from exc
        try:
            return model.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5]
            )
            raise DecodeError(f"invalid {fullname}: {problems}") from exc


def avro_dict(record: Record) -> dict[str, Any]:
    """What fastavro writes for ``record``: its own field values, nested records as dicts.
    ``model_dump`` gives the same dict at three times the cost; fastavro takes a ``StrEnum``
    as its symbol, a tuple as an array and an aware time as ``timestamp-millis``."""
    nested = _NESTED.get(type(record))
    if nested is None:
        nested = _NESTED[type(record)] = _nested_fields(type(record))
    values = record.__dict__
    if not nested:
        return values
    out = dict(values)
    for name in nested:
        value = values[name]
        if isinstance(value, Record):
            out[name] = avro_dict(value)
        elif isinstance(value, tuple) and value and isinstance(value[0], Record):
            out[name] = [avro_dict(v) for v in value]
    return out


def _nested_fields(model: type[Record]) -> tuple[str, ...]:
    """The fields of ``model`` whose type mentions a record (a record, or an array of them)."""
    return tuple(
        name
        for name, info in model.model_fields.items()
        if any(isinstance(t, type) and issubclass(t, Record) for t in _type_args(info.annotation))
    )


def _type_args(annotation: Any) -> list[Any]:
    args = [annotation]
    for a in getattr(annotation, "__args__", ()):
        args.extend(_type_args(a))
    return args


_NESTED: dict[type[Record], tuple[str, ...]] = {}
_PARSED: dict[type[Record], Any] = {}


_COMPILED: dict[type[Record], Writer | None] = {}


def _compiled(model: type[Record]) -> Writer | None:
    """The model's compiled writer; None (fastavro, then) for a schema it does not handle."""
    if model not in _COMPILED:
        try:
            _COMPILED[model] = compile_writer(model.avro_schema())
        except UnsupportedSchema:
            _COMPILED[model] = None
    return _COMPILED[model]


def _parsed(model: type[Record]) -> Any:
    parsed = _PARSED.get(model)
    if parsed is None:
        parsed = _PARSED[model] = parse_schema(model.avro_schema())
    return parsed


def set_backward_compatibility(registry: SchemaRegistryClient, subject: str | None = None) -> None:
    """BACKWARD: consumers on the new schema can read data written with the old one. Set
    globally (``subject=None``) or per subject."""
    registry.set_compatibility(subject_name=subject, level="BACKWARD")
