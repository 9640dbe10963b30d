"""The codec's fast path against the real registry: after the first record of a kind, fastavro
with cached schemas writes the very bytes confluent's serializer writes, and reads back what
was written, through schema resolution when a newer producer added a field."""

from __future__ import annotations

import io
import json
import struct
from datetime import UTC, datetime
from pathlib import Path

import pytest
from confluent_kafka.schema_registry import Schema
from confluent_kafka.serialization import MessageField, SerializationContext
from fastavro import parse_schema, schemaless_writer

from streams.codec import AvroCodec
from streams.models.enums import ExecutionStatus
from streams.models.events import ExecutionStatusChanged
from tests.support import deployment

pytestmark = pytest.mark.kafka

T0 = datetime(2026, 7, 26, 16, 0, tzinfo=UTC)


def status(n: int) -> ExecutionStatusChanged:
    return ExecutionStatusChanged(
        event_id=f"e-{n}",
        execution_id=f"ex-{n}",
        sequence=n,
        status=ExecutionStatus.RUNNING,
        occurred_at=T0,
        agent_id="agent-7" if n % 2 else None,
    )


def test_fast_path_bytes_equal_the_confluent_serializer(cluster, tmp_path: Path) -> None:
    dep = deployment(cluster, tmp_path)
    topic = dep.topics.execution_status.name
    codec: AvroCodec = dep.codec
    first = codec.encode(topic, status(1))  # the serializer: registers, learns the id
    ctx = SerializationContext(topic, MessageField.VALUE)
    for n in range(2, 6):
        record = status(n)
        fast = codec.encode(topic, record)
        assert fast == codec.serializer(ExecutionStatusChanged)(record, ctx)
        assert fast[:5] == first[:5]  # same magic byte and schema id
        assert codec.decode(topic, fast) == record


def test_fast_path_reads_a_newer_writer_schema(cluster, tmp_path: Path) -> None:
    dep = deployment(cluster, tmp_path)
    topic = dep.topics.execution_status.name
    codec: AvroCodec = dep.codec
    codec.encode(topic, status(1))
    newer = json.loads(ExecutionStatusChanged.avro_schema_str())
    newer["fields"].append(
        {"name": "tenant", "type": ["null", "string"], "default": None, "doc": "added later"}
    )
    subject = f"{topic}-{ExecutionStatusChanged.avro_fullname()}"
    schema_id = codec.registry.register_schema(subject, Schema(json.dumps(newer), "AVRO"))

    buf = io.BytesIO()
    buf.write(b"\x00" + struct.pack(">I", schema_id))
    value = status(3).to_avro() | {"tenant": "acme"}
    schemaless_writer(buf, parse_schema(newer), value)
    assert codec.decode(topic, buf.getvalue()) == status(3)
