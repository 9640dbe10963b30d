"""A decode-safe Faust schema.

Faust commits past a value it cannot decode and then crashes the agent, so a bad record would
be lost and the worker would flap. This schema never raises: every record becomes an
``Envelope`` holding either the decoded contract model or the reason it could not be decoded,
together with the original bytes and coordinates, and the agent routes failures to the
dead-letter topic. The one exception it lets through is ``RegistryUnavailable``: a registry
that cannot be asked says nothing about the record, which must be kept and read again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import faust
from faust.types import AppT, Message

from streams.contracts.codec import AvroCodec, DecodeError, RegistryUnavailable
from streams.contracts.models.base import Record


@dataclass(frozen=True, slots=True)
class Envelope:
    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None
    key: bytes | None
    value: bytes | None
    record: Record | None
    error: str | None

    @property
    def ok(self) -> bool:
        return self.record is not None


def open_envelope(
    codec: AvroCodec,
    allowed: dict[str, tuple[type[Record], ...]],
    topic: str,
    partition: int,
    offset: int,
    timestamp_ms: int | None,
    key: bytes | None,
    value: bytes | None,
) -> Envelope:
    """Decode one record into an envelope. Shared by the worker and replays.

    Raises only ``RegistryUnavailable`` (a transient fault of the registry, not of the record):
    the caller must neither apply nor dead-letter the record, but read it again later. Every
    other failure is the record's and becomes an envelope with ``error``."""
    common = dict(
        topic=topic,
        partition=partition,
        offset=offset,
        timestamp_ms=timestamp_ms,
        key=key,
        value=value,
    )
    try:
        record = codec.decode(topic, value, allowed.get(topic))
    except DecodeError as exc:
        return Envelope(record=None, error=str(exc), **common)  # type: ignore[arg-type]
    except RegistryUnavailable:
        raise
    except Exception as exc:  # never let a decode crash the caller
        return Envelope(
            record=None, error=f"decoder failure: {type(exc).__name__}: {exc}", **common
        )  # type: ignore[arg-type]
    return Envelope(record=record, error=None, **common)  # type: ignore[arg-type]


class SafeAvroSchema(faust.Schema):
    """Decodes Confluent-framed Avro values into ``Envelope``s; keys stay raw bytes."""

    def __init__(self, codec: AvroCodec, allowed: dict[str, tuple[type[Record], ...]]) -> None:
        super().__init__(key_serializer="raw", value_serializer="raw", allow_empty=False)
        self.codec = codec
        self.allowed = allowed

    def loads_key(self, app: AppT, message: Message, **_: Any) -> Any:
        return message.key

    def loads_value(self, app: AppT, message: Message, **_: Any) -> Any:
        ts = message.timestamp
        return open_envelope(
            self.codec,
            self.allowed,
            message.topic,
            message.partition,
            message.offset,
            int(ts * 1000) if ts else None,
            message.key,
            message.value,
        )
