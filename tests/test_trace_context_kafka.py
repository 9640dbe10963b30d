"""The trace context on the real registry and through a running worker (topology.md, Tracing)."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from streams.contracts.models.enums import OperationStatus
from streams.contracts.models.events import INPUT_MODELS, ClockTick, ExecutionStatusChanged
from streams.contracts.models.outputs import (
    OUTPUT_MODELS,
    Alert,
    OperationState,
    ReconciliationWorkItem,
)
from streams.local.scenario import Tick
from tests.support import deployment, play, worker
from tests.test_processor import T0, sent
from tests.test_trace_context import traced

pytestmark = pytest.mark.kafka


def test_the_field_is_a_backward_compatible_change_on_the_registry(cluster) -> None:
    """For every schema that gained it: the version without the field registered first,
    the registry (BACKWARD for the subject) accepts the version with it as the next one."""
    client = SchemaRegistryClient({"url": cluster.schema_registry_url})
    prefix = f"t{uuid.uuid4().hex[:8]}"
    changed = [m for m in (*INPUT_MODELS, *OUTPUT_MODELS) if m is not ClockTick]
    for model in changed:
        new = model.avro_schema()
        old = {**new, "fields": [f for f in new["fields"] if f["name"] != "traceparent"]}
        assert len(old["fields"]) == len(new["fields"]) - 1
        subject = f"{prefix}-{model.avro_name}"
        client.set_compatibility(subject, "BACKWARD")
        client.register_schema(subject, Schema(json.dumps(old), "AVRO"))
        assert client.test_compatibility(subject, Schema(json.dumps(new), "AVRO")), subject
        client.register_schema(subject, Schema(json.dumps(new), "AVRO"))
        assert len(client.get_versions(subject)) == 2
        client.delete_subject(subject)


def test_an_unknown_operation_through_the_worker_links_to_the_send(cluster, tmp_path: Path) -> None:
    dep = deployment(cluster, tmp_path)
    status = traced(
        ExecutionStatusChanged(
            event_id="s1", execution_id="ex-1", sequence=1, status="RUNNING", occurred_at=T0
        )
    )
    send = traced(sent("op-1", reply_due_at=T0 + timedelta(seconds=30)))
    play(dep, [status, send, Tick(T0 + timedelta(seconds=1)), Tick(T0 + timedelta(seconds=31))])
    topics = [
        dep.topics.execution_state.name,
        dep.topics.operation_state.name,
        dep.topics.reconciliation_work.name,
        dep.topics.alerts.name,
    ]

    def alerted(rs) -> bool:
        return any(isinstance(r.record, Alert) for r in rs)

    with worker(dep):
        got = dep.read_until(topics, alerted, timeout=60)
    records = [r.record for r in got]
    states = [r for r in records if type(r).__name__ == "ExecutionState"]
    unknown = [
        r for r in records if isinstance(r, OperationState) and r.status is OperationStatus.UNKNOWN
    ]
    items = [r for r in records if isinstance(r, ReconciliationWorkItem)]
    alerts = [r for r in got if isinstance(r.record, Alert)]
    assert states and unknown and items and alerts
    assert all(s.traceparent == status.traceparent for s in states)
    for r in [*unknown, *items]:
        assert r.traceparent == send.traceparent
    for a in alerts:
        assert a.record.traceparent == send.traceparent
        assert a.headers["traceparent"] == send.traceparent
