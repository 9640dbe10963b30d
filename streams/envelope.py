"""A decode-safe Faust schema.

Faust commits past a value it cannot decode and then crashes the agent, so a bad record would
be lost and the worker would flap. This schema never raises: every record becomes an
``Envelope`` holding either the decoded contract model or the reason it could not be decoded,
together with the original bytes and coordinates, and the agent routes failures to the
dead-letter topic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import faust
from faust.types import AppT, Message

from streams.codec import AvroCodec, DecodeError
from streams.models.base import Record


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
        common = dict(
            topic=message.topic,
            partition=message.partition,
            offset=message.offset,
            timestamp_ms=int(ts * 1000) if ts else None,
            key=message.key,
            value=message.value,
        )
        try:
            record = self.codec.decode(
                message.topic, message.value, self.allowed.get(message.topic)
            )
        except DecodeError as exc:
            return Envelope(record=None, error=str(exc), **common)
        except Exception as exc:  # never let a decode crash the agent
            return Envelope(
                record=None, error=f"decoder failure: {type(exc).__name__}: {exc}", **common
            )
        return Envelope(record=record, error=None, **common)
