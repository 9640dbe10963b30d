"""Avro in the Confluent wire format: confluent-kafka's registry client and serializer, fastavro,
and writers compiled per schema (``streams.contracts.avro_writer``).

Several record types share an input topic (every input topic also carries clock ticks), so
their subjects follow the *topic-record* name strategy: ``<topic>-<record full name>``; an
output topic that carries one record type uses the default ``<topic>-value``
(``streams.kafka.topics.subject_name``). Schemas are registered by ``vigil schemas register``, not
by the clients: a codec only looks its subject's schema up, unless ``auto_register`` (the dev
setting ``VIGIL_AUTO_REGISTER``) lets it register. Decoding
looks at the writer's schema id, asks the registry (cached) which record that is, and reads
the bytes with fastavro, the writer's schema resolved against ours as the reader schema, so
Avro schema resolution absorbs compatible evolution (a field added by a newer producer).

A record the registry cannot be asked about is not a bad record: when the registry is
unreachable, times out or answers an error of its own (5xx, 429, ...), decoding raises
``RegistryUnavailable``, which callers must not turn into a dead letter; only the registry's
answer that a schema id does not exist (404) makes the record undecodable for good.
"""

from __future__ import annotations

import io
import json
import logging
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from pydantic import ValidationError

from streams.contracts.avro_writer import UnsupportedSchema, Writer, compile_writer
from streams.contracts.models.base import Record
from streams.contracts.models.events import INPUT_MODELS
from streams.contracts.models.outputs import INTERNAL_MODELS, OUTPUT_MODELS, SERVICE_MODELS
from streams.kafka.topics import subject_name
from streams.settings import RegistryConfig

log = logging.getLogger("vigil.codec")
T = TypeVar("T")


def _http_errors() -> tuple[type[BaseException], ...]:
    """The exceptions of a request that got no usable answer: httpx's ``HTTPError`` of the
    httpx confluent's client uses (``httpx2`` where installed) and of plain httpx, and
    ``OSError``."""
    errors: list[type[BaseException]] = [OSError]
    for name in ("httpx2", "httpx"):
        try:
            errors.append(__import__(name).HTTPError)
        except (ImportError, AttributeError):
            continue
    return tuple(errors)


#: refused, reset, timed out, DNS, TLS, a response cut short...
HTTP_ERRORS = _http_errors()

MAGIC_BYTE = 0
ALL_MODELS: tuple[type[Record], ...] = (
    INPUT_MODELS + OUTPUT_MODELS + SERVICE_MODELS + INTERNAL_MODELS
)
MODELS_BY_FULLNAME: dict[str, type[Record]] = {m.avro_fullname(): m for m in ALL_MODELS}


class DecodeError(Exception):
    """A record that cannot be turned into a contract model; the message is the reason."""


class RegistryUnavailable(Exception):
    """The registry did not say what a schema is: unreachable, timed out, or an error of its
    own (any answer but 404: 5xx, 429, 408, and 401/403 too, a credentials problem is not the
    record's). Deliberately not a ``DecodeError``: the record may be perfectly valid, so it
    is kept and read again, never dead-lettered."""


class SchemaNotRegistered(RegistryUnavailable):
    """A record's schema is not registered under its subject, and this codec does not register
    (``auto_register`` off): an operator's step is missing (``vigil schemas register``), not a
    fault of the record, so the worker keeps the record and waits, like for an outage."""


#: the registry's answer that makes a schema id unknown for good
NOT_FOUND = 404


@dataclass(slots=True)
class RegistryOutage:
    """The registry's failures in a row: what the worker waits before reading the records
    again, and whether the outage is worth an alert. The codec records every failure and
    every answer, so an outage ends with the first answer, whichever caller got it."""

    #: ``time.monotonic()`` of the first failure of the current outage; None while it answers
    since: float | None = None
    failures: int = 0
    #: whether this outage was reported as lasting (once per outage)
    alerted: bool = False

    def failed(self, now: float) -> None:
        if self.since is None:
            self.since = now
        self.failures += 1

    def answered(self, now: float) -> float | None:
        """The registry answered: how long the outage lasted, if there was one."""
        if self.since is None:
            return None
        lasted = now - self.since
        self.since, self.failures, self.alerted = None, 0, False
        return lasted

    def delay(self, first: float = 0.5, cap: float = 30.0) -> float:
        """Capped exponential backoff: ``first`` after the first failure, doubling, at most
        ``cap``."""
        if self.failures <= 0:
            return 0.0
        return min(cap, first * 2.0 ** min(self.failures - 1, 62))

    def pause(
        self,
        exc: RegistryUnavailable,
        alert_after: timedelta,
        cap: timedelta,
        now: float | None = None,
    ) -> float:
        """Report a batch given up for ``exc`` and say how long to wait before reading it again:
        a warning at the first failure of an outage, an error once it has lasted
        ``alert_after``."""
        now = time.monotonic() if now is None else now
        wait = self.delay(cap=cap.total_seconds())
        lasted = now - self.since if self.since is not None else 0.0
        if self.failures <= 1:
            log.warning(
                "schema registry unavailable (%s); records are kept, none is dead-lettered: "
                "they are read again in %.1f s",
                exc,
                wait,
            )
        elif lasted >= alert_after.total_seconds() and not self.alerted:
            self.alerted = True
            log.error(
                "schema registry unavailable for %.0f s (%s failures in a row, last: %s); "
                "input is not processed until it answers",
                lasted,
                self.failures,
                exc,
            )
        else:
            log.info("schema registry still unavailable (%s); again in %.1f s", exc, wait)
        return wait


