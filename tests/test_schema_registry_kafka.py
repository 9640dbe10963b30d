"""vigil on a shared registry, against the real one (Apicurio's Confluent API): its schemas
registered in one explicit step, each of its subjects BACKWARD_TRANSITIVE while the global
level stays the registry owner's, clients that only look schemas up, and single-type outputs
under the default ``<topic>-value`` subject."""

from __future__ import annotations

import json
import struct
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry import topic_record_subject_name_strategy as by_record
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext
from typer.testing import CliRunner

from streams.contracts.codec import AvroCodec, RegistryConfig, SchemaNotRegistered
from streams.contracts.models.enums import ExecutionStatus
from streams.contracts.models.events import ClockTick, ExecutionStatusChanged
from streams.contracts.models.outputs import ExecutionState
from streams.kafka.topics import Topics
from tests.support import Deployment, deployment, worker

pytestmark = pytest.mark.kafka
T0 = datetime(2026, 7, 26, 16, 0, tzinfo=UTC)


def vigil(dep: Deployment, *args: str) -> Any:
    from streams.cli.main import _mount_optional, app

    _mount_optional()
    env = {
        "COLUMNS": "200",
        "KAFKA_BOOTSTRAP_SERVERS": dep.settings.bootstrap_servers,
        "SCHEMA_REGISTRY_URL": dep.settings.schema_registry_url,
        "VIGIL_TOPIC_PREFIX": dep.settings.topic_prefix,
        "VIGIL_PARTITIONS": str(dep.settings.partitions),
    }
    return CliRunner(env=env).invoke(app, list(args))


def level(url: str, subject: str | None = None) -> str:
    """The compatibility level set on ``subject`` (the global one without), as the registry's
    REST API answers it."""
    got = requests.get(f"{url}/config" + (f"/{subject}" if subject else ""), timeout=10)
    got.raise_for_status()
    return str(got.json()["compatibilityLevel"])


def test_topics_create_registers_every_subject_transitive_and_leaves_global_alone(
    cluster, tmp_path: Path
) -> None:
    dep = deployment(cluster, tmp_path, partitions=1)
    url = dep.settings.schema_registry_url
    registry: SchemaRegistryClient = dep.codec.registry
    before = level(url)
    res = vigil(dep, "topics", "create")
    assert res.exit_code == 0, res.output
    assert level(url) == before  # the registry owner's global level is not ours to change

    catalogue = Topics.from_settings(dep.settings).subjects()
    held = set(registry.get_subjects())
    for subject, model in catalogue:
        assert subject in held, subject
        assert level(url, subject) == "BACKWARD_TRANSITIVE", subject
        latest = registry.get_latest_version(subject).schema.schema_str
        assert json.loads(latest) == model.avro_schema(), subject
        assert subject in res.output

    # transitive: v3 reads v2 (it only adds a field v2 dropped, with a default) but not v1,
    # which wrote that field as a string; BACKWARD alone would let it in
    subject = f"{dep.topics.alerts.name}-value"
    v1 = json.loads(registry.get_latest_version(subject).schema.schema_str)
    v2 = dict(v1, fields=[f for f in v1["fields"] if f["name"] != "next_step"])
    assert len(v2["fields"]) == len(v1["fields"]) - 1
    registry.register_schema(subject, Schema(json.dumps(v2), "AVRO"))
    v3 = dict(v2, fields=[*v2["fields"], {"name": "next_step", "type": "int", "default": 0}])
    assert registry.test_compatibility(subject, Schema(json.dumps(v3), "AVRO"))  # vs latest
    with pytest.raises(SchemaRegistryError) as refused:
        registry.register_schema(subject, Schema(json.dumps(v3), "AVRO"))
    assert refused.value.http_status_code == 409

    # idempotent: a second run registers nothing new
    versions = {s: registry.get_versions(s) for s, _ in catalogue if s != subject}
    assert vigil(dep, "schemas", "register").exit_code == 0
    assert {s: registry.get_versions(s) for s, _ in catalogue if s != subject} == versions


