"""The codec's fast path against the real registry: after the first record of a kind, fastavro
with cached schemas writes the very bytes confluent's serializer writes, and reads back what
was written, through schema resolution when a newer producer added a field. And what the codec
makes of a registry that cannot be asked (through a proxy the test breaks): a transient fault,
never a bad record."""

from __future__ import annotations

import io
import json
import struct
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from confluent_kafka.schema_registry import Schema
from confluent_kafka.serialization import MessageField, SerializationContext
from fastavro import parse_schema, schemaless_writer

from streams.contracts.codec import AvroCodec, DecodeError, RegistryConfig, RegistryUnavailable
from streams.contracts.envelope import open_envelope
from streams.contracts.models.enums import ExecutionStatus
from streams.contracts.models.events import ExecutionStatusChanged
from tests.registry_proxy import Mode, RegistryProxy
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


def _newer_schema_id(codec: AvroCodec, topic: str) -> tuple[int, dict]:
    """A compatible newer version of ExecutionStatusChanged on ``topic``, registered: its id
    is one no codec has seen yet."""
    newer = json.loads(ExecutionStatusChanged.avro_schema_str())
    newer["fields"].append(
        {"name": "region", "type": ["null", "string"], "default": None, "doc": "added later"}
    )
    subject = f"{topic}-{ExecutionStatusChanged.avro_fullname()}"
    return codec.registry.register_schema(subject, Schema(json.dumps(newer), "AVRO")), newer


def _framed(schema_id: int, schema: dict, value: dict) -> bytes:
    buf = io.BytesIO()
    buf.write(b"\x00" + struct.pack(">I", schema_id))
    schemaless_writer(buf, parse_schema(schema), value)
    return buf.getvalue()


def test_a_registry_that_cannot_be_asked_is_not_a_bad_record(cluster, tmp_path: Path) -> None:
    """Refused, or answered 503: ``RegistryUnavailable``, which ``open_envelope`` lets through
    (the caller keeps the record); once it answers, the same bytes decode. Only the registry's
    404 makes a record undecodable (an envelope with an error, bound for the dead letters)."""
    dep = deployment(cluster, tmp_path)
    topic = dep.topics.execution_status.name
    dep.codec.encode(topic, status(1))
    schema_id, newer = _newer_schema_id(dep.codec, topic)
    value = _framed(schema_id, newer, status(3).to_avro() | {"region": "eu"})
    allowed = {topic: (ExecutionStatusChanged,)}
    with RegistryProxy(dep.settings.schema_registry_url) as proxy:
        codec = AvroCodec.connect(RegistryConfig(proxy.url))
        for mode in (Mode.REFUSE, Mode.UNAVAILABLE):
            proxy.set(mode)
            with pytest.raises(RegistryUnavailable):
                codec.decode(topic, value)
            with pytest.raises(RegistryUnavailable):
                open_envelope(codec, allowed, topic, 0, 7, None, b"ex-3", value)
        assert codec.outage.failures == 4
        assert codec.outage.delay() == 4.0  # 0.5 s, doubled for each failure in a row

        proxy.set(Mode.FORWARD)
        env = open_envelope(codec, allowed, topic, 0, 7, None, b"ex-3", value)
        assert env.error is None and env.record == status(3)
        assert codec.outage.failures == 0  # the first answer ends the outage

        unknown = b"\x00" + struct.pack(">I", 2_147_480_000) + value[5:]
        with pytest.raises(DecodeError, match="unknown schema id"):
            codec.decode(topic, unknown)
        env = open_envelope(codec, allowed, topic, 0, 8, None, b"ex-3", unknown)
        assert env.record is None and env.error is not None
        assert env.error.startswith("unknown schema id 2147480000")
        assert codec.outage.failures == 0  # a 404 is an answer


def test_a_registry_that_never_answers_is_given_up_within_the_timeout(
    cluster, tmp_path: Path
) -> None:
    """A registry that accepts connections and never answers must not stall the worker's event
    loop indefinitely: each request is bounded by the client's timeout (and one retry)."""
    assert RegistryConfig("http://registry").client_conf()["timeout"] <= 10
    dep = deployment(cluster, tmp_path)
    topic = dep.topics.execution_status.name
    schema_id, newer = _newer_schema_id(dep.codec, topic)
    value = _framed(schema_id, newer, status(4).to_avro() | {"region": None})
    with RegistryProxy(dep.settings.schema_registry_url) as proxy:
        proxy.set(Mode.SILENT)
        codec = AvroCodec.connect(RegistryConfig(proxy.url, timeout=1.0))
        began = time.monotonic()
        with pytest.raises(RegistryUnavailable, match="Timeout"):
            codec.decode(topic, value)
        assert time.monotonic() - began < 5.0  # two attempts of 1 s, and a short wait
        proxy.set(Mode.FORWARD)
        assert codec.decode(topic, value) == status(4)


def test_schema_ids_looked_up_ahead_need_no_registry_to_decode(cluster, tmp_path: Path) -> None:
    """``unseen_schema_ids`` + ``look_up`` (meant for a thread): once a batch's new ids are
    looked up, its records decode while the registry is down; an outage during the look-up is
    ``RegistryUnavailable``, and an id the registry does not know is left for ``decode``."""
    dep = deployment(cluster, tmp_path)
    topic = dep.topics.execution_status.name
    schema_id, newer = _newer_schema_id(dep.codec, topic)
    value = _framed(schema_id, newer, status(5).to_avro() | {"region": "eu"})
    unknown = b"\x00" + struct.pack(">I", 2_147_480_002) + value[5:]
    with RegistryProxy(dep.settings.schema_registry_url) as proxy:
        codec = AvroCodec.connect(RegistryConfig(proxy.url))
        unseen = codec.unseen_schema_ids([value, unknown, b"\x01not framed", None, b"\x00\x00"])
        assert unseen == {schema_id, 2_147_480_002}
        proxy.set(Mode.REFUSE)
        with pytest.raises(RegistryUnavailable):
            codec.look_up(unseen)
        proxy.set(Mode.FORWARD)
        codec.look_up(unseen)  # the 404 does not raise
        assert codec.unseen_schema_ids([value, unknown]) == {2_147_480_002}
        proxy.set(Mode.REFUSE)
        assert codec.decode(topic, value) == status(5)