class AvroCodec:
    """Encodes contract models to Confluent-framed Avro and back. Encoding looks up the id of
    the model's schema under its subject (registering it there only with ``auto_register``);
    decoding reads the writer's schema by the id in the record, whatever its subject."""

    def __init__(self, registry: SchemaRegistryClient, *, auto_register: bool = False) -> None:
        self.registry = registry
        self.auto_register = auto_register
        #: subjects ``admin.prepare_registry`` registered through this codec
        self.prepared_subjects: set[str] = set()
        self._serializers: dict[type[Record], AvroSerializer] = {}
        self._writer_names: dict[int, str] = {}
        # The hot path, after the first record of a kind: a writer compiled for the model's
        # schema (``streams.contracts.avro_writer``, fastavro's bytes at half the cost), or fastavro
        # with the parsed schema, without confluent's per-record subject lookups.
        self._writers: dict[tuple[str, type[Record]], tuple[bytes, Any, Writer | None]] = {}
        self._readers: dict[tuple[int, type[Record]], tuple[Any, Any]] = {}
        self._writer_schemas: dict[int, Any] = {}
        self.outage = RegistryOutage()

    @classmethod
    def connect(cls, config: RegistryConfig, **kwargs: Any) -> AvroCodec:
        return cls(SchemaRegistryClient(config.client_conf()), **kwargs)

    # -- encoding -------------------------------------------------------------------------
    def serializer(self, model: type[Record]) -> AvroSerializer:
        ser = self._serializers.get(model)
        if ser is None:
            ser = AvroSerializer(
                self.registry,
                registered_schema(model),
                to_dict=lambda obj, _ctx: obj.to_avro(),
                conf={
                    "auto.register.schemas": self.auto_register,
                    "subject.name.strategy": lambda ctx, _name: subject_name(ctx.topic, model),
                },
            )
            self._serializers[model] = ser
        return ser

    def encode(self, topic: str, record: Record) -> bytes:
        """The first record of a kind per topic goes through confluent's ``AvroSerializer``,
        which looks up (or, with ``auto_register``, registers) the subject's schema; its id is
        kept, and the rest are written with the same header by the writer compiled for the
        model's schema (by fastavro if it has none). ``SchemaNotRegistered`` when the subject
        does not hold the model's schema and this codec does not register."""
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
        try:
            data = self._ask_registry(
                f"{'registering' if self.auto_register else 'looking up'} "
                f"{model.avro_fullname()} for {topic}",
                lambda: self.serializer(model)(record, ctx),
            )
        except SchemaRegistryError as exc:  # 404: subject or schema not there
            self.outage.failed(time.monotonic())  # waited out with a backoff, like an outage
            raise SchemaNotRegistered(
                f"schema {model.avro_fullname()} is not registered under subject "
                f"{subject_name(topic, model)} (run `vigil schemas register`, or set "
                f"VIGIL_AUTO_REGISTER=true on a dev registry): {exc.error_message}"
            ) from exc
        assert data is not None
        self._writers[(topic, model)] = (data[:5], _parsed(model), _compiled(model))
        return data

    # -- the registry -----------------------------------------------------------------------
    def _ask_registry(self, what: str, call: Callable[[], T]) -> T:
        """``call`` (a request to the registry), its failures sorted: an answer of the registry
        (even a 404) ends an outage and passes through; no answer, or an error of the
        registry's own, is ``RegistryUnavailable``."""
        try:
            result = call()
        except SchemaRegistryError as exc:
            if exc.http_status_code != NOT_FOUND:
                self.outage.failed(time.monotonic())
                raise RegistryUnavailable(f"{what}: {exc}") from exc
            self._answered()
            raise
        except HTTP_ERRORS as exc:
            self.outage.failed(time.monotonic())
            raise RegistryUnavailable(f"{what}: {type(exc).__name__}: {exc}") from exc
        self._answered()
        return result

    def _answered(self) -> None:
        lasted = self.outage.answered(time.monotonic())
        if lasted is not None:
            log.warning("schema registry answers again, after %.1f s", lasted)

    def writer_schema_str(self, schema_id: int) -> str:
        """The writer's schema of ``schema_id`` (confluent's client caches it): ``DecodeError``
        if the registry has no such id, ``RegistryUnavailable`` if it could not say."""
        try:
            schema = self._ask_registry(
                f"looking up schema id {schema_id}", lambda: self.registry.get_schema(schema_id)
            )
        except SchemaRegistryError as exc:
            raise DecodeError(f"unknown schema id {schema_id}: {exc.error_message}") from exc
        text = schema.schema_str
        if text is None:
            raise DecodeError(f"schema id {schema_id} has no schema text")
        return text

    # -- decoding -------------------------------------------------------------------------
    def writer_fullname(self, schema_id: int) -> str:
        name = self._writer_names.get(schema_id)
        if name is None:
            text = self.writer_schema_str(schema_id)
            try:
                parsed = json.loads(text)
            except ValueError as exc:
                raise DecodeError(f"schema id {schema_id} is not JSON: {exc}") from exc
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
            parsed, declared = self._writer_schema(schema_id)
            pair = (parsed, None if declared == model.avro_schema() else _parsed(model))
            self._readers[(schema_id, model)] = pair
        return pair

    def _writer_schema(self, schema_id: int) -> tuple[Any, Any]:
        """The writer's schema of ``schema_id``, parsed by fastavro and as declared."""
        writer = self._writer_schemas.get(schema_id)
        if writer is None:
            text = self.writer_schema_str(schema_id)
            try:
                writer = (parse_schema(json.loads(text)), json.loads(text))
            except Exception as exc:  # fastavro's SchemaParseException, UnknownType, ...
                raise DecodeError(
                    f"schema id {schema_id} is not a usable Avro schema: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            self._writer_schemas[schema_id] = writer
        return writer

    def unseen_schema_ids(self, values: Iterable[bytes | None]) -> set[int]:
        """The schema ids in the headers of Confluent-framed ``values`` that this codec has not
        looked up yet. No I/O: a batch's new ids can be looked up (``look_up``) in a thread,
        and decoding then asks the registry nothing on the event loop."""
        seen = self._writer_schemas
        out: set[int] = set()
        for value in values:
            if value is not None and len(value) >= 5 and value[0] == MAGIC_BYTE:
                (schema_id,) = struct.unpack_from(">I", value, 1)
                if schema_id not in seen:
                    out.add(schema_id)
        return out

    def look_up(self, schema_ids: Iterable[int]) -> None:
        """Ask the registry about ``schema_ids`` now, so that decoding finds them known. Meant
        for a thread (``asyncio.to_thread``): a registry that does not answer then blocks that
        thread, not the worker's event loop. Raises ``RegistryUnavailable``; an id the registry
        does not know (404) is left for ``decode`` to report with its record."""
        for schema_id in schema_ids:
            try:
                self.writer_fullname(schema_id)
                self._writer_schema(schema_id)
            except DecodeError:
                continue

    def read_fields(self, data: bytes | None, model: type[Record]) -> dict[str, Any] | None:
        """The fields of a value written with exactly ``model``'s schema, as fastavro reads
        them, not validated; None when the value is anything else (another record type,
        another version of the schema, not framed, not readable), which ``decode`` then
        judges. For records vigil wrote itself to its own internal topics, read far more
        often than anything else: validation would only find what the writer checked.
        Raises ``RegistryUnavailable`` as ``decode`` does."""
        if data is None or len(data) < 5 or data[0] != MAGIC_BYTE:
            return None
        schema_id = int.from_bytes(data[1:5], "big")
        if MODELS_BY_FULLNAME.get(self.writer_fullname(schema_id)) is not model:
            return None
        writer, reader = self._reader(schema_id, model)
        if reader is not None:
            return None
        try:
            return schemaless_reader(io.BytesIO(data[5:]), writer, None)  # type: ignore[no-any-return]
        except Exception:
            return None

    def decode(
        self, topic: str, data: bytes | None, allowed: Iterable[type[Record]] | None = None
    ) -> Record:
        """Decode one value or raise ``DecodeError`` saying exactly why not, or
        ``RegistryUnavailable`` when the registry could not be asked (the value may be fine)."""
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
        writer, reader = self._reader(schema_id, model)
        try:
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


def registered_schema(model: type[Record]) -> Schema:
    """The schema text of ``model`` as registered and looked up: the ``.avsc`` file without
    its surrounding whitespace, as confluent's serializers send it. Apicurio finds a schema
    under a subject by its exact text, so registration and lookup must send the same."""
    return Schema(model.avro_schema_str().strip(), "AVRO")


#: the compatibility of every subject vigil writes: a new schema must read every earlier
#: version (retention is forever by default, and a replay reads all of it)
COMPATIBILITY = "BACKWARD_TRANSITIVE"


def set_subject_compatibility(
    registry: SchemaRegistryClient, subject: str, level: str = COMPATIBILITY
) -> None:
    """Set ``level`` on ``subject`` alone (``PUT /config/{subject}``): the registry's global
    level belongs to whoever runs it, and other teams' subjects keep theirs."""
    registry.set_compatibility(subject_name=subject, level=level)