def test_clients_look_schemas_up_and_register_only_when_told(cluster, tmp_path: Path) -> None:
    dep = deployment(cluster, tmp_path, partitions=1)
    tick = ClockTick(ticker_id="t", partition=0, occurred_at=T0)
    elsewhere = f"{dep.settings.topic_prefix}.not-in-the-catalogue"
    subject = f"{elsewhere}-vigil.v1.events.ClockTick"
    config = RegistryConfig(dep.settings.schema_registry_url)

    looks_up = AvroCodec.connect(config)  # as the worker and the CLI, by default
    data = looks_up.encode(dep.topics.execution_status.name, tick)  # registered by the fixture
    assert looks_up.decode(dep.topics.execution_status.name, data) == tick
    with pytest.raises(SchemaNotRegistered, match="vigil schemas register"):
        looks_up.encode(elsewhere, tick)
    assert subject not in looks_up.registry.get_subjects()
    assert looks_up.outage.delay() > 0  # the worker waits before trying again

    registers = AvroCodec.connect(config, auto_register=True)  # VIGIL_AUTO_REGISTER=true
    assert registers.decode(elsewhere, registers.encode(elsewhere, tick)) == tick
    assert subject in registers.registry.get_subjects()


def test_records_written_under_the_old_topic_record_subject_stay_readable(
    cluster, tmp_path: Path
) -> None:
    """The migration of a single-type output to ``<topic>-value``: records a worker wrote
    before it, under ``<topic>-<record name>``, are decoded by the schema id they carry."""
    dep = deployment(cluster, tmp_path, partitions=1)
    topic = dep.topics.execution_state.name
    state = ExecutionState(
        execution_id="ex-old",
        status=ExecutionStatus.RUNNING,
        since=T0,
        first_seen_at=T0,
        last_event_at=T0,
        last_sequence=1,
        terminal=False,
        state_id="s-1",
    )
    old = AvroSerializer(
        dep.codec.registry,
        ExecutionState.avro_schema_str(),
        to_dict=lambda obj, _ctx: obj.to_avro(),
        conf={"auto.register.schemas": True, "subject.name.strategy": by_record},
    )(state, SerializationContext(topic, MessageField.VALUE))
    assert f"{topic}-vigil.v1.outputs.ExecutionState" in dep.codec.registry.get_subjects()
    new = dep.codec.encode(topic, state)
    assert dep.codec.decode(topic, old) == dep.codec.decode(topic, new) == state


def test_worker_writes_single_type_outputs_under_topic_value(cluster, tmp_path: Path) -> None:
    dep = deployment(cluster, tmp_path, partitions=1)
    event = ExecutionStatusChanged(
        event_id="ex-v-1",
        execution_id="ex-v",
        sequence=1,
        status=ExecutionStatus.CREATED,
        occurred_at=T0,
    )
    dep.produce([event])
    dep.tick(T0 + timedelta(minutes=1))
    topic = dep.topics.execution_state.name
    with worker(dep, env={"VIGIL_AUTO_REGISTER": "false"}):
        got = dep.read_until([topic], lambda rs: len(rs) >= 1, timeout=60)
    assert isinstance(got[0].record, ExecutionState)
    assert got[0].raw is not None
    (schema_id,) = struct.unpack(">I", got[0].raw[1:5])
    registry = dep.codec.registry
    assert registry.get_latest_version(f"{topic}-value").schema_id == schema_id
    assert f"{topic}-vigil.v1.outputs.ExecutionState" not in registry.get_subjects()


def test_schemas_check_asks_the_registry_about_each_subject(cluster, tmp_path: Path) -> None:
    dep = deployment(cluster, tmp_path, partitions=1)
    res = vigil(dep, "schemas", "check")  # the project's schemas against what was registered
    assert res.exit_code == 0, res.output
    assert "all compatible" in res.output

    alert = json.loads((Path(__file__).resolve().parents[1] / "schemas/Alert.avsc").read_text())
    changed = tmp_path / "Alert.avsc"  # outside git: checked against the registry only
    required = {"name": "tenant", "type": "string", "doc": "no default"}
    changed.write_text(json.dumps(dict(alert, fields=[*alert["fields"], required])))
    res = vigil(dep, "schemas", "check", str(changed))
    assert res.exit_code == 1, res.output
    assert f"against registry {dep.topics.alerts.name}-value" in res.output

    optional = {"name": "tenant", "type": ["null", "string"], "default": None}
    changed.write_text(json.dumps(dict(alert, fields=[*alert["fields"], optional])))
    res = vigil(dep, "schemas", "check", str(changed))
    assert res.exit_code == 0, res.output
    assert "1 earlier version(s) checked: all compatible" in res.output
